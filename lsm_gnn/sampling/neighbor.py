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


class NeighborSampler:
    """Samples hops outward from seed nodes over a dataset's CSR topology.

    ``fanouts[h]`` neighbors per node at hop h (-1: all). Hop 0 samples the
    seeds' neighbors; each later hop samples for every node reached so far.

    ``device``: None samples where the seeds are (CUDA seeds: on their GPU;
    anything else: on the CPU); "cpu" or "cuda[:i]" forces one. The GPU path
    copies the CSR to the device on first use (the topology must fit in GPU
    memory) and runs the Triton kernels.
    """

    def __init__(self, dataset, fanouts, seed: int = 0, num_threads: int = 0, device=None):
        self.fanouts = [int(k) for k in fanouts]
        if not self.fanouts or any(k < -1 for k in self.fanouts):
            raise ValueError(f"fanouts must be a non-empty list of ints >= 0 (or -1 for all), got {fanouts}")
        self.seed = int(seed) & ((1 << 64) - 1)
        self.num_threads = num_threads
        # The native sampler bounds-checks the CSR as it reads it; its errors name these files.
        self._files = (source_file(dataset.indptr), source_file(dataset.indices))
        self.indptr = _tensor(np.ascontiguousarray(dataset.indptr, dtype=np.int64))
        indices = np.ascontiguousarray(dataset.indices)
        if indices.dtype not in (np.int32, np.int64):
            indices = indices.astype(np.int64)
        self.indices = _tensor(indices)
        self.num_nodes = self.indptr.numel() - 1
        self.device = None if device is None else torch.device(device)
        if self.device is not None and self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be None, 'cpu' or 'cuda[:i]', got {device!r}")
        if self.device is not None and self.device.type == "cuda":
            _require_cuda()  # fail at construction, not at the first batch
        self._device_csr: dict = {}  # device -> (indptr, indices) there, for the GPU path

    def sample(self, seeds, iteration: int = 0) -> list[Hop]:
        """The hops for one mini-batch of distinct seed nodes, on the sampling device."""
        from lsm_gnn import _C
        from lsm_gnn.kernels.ops import hops_of

        device = self.device
        if device is None:
            device = seeds.device if isinstance(seeds, torch.Tensor) and seeds.is_cuda else torch.device("cpu")
        indptr, indices = self.indptr, self.indices
        if device.type == "cuda":
            _require_cuda()
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            if device not in self._device_csr:
                self._device_csr[device] = (self.indptr.to(device), self.indices.to(device))
            indptr, indices = self._device_csr[device]
        seeds = as_id_tensor(seeds, device)
        try:
            flat = torch.ops.lsm_gnn.sample_hops(indptr, indices, seeds, self.fanouts, _signed64(self.seed),
                                                 int(iteration), self.num_threads)
        except _C.CorruptGraphError as exc:
            raise topology_error(exc, *self._files) from None
        return [Hop(nodes, num_dst, torch.stack([src, dst])) for nodes, num_dst, src, dst in
                hops_of(flat, seeds.numel())]

    def input_nodes(self, seeds, iteration: int = 0) -> torch.Tensor:
        """Every node whose features the batch needs (the last hop's nodes)."""
        return self.sample(seeds, iteration)[-1].nodes
