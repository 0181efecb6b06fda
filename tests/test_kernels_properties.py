"""Hypothesis-drawn geometries: every Triton kernel equals the C++ core call by call, bit for bit, and a cache
driven by the Triton kernels makes the reference model's decisions. Run by Triton's interpreter on CPU tensors.

The interpreter is slow (~2 ms a kernel loop step, one program at a time): the quick run draws a few examples
per property, the slow run (``-m slow``; .ci/run's job beside the suite) many more. Examples are derandomized,
so every run draws the same.
"""
import collections
import contextlib
import importlib
import inspect
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
pytest.importorskip("triton")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lsm_gnn import _C  # noqa: E402
from lsm_gnn.cache import (  # noqa: E402
    POLICIES, PolicyConfig, ReferenceCache, SoftwareCache, VictimBuffer, WindowBuffer, replay,
)
from lsm_gnn.kernels.layout import INVALID_TAG  # noqa: E402
from lsm_gnn.kernels import ops, using  # noqa: E402
from lsm_gnn.kernels.sampler import sample_hops  # noqa: E402
from test_kernels_victim_enqueue import victims  # noqa: E402  (importable: tests/ is on sys.path under pytest)

N = 600  # nodes of the tiny_cache fixture (conftest.py)
MASK64 = (1 << 64) - 1
PROFILE = settings(deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def examples(quick: int, many: int):
    """``quick`` examples in the default run, ``many`` in the slow one (in CI, beside the suite: a minute on
    one core that the suite's job would otherwise add to the longer of the two)."""
    return pytest.mark.parametrize("max_examples", [quick, pytest.param(many, marks=[pytest.mark.slow,
                                                                                    pytest.mark.beside])],
                                   ids=["quick", "many"])


def explore(cases, check, max_examples: int) -> None:
    """Runs ``check(**case)`` on ``max_examples`` drawn cases (a falsifying case is shrunk and printed)."""
    @settings(PROFILE, max_examples=max_examples)
    @given(case=cases)
    def property_holds(case):
        check(**case)

    property_holds()


# -- exact comparison ----------------------------------------------------------------------------------------------

def assert_same(expected, got, what: str) -> None:
    """Equal structure, dtypes and bits (so NaN rows compare too), recursively through tuples and lists."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected), f"{what}: {len(expected)} entries"
        for k, (a, b) in enumerate(zip(expected, got)):
            assert_same(a, b, f"{what}[{k}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == expected.dtype, f"{what}: dtype {got.dtype}"
        assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
        a, b = (x.contiguous().reshape(-1).view(torch.uint8) if x.numel() else x for x in (expected, got))
        assert torch.equal(a, b), f"{what} differs at bytes {torch.nonzero(a != b)[:5].tolist()}"
    else:
        assert expected == got, f"{what}: {expected!r} != {got!r}"


NATIVE = {"cache_assign": ops.native_cache_assign, "cache_scan": _C.cache_scan,
          "victim_enqueue": ops.native_victim_enqueue,
          # PVP serve, scatter, fill and install take no thread count (a check=, by keyword, is the twin's alone).
          "pvp_match": lambda *args: _C.pvp_match(*args[:-1]),
          "pvp_scatter": lambda *args: _C.pvp_scatter(*args[:-1]),
          "pvp_fill": lambda *args: _C.pvp_fill(*args[:-1]),
          "pvp_install": lambda *args: ops.native_pvp_install(*args[:-1]),  # (torch's CPU ops)
          "rows_by_line": lambda *args: ops.native_rows_by_line(*args[:-1])}


class CheckedKernels:
    """A Triton kernel module whose every call is first made by the C++ core on copies of the arguments; the
    outputs and every argument tensor (so the state the op mutates) must then come out equal."""

    def __init__(self, name: str, calls: collections.Counter | None = None):
        self._module = importlib.import_module(f"lsm_gnn.kernels.{name}")
        self.calls = collections.Counter() if calls is None else calls

    def __getattr__(self, op: str):
        kernel, native = getattr(self._module, op), NATIVE[op]
        names = list(inspect.signature(kernel).parameters)

        def checked(*args, **kwargs):  # (cache_assign's has_misses: False on CPU caches, as the C++ core takes it)
            call = f"{op} call {self.calls[op]}"
            copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            expected = native(*copies, 1)
            got = kernel(*args, **kwargs)
            assert_same(expected, got, f"{call}: output")
            for name, a, b in zip(names, copies, args):
                assert_same(a, b, f"{call}: {name}")
            self.calls[op] += 1
            return got

        return checked


@contextlib.contextmanager
def checked_triton_mode():
    """Kernel mode ``triton`` (CPU tensors run the Triton kernels), each call checked by :class:`CheckedKernels`;
    yields the call counts."""
    calls = collections.Counter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ops, "triton_module", lambda name, on_cpu: CheckedKernels(name, calls))
        with using("triton"):
            yield calls


# -- the cache: assign, scan and enqueue as a cache runs them ----------------------------------------------------

@st.composite
def cache_cases(draw):
    num_sets, ways = draw(st.integers(1, 8)), draw(st.sampled_from([1, 2, 4, 8, 16, 32]))  # ways: one vector
    # Distinct ids per batch, up to 8 beyond the cache (oversubscribed), at most 48: each miss is a loop step.
    size = st.integers(0, min(num_sets * ways + 8, 48))
    window = draw(st.integers(1, 6))
    return dict(policy=draw(st.sampled_from(list(POLICIES))), num_sets=num_sets, ways=ways,
                sizes=draw(st.lists(size, min_size=1, max_size=6)), nodes=draw(st.integers(1, N)),
                skew=draw(st.floats(0.0, 1.5)), seed=draw(st.integers(0, 2**32 - 1)), window=window,
                period=draw(st.integers(1, min(window, 3))),  # scans a short trace twice: victims get next uses
                static=draw(st.booleans()),
                pvp=draw(st.sampled_from([None, *range(1, 6)])), reinstall=draw(st.booleans()),
                next_use=draw(st.sampled_from([None, False, True])), bypass=draw(st.sampled_from([None, False, True])))


def policy_config(policy, window, period, next_use, bypass) -> PolicyConfig:
    """``policy`` with the drawn next-use options (None: its default) where they apply: window policies only,
    and bypass only with the next use at assign."""
    config = PolicyConfig(policy, window=window, period=period)
    if not config.uses_window:
        return config
    next_use = config.assign_next_use if next_use is None else next_use
    return PolicyConfig(policy, window=window, period=period, assign_next_use=next_use, bypass=bypass and next_use)


def power_law_batches(seed, nodes, skew, sizes):
    """Batches of distinct ids from ``[0, nodes)``, unsorted, with a Zipf-like popularity (``skew``): hot ids
    recur in the window, so lines get next uses and victims find their queues."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, nodes + 1) ** skew
    perm = rng.permutation(nodes)
    return [perm[rng.choice(nodes, min(k, nodes), replace=False, p=p / p.sum())] for k in sizes]


@pytest.fixture(scope="module")
def cache_check(tiny_cache):
    storage, features, scores = tiny_cache

    def check(policy, num_sets, ways, sizes, nodes, skew, seed, window, period, static, pvp, reinstall, next_use,
              bypass):
        """A cache on the Triton kernels (each call checked against the C++ core) beside the reference model:
        rows, hits, line metadata, victim queues and counters after every batch. ``pvp``: queue capacity;
        ``next_use``, ``bypass``: the policy's options (None: its default)."""
        config = policy_config(policy, window, period, next_use, bypass)
        scores_or_none = scores if static else None
        reinstall = reinstall and pvp is not None
        ref = ReferenceCache(storage, num_sets, ways, config, static_scores=scores_or_none, oversubscribe=True,
                             pvp_queue_capacity=pvp, pvp_reinstall=reinstall)
        cache = SoftwareCache(storage, num_sets=num_sets, ways=ways, policy=config, static_scores=scores_or_none,
                              oversubscribe=True, pvp=pvp is not None, pvp_queue_capacity=pvp or 1,
                              pvp_reinstall=reinstall)
        trace = power_law_batches(seed, nodes, skew, sizes)
        with checked_triton_mode() as calls:
            for t, (current, future) in enumerate(replay(trace, window, num_nodes=N)):
                rows_ref, hit_ref = ref.lookup(current, future)
                rows, hit = cache.lookup(current, future)
                assert torch.equal(rows_ref, features[current]), f"iteration {t}: reference rows"
                assert torch.equal(rows, features[current]), f"iteration {t}: rows"
                assert torch.equal(hit, hit_ref), f"iteration {t}: hits"
                for key, value in ref.snapshot().items():
                    assert np.array_equal(value, cache.snapshot()[key]), f"iteration {t}: {key}"
                if pvp is not None:
                    assert ref.pvp_snapshot() == cache.pvp.snapshot(), f"iteration {t}: victim queues"
                    assert ref.pvp_stats == cache.pvp.stats, f"iteration {t}: victim counters"
        assert ref.stats.as_dict() == cache.stats.as_dict()
        assert calls["cache_assign"] == len(trace), "every batch went through the checked Triton assign"

    return check


@examples(quick=6, many=75)
def test_triton_cache_equals_the_cpp_core_and_the_reference(cache_check, max_examples):
    explore(cache_cases(), cache_check, max_examples)


# -- the window scan ---------------------------------------------------------------------------------------------

@st.composite
def scan_cases(draw):
    num_nodes, window = draw(st.integers(1, 300)), draw(st.integers(1, 8))
    batch = st.tuples(st.lists(st.integers(0, num_nodes - 1), max_size=40), st.integers(0, 255))  # (ids, rank)
    return dict(num_nodes=num_nodes, lines=draw(st.integers(0, 1500)), window=window,
                limit=draw(st.integers(0, window + 2)), seed=draw(st.integers(0, 2**32 - 1)),
                steps=draw(st.lists(st.none() | batch, min_size=1, max_size=3 * window)))  # None: a pop


def check_scan(num_nodes, lines, window, limit, seed, steps):
    """A window index pushed and popped as ``steps`` say, scanned after each step over lines holding stale
    records and flags, invalid tags and tags beyond the index's nodes."""
    rng = np.random.default_rng(seed)
    buffer = WindowBuffer(window, num_nodes)
    kernels = CheckedKernels("window_scan")
    for step in steps:
        if buffer.full or (step is None and len(buffer)):
            buffer.pop()
        if step is not None:
            buffer.push(np.array(step[0], dtype=np.int64), rank=step[1])
        tags = rng.integers(-1, num_nodes + 20, lines)
        tags[rng.random(lines) < 0.2] = INVALID_TAG
        records = rng.integers(-(1 << 63), (1 << 63) - 1, lines, endpoint=True)
        flags = rng.integers(0, 256, lines).astype(np.uint8)
        kernels.cache_scan(torch.from_numpy(tags), torch.from_numpy(records), torch.from_numpy(flags),
                           *buffer.first_occurrence("cpu"), limit)
    assert kernels.calls["cache_scan"] == len(steps)


@examples(quick=30, many=300)
def test_triton_scan_equals_the_cpp_core(max_examples):
    explore(scan_cases(), check_scan, max_examples)


# -- the victim enqueue ------------------------------------------------------------------------------------------

@st.composite
def enqueue_cases(draw):
    window = draw(st.integers(1, 8))
    return dict(window=window, capacity=draw(st.integers(1, 8)), dim=draw(st.integers(1, 200)),
                dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.int8, torch.uint8])),
                lines=draw(st.integers(1, 60)), period=draw(st.integers(1, window)),
                batches=draw(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 3)), min_size=1, max_size=6)),
                seed=draw(st.integers(0, 2**32 - 1)))


