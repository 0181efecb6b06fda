"""What one call of a device-mode data path asks of the host, counted on CPU tensors (issue 43, item 1).

:class:`HostWork` records, while active, the work a call would give a GPU and the host's waits for it:

- **launches**: Triton launches (its interpreter's ``run``, counted once each, its inside not recorded) and aten
  ops that read or write a device tensor (a kernel each on a GPU; views and bare ``empty`` allocations are none);
- **reads back**: a host read of a device tensor, each a synchronization on a GPU: ``item``/``int``/``bool``
  (the ``_local_scalar_dense`` op), ``tolist``, ``numpy``, ``cpu``, and the ops whose output size the host must
  read (``nonzero``, ``unique``, ``masked_select``, an index by a boolean mask, ``repeat_interleave``);
- **allocations**: fresh device tensors (an op's output on a storage none of its inputs has);
- **bytes to host**: what the reads back copy (a whole tensor for ``cpu``/``numpy``/``tolist``; one element
  for a scalar; the 8-byte count of a size read).

Everything here is a CPU tensor, so which tensors stand for device ones is tracked: the call's tensor arguments
and whatever :meth:`HostWork.device` is given, then every output of an op with a device input and every tensor
made with an explicit ``device=`` (a host allocation names no device). ``.to(device)`` on CPU returns its input,
so ``.to`` is not counted as a copy either way; the code under test says ``.cpu()`` where it reads back.

The device-mode stand-ins: :func:`device_cache` makes a :class:`SoftwareCache` take its GPU path (a stream of
tests/fake_cuda.py, the miss staging buffer, the Triton kernels under the interpreter, ``torch.unique`` for
the distinct ids); :func:`sampler_call` runs the device sampler's op on CPU tensors.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Ops whose output size depends on the values: on a GPU the host reads the size back before it can allocate.
_SIZE_READS = {"nonzero", "_unique2", "unique_dim", "unique_consecutive", "_unique", "masked_select",
               "repeat_interleave"}
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "_local_scalar_dense", "lift_fresh", "detach", "alias",
              "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_nonzero"}
# Host reads seen as Python methods (they dispatch no aten op on a CPU tensor).
_METHOD_READS = {torch.Tensor.cpu: "cpu", torch.Tensor.numpy: "numpy", torch.Tensor.tolist: "tolist"}
# Scalar reads, seen as methods too: inside an op's body the dispatcher does not show their _local_scalar_dense.
_SCALAR_READS = {torch.Tensor.item: "item", torch.Tensor.__int__: "int", torch.Tensor.__bool__: "bool",
                 torch.Tensor.__float__: "float", torch.Tensor.__index__: "index"}
_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.arange, torch.tensor, torch.as_tensor,
              torch.empty_strided, torch.randint, torch.rand, torch.randn}


@dataclass
class Counts:
    launches: int = 0
    reads_back: int = 0
    allocations: int = 0
    bytes_to_host: int = 0


class BudgetExceeded(AssertionError):
    pass


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _caller() -> str:
    """The innermost line of lsm_gnn (else of the caller's code) on the stack: where a read back was asked for."""
    frame, fallback = sys._getframe(2), None
    while frame is not None:
        name = frame.f_code.co_filename
        if os.sep + "lsm_gnn" + os.sep in name:
            return f"{name[name.rindex(os.sep + 'lsm_gnn' + os.sep) + 1:]}:{frame.f_lineno}"
        if fallback is None and not name.endswith(("host_budget.py", "torch" + os.sep + "overrides.py")) \
                and "python_dispatch" not in name:
            fallback = f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "?"


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class HostWork:
    """``with HostWork() as work: fn(...)``, or ``work.call(fn, *args)``; then ``work.counts``, ``work.what`` (one
    line per read back, naming it and where it was asked for) and ``work.launched``. Records only the thread
    that entered it."""

    def __init__(self):
        self.counts = Counts()
        self.what: list[str] = []
        self.launched: list[str] = []  # each launch's kernel or aten op, in order
        self._device: set[int] = set()
        self._paused = 0
        self._thread = None

    # -- which tensors stand for device ones -------------------------------------------------------------------

    def device(self, *values) -> None:
        """Marks the tensors in ``values`` (tensors, lists, dicts, or objects whose tensor attributes count)."""
        for value in values:
            found = list(_tensors(value))
            if not found and not isinstance(value, (list, tuple, dict)) and hasattr(value, "__dict__"):
                found = [v for v in vars(value).values() if isinstance(v, torch.Tensor)]
            for t in found:
                if t.numel():
                    self._device.add(_key(t))

    def is_device(self, t: torch.Tensor) -> bool:
        return t.numel() > 0 and _key(t) in self._device

    # -- recording ---------------------------------------------------------------------------------------------

    def _recording(self) -> bool:
        return not self._paused and threading.get_ident() == self._thread

    @contextlib.contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def read_back(self, what: str, nbytes: int) -> None:
        self.counts.reads_back += 1
        self.counts.bytes_to_host += int(nbytes)
        self.what.append(f"{what} ({nbytes} B) at {_caller()}")

    def launch(self, name: str) -> None:
        self.counts.launches += 1
        self.launched.append(name)

    def __enter__(self) -> "HostWork":
        from triton.runtime.interpreter import InterpretedFunction

        self._thread = threading.get_ident()
        self._run = run = InterpretedFunction.run
        work = self

        def counted_run(fn, *args, **kwargs):
            if not work._recording():
                return run(fn, *args, **kwargs)
            work.launch(fn.fn.__name__)
            for t in _tensors(list(args)):  # what a kernel writes stays on the device
                if t.numel():
                    work._device.add(_key(t))
            with work.paused():
                return run(fn, *args, **kwargs)

        InterpretedFunction.run = counted_run
        self._modes = [_FunctionMode(self), _DispatchMode(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        from triton.runtime.interpreter import InterpretedFunction

        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        InterpretedFunction.run = self._run
        return False

    def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` recorded, its tensor arguments standing for device ones; returns its result."""
        self.device(list(args), kwargs)
        with self:
            return fn(*args, **kwargs)

    def check_same_bytes(self, larger: "HostWork") -> None:
        """Raises :class:`BudgetExceeded` where ``larger`` (the same call on a larger cache) copied more bytes to
        the host: a copy that grows with the cache."""
        if larger.counts.bytes_to_host != self.counts.bytes_to_host:
            raise BudgetExceeded(f"bytes to host {self.counts.bytes_to_host} -> {larger.counts.bytes_to_host} on "
                                 "a larger cache; reads back there: " + ", ".join(larger.what))

    def check(self, budget: dict) -> None:
        """Raises :class:`BudgetExceeded` naming each count over ``budget`` ({count name: most allowed})."""
        over = [f"{name} {getattr(self.counts, name)} > {most}" for name, most in budget.items()
                if getattr(self.counts, name) > most]
        if over:
            raise BudgetExceeded("; ".join(over) + "; reads back: " + ", ".join(self.what))


class _FunctionMode(TorchFunctionMode):
    def __init__(self, work: HostWork):
        super().__init__()
        self.work = work

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        work = self.work
        if not work._recording():
            return func(*args, **kwargs)
        name = _METHOD_READS.get(func) or _SCALAR_READS.get(func)
        if name is not None and work.is_device(args[0]):
            t = args[0]
            work.read_back(f"{name} of {tuple(t.shape)}", t.nbytes if func in _METHOD_READS else t.element_size())
            with work.paused():  # its host copy is not a device tensor, nor work the device does
                if func is torch.Tensor.cpu:  # a copy, as from a device (on the CPU .cpu() returns its input)
                    copy = t.clone()
                    work._device.discard(_key(copy))  # a host tensor, wherever a freed device one was
                    return copy
                return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in _FACTORIES and kwargs.get("device") is not None:
            # Named a device: a device allocation, and but for torch.empty a kernel that fills it (a copy from the
            # host for torch.tensor): the dispatch mode sees these ops without a device tensor among their inputs.
            work.device(out)
            work.counts.allocations += 1
            if func not in (torch.empty, torch.empty_strided):
                work.launch(func.__name__)
        return out


class _DispatchMode(TorchDispatchMode):
    def __init__(self, work: HostWork):
        super().__init__()
        self.work = work

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        work = self.work
        if not work._recording():
            return func(*args, **kwargs)
        if func.namespace == "lsm_gnn":  # the project's op: record its Triton twin's launches and ops
            inputs = list(_tensors([args, kwargs]))
            with work._modes[0], self:  # the dispatcher hides both modes from an op's own body: run it here
                out = _triton_twin(func._schema.name.split("::")[1], args, kwargs)
            if any(work.is_device(t) for t in inputs):
                work.device(out)
            return out
        out = func(*args, **kwargs)
        inputs = list(_tensors([args, kwargs]))
        name = func._schema.name.split("::")[1]
        on_device = any(work.is_device(t) for t in inputs)
        if not on_device:  # a host tensor, though it may lie where a freed device tensor was
            for t in _tensors(out):
                work._device.discard(_key(t))
            return out
        if name == "_local_scalar_dense":
            work.read_back(f"item of {tuple(args[0].shape)}", args[0].element_size())
            return out
        if name in _SIZE_READS or (name in ("index", "index_put", "index_put_") and any(
                t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1]))):
            work.read_back(f"{name}'s size", 8)
        if func.is_view:
            work.device(out)
            return out
        before = {_key(t) for t in inputs if t.numel()}
        for t in _tensors(out):
            if t.numel() and _key(t) not in before:
                work.counts.allocations += 1
        work.device(out)
        if name not in _NO_KERNEL:
            work.launch(name)
        return out


def _triton_twin(op: str, args, kwargs):
    """``torch.ops.lsm_gnn.<op>`` as its CUDA kernel runs it (lsm_gnn.kernels.ops): the Triton twin, called here
    so that its Python body is recorded (the op's CPU kernel runs it out of the modes' sight)."""
    from lsm_gnn.kernels import triton_module
    from lsm_gnn.kernels.ops import _flatten

    if op == "sample_hops":  # (indptr, indices, seeds, fanouts, seed, iteration, num_threads, num_ids=-1)
        num_ids = args[7] if len(args) > 7 else kwargs.get("num_ids", -1)
        return _flatten(triton_module("sampler", on_cpu=True).sample_hops(*args[:6], num_ids))
    if op == "cache_assign":  # (..., bypass, has_misses, num_threads)
        return triton_module("cache_assign", on_cpu=True).cache_assign(*args[:-2], has_misses=args[-2])
    if op == "cache_serve_hits":
        return triton_module("cache_assign", on_cpu=True).cache_serve_hits(*args)
    if op in ("distinct_ids", "pack_misses"):
        return getattr(triton_module("compact", on_cpu=True), op)(*args)
    if op == "rows_by_line":
        return triton_module("row_gather", on_cpu=True).rows_by_line(*args)
    module = {"cache_scan": "window_scan", "victim_enqueue": "victim_enqueue"}
    if op in module:  # their last argument is the C++ core's thread count
        return getattr(triton_module(module[op], on_cpu=True), op)(*args[:-1])
    return getattr(triton_module("victim_serve", on_cpu=True), op)(*args, **kwargs)


# -- the device-mode stand-ins -----------------------------------------------------------------------------------

def _device_unique(ids: torch.Tensor):
    """lsm_gnn.utils.ids.unique_ids' device branch (its CPU branch is a native radix sort)."""
    return torch.unique(ids, sorted=True, return_inverse=True)


@contextlib.contextmanager
def device_mode(monkeypatch):
    """torch.cuda's streams replaced by tests/fake_cuda.py's stand-in, the Triton kernels for CPU tensors, and
    the helpers that branch on the device type taking their device branch."""
    from fake_cuda import StreamRecorder
    from lsm_gnn import kernels
    from lsm_gnn.cache import software_cache

    StreamRecorder().install(monkeypatch)
    monkeypatch.setattr(software_cache, "unique_ids", _device_unique)
    with kernels.using("triton"):
        yield


def device_cache(storage, *, misses: str = "staged", **kwargs):
    """A :class:`SoftwareCache` on CPU tensors that takes its GPU path: lookups on a stream (the stand-in,
    installed by :func:`device_mode`), hits served first (but with the paper's PVP mode), misses through the staging buffer
    (unpinned) as from a host storage, or with ``misses="direct"`` read into the lines by a storage that reads
    to the cache's device (``pinned``, gds); read-ahead's misses found by the device probe."""
    from lsm_gnn.cache import SoftwareCache
    from lsm_gnn.cache.staging import StagedMisses

    paper_pvp = kwargs.get("pvp") and kwargs.get("pvp_reinstall") is False  # (its ids skip the cache: no hits first)
    cache = SoftwareCache(storage, **{"hits_first": not paper_pvp, **kwargs})
    cache._stream = torch.cuda.Stream(cache.device)
    if misses == "staged":
        cache._misses = StagedMisses(storage, cache.device, pin=False)
    elif misses != "direct" or cache.miss_path != "direct":
        raise ValueError(f"misses={misses!r} (staged or direct) over a storage whose reads take the "
                         f"{cache.miss_path} path")
    if cache.read_ahead is not None:
        cache.read_ahead.on_device = True
    if cache.pvp is not None:  # its GPU mode: counters on the device, queues in (here unpinned) host memory
        cache.pvp._copy_to_device()
    return cache


def cache_lookup(cache, ids: torch.Tensor, future=None) -> HostWork:
    """One lookup recorded, with the cache's tensors and ``ids`` on the device (the future window on the host)."""
    work = HostWork()
    work.device(cache.state, cache.data, cache._hits_first, cache.dirty, cache.node_static)
    work.call(lambda i: cache.lookup(i, future=future), ids)
    return work


def sampler_call(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanouts: list[int],
                 iteration: int = 0) -> HostWork:
    """One call of the device sampler's op (``sample_hops``) recorded, the CSR and seeds on the device."""
    from lsm_gnn.kernels import ops  # noqa: F401  (registers torch.ops.lsm_gnn)

    work = HostWork()
    work.device(indptr, indices)
    work.call(lambda s: torch.ops.lsm_gnn.sample_hops(indptr, indices, s, fanouts, 7, iteration, 1), seeds)
    return work


# -- the operations the budgets are for, at sizes the interpreter runs in a fraction of a second -----------------

BATCH = 40           # ids per lookup
WAYS = 8
CACHE_SETS = (8, 64)  # 64 and 512 lines: bytes to host must not grow with them
FANOUT, SEEDS = 4, 10
LOOKUPS = ("all-hit lookup", "lookup with misses", "lookup with read-ahead", "PVP lookup with misses")
# The budgets (issue 43, item 1); per hop: a sampler call's launches over its hops. The launches of a
# lookup with misses are ours (the issue set none): 14 since the compaction kernels (46 before), with room for 2;
# with PVP 30 (16 more: the window scan, the enqueue's 4, the match's 3 and 4 small ops, the install, and the hit
# mask's 2), with room for 2.
BUDGETS = {"all-hit lookup": {"reads_back": 1, "launches": 4}, "lookup with misses": {"reads_back": 2, "launches": 16},
           "lookup with read-ahead": {"reads_back": 2}, "PVP lookup with misses": {"reads_back": 2, "launches": 32},
           "sampler call": {"reads_back": 1, "launches per hop": 3}}


def tiny_dataset(path) -> str:
    """A 2,400-node dataset of 6 float32 features at ``path`` (room for 20 ids in each of 64 sets); returns it."""
    from lsm_gnn.testing import write_tiny_dataset

    write_tiny_dataset(path, num_nodes=2400, dim=6)
    return str(path)


def lookup_work(op: str, dataset: str, sets: int = CACHE_SETS[0]) -> HostWork:
    """The host's work of one lookup of ``op`` (one of LOOKUPS) on a fresh device-mode cache of ``sets`` x WAYS
    lines, under :func:`device_mode`."""
    from lsm_gnn import open_storage
    from lsm_gnn.cache import WindowBuffer

    ids = torch.arange(BATCH)
    storage = open_storage(dataset, "pread")  # read-only, as features are (a memory storage is a writable table)
    if op == "PVP lookup with misses":
        return _pvp_lookup_work(storage, sets)
    if op == "lookup with read-ahead":
        cache = device_cache(storage, num_sets=sets, ways=WAYS, read_ahead=2)
        future = WindowBuffer(3, cache.storage.num_rows)
        for k in (1, 2):
            future.push(ids + k * BATCH)
        return cache_lookup(cache, ids, future)
    cache = device_cache(storage, num_sets=sets, ways=WAYS, read_ahead=0)
    if op == "all-hit lookup":  # one that follows an all-hit lookup (after one with misses the probe waits)
        cache.lookup(ids)
        cache.lookup(ids)
    else:
        cache.lookup(ids[:BATCH // 2])  # the misses: half the batch
    return cache_lookup(cache, ids)


def _pvp_lookup_work(storage, sets: int) -> HostWork:
    """A lookup of a device-mode cache with PVP (reinstalling, the default) whose batch is half ids parked in the
    victim buffer and half ids read from storage, after ``prefetch()`` moved its queue (as the loader does):
    five sets of 8 ways hold batch ``a`` (8 ids each), ``b`` evicts it, and ``a``'s 4 ids per set that the third
    batch uses are parked for it, which brings 4 new ids per set."""
    import numpy as np

    from lsm_gnn.cache import WindowBuffer
    from lsm_gnn.cache.geometry import set_of

    of_set = set_of(np.arange(storage.num_rows), sets)
    chosen = [np.flatnonzero(of_set == s)[:20] for s in range(BATCH // WAYS)]
    a, b, new = (torch.from_numpy(np.sort(np.concatenate([c[k:k + n] for c in chosen])))
                 for k, n in ((0, 8), (8, 8), (16, 4)))
    mixed = torch.from_numpy(np.sort(np.concatenate([c[:4] for c in chosen] + [new.numpy()])))
    cache = device_cache(storage, num_sets=sets, ways=WAYS, read_ahead=0, pvp=True, window=2, period=1, policy="lru",
                         pvp_queue_capacity=BATCH)
    future = WindowBuffer(2, storage.num_rows)
    future.push(b)
    future.push(mixed)
    cache.lookup(a, future=future)
    future.pop()
    future.push(a)
    cache.lookup(b, future=future)
    cache.prefetch()
    future.pop()
    future.push(b)
    work = HostWork()
    work.device(cache.state, cache.data, [cache.pvp.count, cache.pvp.queue_iteration, cache.pvp.tallies])
    before = cache.stats.pvp_hits, cache.stats.misses
    work.call(lambda i: cache.lookup(i, future=future), mixed)
    served, read = cache.stats.pvp_hits - before[0], cache.stats.misses - before[1]
    assert (served, read) == (BATCH // 2, BATCH // 2), f"{served} ids served by the victim buffer, {read} read"
    cache.settle()
    return work


def sampler_work(hops: int) -> HostWork:
    """The host's work of one device sampler call of ``hops`` hops of FANOUT over a 200-node random graph."""
    import numpy as np

    rng = np.random.default_rng(1)
    degree = rng.integers(0, 10, 200)
    indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(degree)]))
    indices = torch.from_numpy(rng.integers(0, 200, int(indptr[-1])))
    return sampler_call(indptr, indices, torch.arange(SEEDS), [FANOUT] * hops)
