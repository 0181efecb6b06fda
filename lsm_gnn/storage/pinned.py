"""The ``pinned`` backend: the whole feature file in page-locked host memory, its rows read by the GPU itself.

A cache on a GPU over this storage takes the ``direct`` miss path: its misses are gathered by a Triton kernel
(:mod:`lsm_gnn.kernels.row_gather`) that loads the rows from host memory over PCIe through unified virtual
addressing and stores them straight into the cache's lines, with no host copy, no staging buffer and no disk.
That is what separates the project's own overhead from the disk's: end to end over this storage against the
whole table in GPU memory (``benchmarks/end_to_end.py``'s ``farthest-pinned`` beside ``device``).

The table is loaded as the ``memory`` backend loads it, then registered with the driver in place
(``cudaHostRegister``, portable and mapped), as DGL's and GraphBolt's UVA gathers pin a tensor in place: a
``pin_memory()`` copy would hold the table twice while it is made (and torch's pinned allocator may round a
block up to a power of two). Where the driver cannot map host memory for the GPU, opening fails with an error naming
the ``memory`` backend (misses staged through a pinned buffer, one copy per batch) as the way out: a GPU never
falls back to a host copy silently.

``device="cpu"`` runs the same kernel on CPU tensors under Triton's interpreter (tests, where no GPU is seen);
elsewhere it is refused.
"""
from __future__ import annotations

import time
import weakref

import torch

from lsm_gnn.storage.memory import MemoryStorage
from lsm_gnn.utils.memcap import available_memory
from lsm_gnn.utils.units import format_bytes

# cudaHostRegisterPortable | cudaHostRegisterMapped: every GPU of the process may read it, at a device address.
HOST_REGISTER_FLAGS = 1 | 2


class PinnedStorage(MemoryStorage):
    backend = "pinned"
    #: features only: a row written on the host while a gather of the GPU may read it would need a fence
    writable = False

    def __init__(self, dataset, device: str | torch.device = "cuda"):
        self._device = _read_device(device)
        layout = dataset.features
        need = dataset.num_nodes * layout.row_bytes
        room = available_memory()
        if room is not None and need > room:
            raise MemoryError(f"backend 'pinned' holds the whole feature file in page-locked host memory: "
                              f"{format_bytes(need)} ({dataset.num_nodes} rows of {layout.row_bytes} B), but only "
                              f"{format_bytes(room)} is available; use a disk backend (io_uring) with a cache")
        super().__init__(dataset)
        self._unpin = None
        if self._device.type == "cuda":
            _register(self._rows)
            # Unregistered at close, or when the storage is collected unclosed; the finalizer holds the table,
            # so its memory is unregistered before it can be freed.
            self._unpin = weakref.finalize(self, _unregister, self._rows, self._device)

    @property
    def device(self) -> torch.device:
        """Where reads land: the GPU that gathers the rows (a cache on it reads its misses into its lines)."""
        return self._device

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        self._gather(ids, out, None)

    def _read_into(self, ids: torch.Tensor, out: torch.Tensor, slots: torch.Tensor) -> None:
        self._gather(ids, out, slots)

    def _gather(self, ids: torch.Tensor, out: torch.Tensor, slots: torch.Tensor | None) -> None:
        from lsm_gnn.kernels.row_gather import gather_rows

        start = time.perf_counter()
        self._check_ids(ids)  # the host's ids: checked before they travel, no device sync
        gather_rows(self._rows, ids.to(self._device, non_blocking=True), out, slots)
        self._count(ids.numel(), time.perf_counter() - start)

    def close(self) -> None:
        super().close()
        if self._unpin is not None:
            self._unpin()


def _read_device(device) -> torch.device:
    """The device a pinned storage reads to, checked: a CUDA GPU torch sees, or the CPU under Triton's
    interpreter."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'pinned' reads rows into a GPU over UVA, and torch sees no CUDA device "
                               "(torch.cuda.is_available() is False); use backend 'memory' on the CPU")
        return torch.device("cuda", torch.cuda.current_device()) if device.index is None else device
    from lsm_gnn.kernels import triton_interpreted

    if device.type == "cpu" and triton_interpreted():
        return device
    raise ValueError(f"backend 'pinned' reads rows into a CUDA GPU, not {device}; for a cache on the CPU use "
                     "backend 'memory' (device='cpu' runs its kernel under Triton's interpreter, for tests)")


def _register(table: torch.Tensor) -> None:
    """Registers ``table``'s memory with the CUDA driver, mapped for every GPU."""
    error = int(torch.cuda.cudart().cudaHostRegister(table.data_ptr(), table.numel() * table.element_size(),
                                                     HOST_REGISTER_FLAGS))
    if error != 0:
        raise RuntimeError(f"backend 'pinned': the CUDA driver could not page-lock and map the "
                           f"{format_bytes(table.numel() * table.element_size())} feature table for the GPU "
                           f"(cudaHostRegister error {error}), so the GPU cannot read it over UVA; use backend "
                           "'memory' (misses copied through a pinned staging buffer) or a disk backend")


def _unregister(table: torch.Tensor, device: torch.device) -> None:
    torch.cuda.synchronize(device)  # no gather still reading it
    torch.cuda.cudart().cudaHostUnregister(table.data_ptr())