def check_enqueue(window, capacity, dim, dtype, lines, period, batches, seed):
    """Victim batches (``batches``: (size, iterations since the last)) enqueued into one buffer, checked call by
    call; queues are served in between and skipped iterations expire theirs. Rows are random bytes (NaNs too):
    they must be copied bit for bit."""
    rng = np.random.default_rng(seed)
    buffer = VictimBuffer(window, capacity, dim, dtype)
    cache_data = torch.from_numpy(rng.integers(0, 256, (lines, dim * dtype.itemsize), dtype=np.uint8)).view(dtype)
    kernels = CheckedKernels("victim_enqueue")
    t = 0
    for n, gap in batches:
        t += gap
        buffer.prefetch(t)  # the queue of t moves out (and earlier ones expire) before t is served
        tag, record, line = victims(rng, n, lines, t, t - t % period, window)
        kernels.victim_enqueue(buffer.count, buffer.queue_iteration, buffer.node, buffer.record, buffer.data,
                               tag, record, line, cache_data, t, t - t % period, buffer.tallies)
    assert kernels.calls["victim_enqueue"] == len(batches)


@examples(quick=20, many=200)
def test_triton_enqueue_equals_the_cpp_core(max_examples):
    explore(enqueue_cases(), check_enqueue, max_examples)


