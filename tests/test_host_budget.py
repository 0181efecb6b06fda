"""The host's work per call of the GPU data path, held to issue 43's budget on CPU tensors.

The recorder (tests/host_budget.py) is checked to count exactly; then each budget is a test, run on a device-mode
cache and the device sampler (their GPU paths on CPU tensors, the Triton kernels under the interpreter); every
budget is met (docs/gpu.md has the counts before and after). Each budget's check is shown to fail with one more
read back, launch or full-state copy, in a stand-in that meets the issue's budget exactly and in the real path.
`python benchmarks/host_budget.py` prints the same counts as a table (docs/gpu.md).
"""
import pytest
import torch

import lsm_gnn  # noqa: F401  (turns on Triton's interpreter on a machine without a GPU, before triton's import)

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from host_budget import (BUDGETS, CACHE_SETS, LOOKUPS, BudgetExceeded, HostWork, device_mode, lookup_work,  # noqa: E402
                         sampler_work, tiny_dataset)
from lsm_gnn.cache import SoftwareCache  # noqa: E402
from lsm_gnn.kernels import sampler  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="counts the kernels under Triton's interpreter")


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)


# -- the recorder counts exactly -----------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, 3])
def test_each_item_is_one_read_back_of_its_bytes(k):
    work = HostWork()
    work.call(lambda t: [t[i].item() for i in range(k)], torch.arange(5))
    assert (work.counts.reads_back, work.counts.bytes_to_host, work.counts.launches) == (k, 8 * k, 0)


def test_a_boolean_mask_index_is_one_read_back():
    work = HostWork()
    work.call(lambda t: t[t > 2], torch.arange(5))
    assert work.counts.reads_back == 1 and work.counts.launches == 2  # the comparison and the index
    assert work.counts.allocations == 2


def test_a_device_factory_is_an_allocation_and_a_fill_but_empty_fills_nothing():
    work = HostWork()
    work.call(lambda t: (torch.zeros(4, device=t.device), torch.full((2,), 7, device=t.device),
                         torch.empty(3, device=t.device), torch.zeros(2)), torch.arange(5))
    assert work.launched == ["zeros", "full"] and work.counts.allocations == 3  # the host's zeros is not counted


@pytest.mark.parametrize("n", [1, 4])
def test_each_triton_launch_is_one_launch(n):
    x = torch.zeros(10)
    work = HostWork()
    work.call(lambda t: [_add_one[(1,)](t, t.numel(), BLOCK=16) for _ in range(n)], x)
    assert torch.equal(x, torch.full((10,), float(n))), "the kernels ran"
    assert (work.counts.launches, work.counts.reads_back, work.counts.allocations) == (n, 0, 0)


@pytest.mark.parametrize("dtype,shape", [(torch.float64, (5,)), (torch.int8, (3, 7))])
def test_a_copy_to_the_host_counts_its_bytes(dtype, shape):
    t = torch.ones(shape, dtype=dtype)
    work = HostWork()
    host = work.call(lambda d: d.cpu(), t)
    assert (work.counts.reads_back, work.counts.bytes_to_host) == (1, t.nbytes)
    assert host.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(), "a copy, as from a device"


def test_only_device_tensors_count():
    host = torch.arange(4)

    def f(d):
        host.cpu(), int(host[0]), host.sum()  # host tensors: no read back, no launch
        made = torch.zeros(3, device=d.device)  # a device allocation and fill, by its explicit device
        return int(made.sum()), bool(d[0])

    work = HostWork()
    work.call(f, torch.arange(3))
    assert (work.counts.reads_back, work.counts.launches, work.counts.bytes_to_host) == (2, 2, 4 + 8)  # float32, int64


def test_a_host_tensor_where_a_freed_device_one_was_is_on_the_host():
    """Tensors are told apart by address, and the allocator reuses a freed device tensor's: a host tensor made
    there, by an op or as a copy read back, is not a device tensor (its ops are no launches or reads back)."""
    def f(d):
        for _ in range(20):
            t = d + 1  # a device temporary, freed at once
            del t
            host = torch.arange(5)
            host[host > 2]
            copy = (d + 2).cpu()
            copy[copy > 2]

    work = HostWork()
    work.call(f, torch.arange(5))
    assert (work.counts.launches, work.counts.reads_back) == (40, 20)


# -- the budgets ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("host_budget") / "ds")


