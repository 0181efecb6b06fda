"""Fixtures shared by several test modules."""
import os
import subprocess
import zlib

import pytest
import torch

from lsm_gnn.testing import ProgramOrder, tiny_cache_setup, write_tiny_dataset
from lsm_gnn.utils.memcap import MemoryCap, MemoryCapError

TINY_CACHE_NODES = 600
ORDER_SEED_ENV = "LSM_GNN_ORDER_SEED"  # overrides the shuffled order's seed (by default one per test)
BESIDE_ENV = "LSM_GNN_BESIDE"  # .ci/run: the tests marked beside run in its job beside the suite


def pytest_generate_tests(metafunc):
    """A GPU runs a launch's programs in any order, the interpreter in order 0, 1, 2...: every test of a
    kernel module (test_kernels_*.py) runs in the natural order and again in the alternating one (its launches
    reversed and shuffled in turn), so that a kernel relying on the order fails here too. The second run is
    marked slow (it doubles the kernel tests; one run per order would triple them, past CI's time); a test
    marked ``launches_no_kernel`` (none in this process) runs once."""
    if (metafunc.definition.path.name.startswith("test_kernels_")
            and not metafunc.definition.get_closest_marker("launches_no_kernel")):
        orders = [pytest.param("natural"), pytest.param("alternating", marks=pytest.mark.slow)]
        metafunc.parametrize("program_order", orders, indirect=True)


def _natural_order_is_enough(item) -> bool:
    """A property test's many examples (test_kernels_properties.py): a kernel that depends on the order fails on
    the first launches of a few examples as on the last of many, and the many in both orders took CI 3 minutes on
    their own. A case marked ``natural_order_only``: whole runs over kernels each tested in both orders, or one
    more geometry of a kernel whose hardest geometry runs in both."""
    return item.get_closest_marker("natural_order_only") is not None or (
        item.callspec.params.get("max_examples") is not None and "many" in item.callspec.id)


def pytest_collection_modifyitems(config, items):
    """The alternating order runs only the cases it can tell something by (:func:`_natural_order_is_enough`);
    with ``LSM_GNN_BESIDE`` set the suite leaves the tests marked ``beside`` to .ci/run's job beside it."""
    beside = bool(os.environ.get(BESIDE_ENV))
    dropped = [item for item in items if (beside and item.get_closest_marker("beside") is not None) or (
        getattr(item, "callspec", None) is not None and item.callspec.params.get("program_order") == "alternating"
        and _natural_order_is_enough(item))]
    if dropped:
        keep = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in keep]
        config.hook.pytest_deselected(items=dropped)


@pytest.fixture(autouse=True)
def kernel_mode_of_its_own():
    """Every test starts at the default kernel mode: a trainer a test left unclosed holds its ``kernels.using``
    scope until it is collected, and would run the next tests' ops on its kernels."""
    yield
    from lsm_gnn import kernels

    if any(scope.is_open for scope in kernels._scopes):
        import gc

        gc.collect()  # a dropped trainer's finalizer closes its scope
        for scope in kernels._scopes:  # one still referenced (a module fixture's): not beyond this test
            scope.close()


@pytest.fixture(autouse=True)
def program_order(request, monkeypatch):
    """The :class:`ProgramOrder` Triton's interpreter runs this test's launches in: ``natural`` (untouched)
    unless the test is parametrized with another (kernel modules are, by ``pytest_generate_tests``)."""
    order = getattr(request, "param", "natural")
    seed = int(os.environ.get(ORDER_SEED_ENV, zlib.crc32(request.node.nodeid.encode())))
    chosen = ProgramOrder(order, seed)
    if order == "natural":
        yield chosen
        return
    from lsm_gnn.kernels import triton_interpreted

    if not triton_interpreted():
        pytest.skip("triton runs on the GPU here, not in its interpreter: the GPU picks the program order")
    chosen.apply(monkeypatch)
    # Shown with a failure: the order, and how to rerun with the same shuffled permutations.
    print(f"program order: {order}" + (f", seed {seed} (rerun it with {ORDER_SEED_ENV}={seed})"
                                       if order in ("shuffled", "alternating") else ""))
    yield chosen
    # Else the run proved nothing: the patch missed the interpreter (changed in a new triton?), or the test runs
    # its kernels in a subprocess, or none.
    if chosen.launches == 0:
        pytest.fail(f"no Triton launch ran in the {order} program order: the patch of the interpreter did not take, "
                    "or the test launches no kernel in this process (then mark it launches_no_kernel)")


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from threads and lose a lot on a busy 2-core machine (busy-waiting threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def memory_cap():
    """``memory_cap(limit_bytes)``: a :class:`MemoryCap` removed after the test; the test is skipped, with the
    reason, where no memory cgroup can be created (never passed without running)."""
    caps = []

    def make(limit_bytes: int) -> MemoryCap:
        try:
            caps.append(MemoryCap(limit_bytes))
        except MemoryCapError as exc:
            pytest.skip(f"no memory cgroup to cap the run in: {exc}")
        return caps[-1]

    yield make
    for cap in caps:
        cap.close()


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """(memory storage, features, quantized degree scores) of a 600-node dataset, for cache tests."""
    return tiny_cache_setup(tmp_path_factory.mktemp("cache") / "ds", num_nodes=TINY_CACHE_NODES)


@pytest.fixture(scope="module")
def loader_graph(tmp_path_factory):
    """(dataset, features) of a 2000-node graph, for loader tests."""
    dataset, features = write_tiny_dataset(tmp_path_factory.mktemp("loader") / "ds", num_nodes=2000, dim=8,
                                           avg_degree=5)
    return dataset, torch.from_numpy(features)


@pytest.fixture(scope="module")
def graph(request, tmp_path_factory):
    """Path of a synthetic graph generated once per module from the module's ``GRAPH`` (arguments of
    ``generate_synthetic``), for trainer-level tests; a module's own ``graph`` fixture overrides this."""
    from lsm_gnn.data.synthetic import generate_synthetic

    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]) / "g"
    generate_synthetic(path, progress=False, **request.module.GRAPH)
    return str(path)


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(name, options)``: a fresh tmpfs at ``tmp_path / name`` (a full disk or a read-only one to
    write into), unmounted after the test; skips the test where mounting needs root it does not have."""
    mounted = []

    def mount(name: str = "disk", options: str = "size=2M"):
        point = tmp_path / name
        point.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True,
                                text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)