# -- the sampler -------------------------------------------------------------------------------------------------

@st.composite
def sampler_cases(draw):
    num_nodes = draw(st.integers(1, 120))
    degree = st.integers(0, 4) | st.integers(0, 300)  # isolated, small and very high degrees
    fanout = st.sampled_from([-1, 0]) | st.integers(1, 12)  # -1: all neighbors
    return dict(degrees=draw(st.lists(degree, min_size=num_nodes, max_size=num_nodes)),
                index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
                seeds=draw(st.lists(st.integers(0, num_nodes - 1), unique=True, max_size=40)),
                fanouts=draw(st.lists(fanout, min_size=1, max_size=3)),
                seed=draw(st.integers(-(1 << 63), MASK64)), iteration=draw(st.integers(-(1 << 63), (1 << 63) - 1)),
                neighbors=draw(st.integers(0, 2**32 - 1)))


def check_sampler(degrees, index_dtype, seeds, fanouts, seed, iteration, neighbors):
    """Hops of a random CSR (self loops and repeated neighbors too) from the C++ and the Triton sampler; the
    Triton one takes the seed modulo 2**64 itself (the op passes a signed int64), the C++ one a uint64."""
    indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64))
    indices = torch.from_numpy(np.random.default_rng(neighbors).integers(0, len(degrees), int(indptr[-1])))
    indices = indices.to(index_dtype)
    seeds = torch.tensor(seeds, dtype=torch.int64)
    expected = _C.sample_hops(indptr, indices, seeds, fanouts, seed & MASK64, iteration, 1)
    assert_same(expected, sample_hops(indptr, indices, seeds, fanouts, seed, iteration), "hops")


@examples(quick=20, many=100)
def test_triton_sampler_equals_the_cpp_core(max_examples):
    explore(sampler_cases(), check_sampler, max_examples)