@pytest.fixture(scope="module")
def measured(dataset):
    """Every operation's work, once: each lookup at both cache sizes, the sampler at 1 and 2 hops."""
    with pytest.MonkeyPatch.context() as monkeypatch, device_mode(monkeypatch):
        out = {op: [lookup_work(op, dataset, sets) for sets in CACHE_SETS] for op in LOOKUPS}
        out["sampler call"] = [sampler_work(hops) for hops in (1, 2)]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("op,count", [
    ("all-hit lookup", "reads_back"),
    ("all-hit lookup", "launches"),
    ("lookup with misses", "reads_back"),
    ("lookup with misses", "launches"),
    ("lookup with read-ahead", "reads_back"),
    ("PVP lookup with misses", "reads_back"),
    ("PVP lookup with misses", "launches"),
    ("sampler call", "reads_back"),
])
def test_budget_per_call(measured, op, count):
    for work in measured[op]:
        work.check({count: BUDGETS[op][count]})


@pytest.mark.slow
def test_sampler_launches_per_hop(measured):
    for hops, work in enumerate(measured["sampler call"], 1):
        work.check({"launches": BUDGETS["sampler call"]["launches per hop"] * hops})


@pytest.mark.slow
@pytest.mark.parametrize("op", LOOKUPS)
def test_no_copy_grows_with_the_cache(measured, op):
    small, large = measured[op]
    small.check_same_bytes(large)


# -- each check fails with one more --------------------------------------------------------------------------------

@pytest.mark.parametrize("count,most", sorted({(c.replace(" per hop", ""), m) for budget in BUDGETS.values()
                                                for c, m in budget.items()}))
def test_a_stand_in_at_the_budget_passes_and_one_more_fails(count, most):
    """A function doing exactly the budget's reads back (or launches) passes its check; one more fails it."""
    def stand_in(t, k):
        for _ in range(k):
            int(t[0]) if count == "reads_back" else t.neg()

    for k in (most, most + 1):
        work = HostWork()
        work.call(stand_in, torch.arange(3), k)
        assert getattr(work.counts, count) == k
        if k == most:
            work.check({count: most})
        else:
            with pytest.raises(BudgetExceeded, match=f"{count} {k} > {most}"):
                work.check({count: most})


def _inject(monkeypatch, op: str, extra) -> None:
    """Puts ``extra`` (given a device tensor, and the cache for a lookup) into the path of ``op``: at a lookup's
    end, or before the sampler's read back of its report."""
    if op == "sampler call":
        read_back = sampler._read_back
        monkeypatch.setattr(sampler, "_read_back", lambda report: (extra(report, None), read_back(report))[1])
        return
    account = SoftwareCache._account
    monkeypatch.setattr(SoftwareCache, "_account", lambda self, plan, caller=None: (
        extra(plan.request_hit, self), account(self, plan, caller))[1])


EXTRA = {"reads_back": lambda t, cache: bool(t[0]), "launches": lambda t, cache: t.clone(),
         "a full-state copy": lambda t, cache: cache.state.tags.cpu()}


@pytest.mark.slow
@pytest.mark.parametrize("op,count", [("all-hit lookup", "reads_back"), ("all-hit lookup", "launches"),
                                      ("lookup with misses", "reads_back"), ("lookup with misses", "launches"),
                                      ("PVP lookup with misses", "reads_back"), ("sampler call", "reads_back"),
                                      ("sampler call", "launches"), ("lookup with misses", "a full-state copy")])
def test_one_more_in_the_real_path_fails_its_check(dataset, monkeypatch, op, count):
    """The path as it is passes a check at its own count (the budget it meets); with one more read back, launch
    or copy of the tag array put into it, the check fails."""
    def run(sets=CACHE_SETS[0]):
        return sampler_work(1) if op == "sampler call" else lookup_work(op, dataset, sets)

    sizes = CACHE_SETS if count == "a full-state copy" else CACHE_SETS[:1]
    with device_mode(monkeypatch):
        base = [run(sets) for sets in sizes]
        _inject(monkeypatch, op, EXTRA[count])
        more = [run(sets) for sets in sizes]
    if count == "a full-state copy":
        base[0].check_same_bytes(base[1])
        with pytest.raises(BudgetExceeded, match="bytes to host .* on a larger cache"):
            more[0].check_same_bytes(more[1])
        return
    own = {count: getattr(base[0].counts, count)}
    base[0].check(own)
    assert getattr(more[0].counts, count) == own[count] + 1
    with pytest.raises(BudgetExceeded, match=f"{count} {own[count] + 1} > {own[count]}"):
        more[0].check(own)


@pytest.mark.slow
def test_the_benchmark_prints_every_operation(capsys):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "host_budget.py")
    spec = importlib.util.spec_from_file_location("host_budget_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    assert benchmark.main() == 0
    table = capsys.readouterr().out
    for op in (*LOOKUPS, "sampler call, 1 hop", "sampler call, 2 hops"):
        assert f"| {op} | " in table
    assert "(<= 1) |" in table and "(<= 4) |" in table, "each count beside its budget"
