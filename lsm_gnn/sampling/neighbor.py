"""Uniform neighbor sampling without replacement, per-hop fanouts.

``NeighborSampler(dataset, fanouts, seed).sample(seeds, iteration)`` is
deterministic in (seed, iteration, seeds): a window buffer can sample batch
t + 256 now and the trainer gets the very same batch at iteration t + 256.

The sampler is one op, ``torch.ops.lsm_gnn.sample_hops`` (:mod:`lsm_gnn.kernels.ops`): the C++ core
for CPU seeds, the Triton kernel for CUDA seeds (``device="cuda"``, or seeds given as a CUDA tensor),
drawing the same hops. The Triton kernel is checked against the C++ core on CPU tensors under Triton's
interpreter (``kernels=triton``); it has not run on a GPU yet (``docs/gpu.md``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.data.format import source_file, topology_error
from lsm_gnn.ids import as_id_tensor


@dataclass
class Hop:
    """One hop (a DGL-style block): ``nodes[:num_dst]`` are its destination
    nodes; ``edge_index[0]`` indexes ``nodes`` (sources), ``edge_index[1]``
    indexes ``nodes[:num_dst]`` (destinations); messages flow 0 -> 1 as in PyG."""

    nodes: torch.Tensor
    num_dst: int
    edge_index: torch.Tensor

    @property
    def num_src(self) -> int:
        return int(self.nodes.numel())


def _tensor(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        # Memory-mapped topology is read-only; the sampler only reads it.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA sampling was requested but torch sees no CUDA device; sample on the CPU "
                           "(device='cpu' and CPU seeds)")


def _signed64(value: int) -> int:
    """A uint64 as the int64 with the same bits (torch ops take int64)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _sampler_device(device) -> torch.device | None:
    """A sampler's ``device`` argument, checked: None, "cpu" or "cuda[:i]"."""
    device = None if device is None else torch.device(device)
    if device is not None and device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be None, 'cpu' or 'cuda[:i]', got {device!r}")
    if device is not None and device.type == "cuda":
        _require_cuda()  # fail at construction, not at the first batch
    return device


def _batch_device(device: torch.device | None, *seeds) -> torch.device:
    """Where a batch is sampled: the sampler's device, else the GPU of the first CUDA tensor among the
    seed arrays, else the CPU. A bare "cuda" means the current GPU."""
    if device is None:
        on_gpu = [ids.device for ids in seeds if isinstance(ids, torch.Tensor) and ids.is_cuda]
        device = on_gpu[0] if on_gpu else torch.device("cpu")
    if device.type == "cuda":
        _require_cuda()
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


TOPOLOGY_ACCESS = ("random", "normal")


def advise_mapped(array, access: str) -> None:
    """``madvise`` on the memory map behind ``array`` (``np.load(..., mmap_mode="r")`` keeps its mmap),
    if it has one: ``"random"`` turns the kernel's read-around off, ``"normal"`` restores it.

    A page fault on a mapped file normally reads up to 128 KiB around the page (read-around). A sampler
    reads one neighbor list, tens of bytes, per fault at random places: when the topology does not fit
    in memory, read-around reads ~32 pages for each one used and evicts the useful ones to make room
    (measured in docs/benchmarks.md, "Out of core: topology and scale"). The advice holds for the whole
    mapping, so other readers of the same array in this process lose read-around too."""
    import mmap

    if access not in TOPOLOGY_ACCESS:
        raise ValueError(f"topology access must be one of {', '.join(TOPOLOGY_ACCESS)}, got {access!r}")
    base = getattr(array, "_mmap", None)
    if base is None or not hasattr(mmap, "MADV_RANDOM"):
        return  # in memory already, or a platform without madvise
    base.madvise(mmap.MADV_RANDOM if access == "random" else mmap.MADV_NORMAL)


class _SamplingCSR:
    """One CSR as the tensors ``sample_hops`` reads, copied to each CUDA device on first use there.
    Memory-mapped arrays are wrapped, not copied, and advised for ``access`` (:func:`advise_mapped`)."""

    def __init__(self, indptr, indices, access: str = "random"):
        for array in (indptr, indices):
            advise_mapped(array, access)
        # The native sampler bounds-checks the CSR as it reads it; its errors name these files.
        self.files = (source_file(indptr), source_file(indices))
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.num_rows = indptr.size - 1
        self.indptr = _tensor(indptr)
        indices = np.ascontiguousarray(indices)
        if indices.dtype not in (np.int32, np.int64):
            indices = indices.astype(np.int64)
        self.indices = _tensor(indices)
        self._on_device: dict = {}  # CUDA device -> (indptr, indices) there

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device.type != "cuda":
            return self.indptr, self.indices
        if device not in self._on_device:
            self._on_device[device] = (self.indptr.to(device), self.indices.to(device))
        return self._on_device[device]


class NeighborSampler:
    """Samples hops outward from seed nodes over a dataset's CSR topology.

    ``fanouts[h]`` neighbors per node at hop h (-1: all). Hop 0 samples the
    seeds' neighbors; each later hop samples for every node reached so far.

    ``device``: None samples where the seeds are (CUDA seeds: on their GPU;
    anything else: on the CPU); "cpu" or "cuda[:i]" forces one. The GPU path
    copies the CSR to the device on first use (the topology must fit in GPU
    memory) and runs the Triton kernels.

    ``topology_access``: ``"random"`` (default) stops the kernel's read-around on the memory-mapped CSR,
    which pays when the topology does not fit in memory; ``"normal"`` keeps it (a cold first pass over
    a topology that fits warms up faster with it). See :func:`advise_mapped`.
    """

    def __init__(self, dataset, fanouts, seed: int = 0, num_threads: int = 0, device=None,
                 topology_access: str = "random"):
        self.fanouts = [int(k) for k in fanouts]
        if not self.fanouts or any(k < -1 for k in self.fanouts):
            raise ValueError(f"fanouts must be a non-empty list of ints >= 0 (or -1 for all), got {fanouts}")
        self.seed = int(seed) & ((1 << 64) - 1)
        self.num_threads = num_threads
        self._csr = _SamplingCSR(dataset.indptr, dataset.indices, topology_access)
        self.indptr, self.indices = self._csr.indptr, self._csr.indices
        self.num_nodes = self._csr.num_rows
        self.device = _sampler_device(device)

    def sample(self, seeds, iteration: int = 0) -> list[Hop]:
        """The hops for one mini-batch of distinct seed nodes, on the sampling device."""
        from lsm_gnn import _C
        from lsm_gnn.kernels.ops import hops_of

        device = _batch_device(self.device, seeds)
        indptr, indices = self._csr.on(device)
        seeds = as_id_tensor(seeds, device)
        try:
            flat = torch.ops.lsm_gnn.sample_hops(indptr, indices, seeds, self.fanouts, _signed64(self.seed),
                                                 int(iteration), self.num_threads)
        except _C.CorruptGraphError as exc:
            raise topology_error(exc, *self._csr.files) from None
        return [Hop(nodes, num_dst, torch.stack([src, dst])) for nodes, num_dst, src, dst in
                hops_of(flat, seeds.numel())]

    def input_nodes(self, seeds, iteration: int = 0) -> torch.Tensor:
        """Every node whose features the batch needs (the last hop's nodes)."""
        return self.sample(seeds, iteration)[-1].nodes
