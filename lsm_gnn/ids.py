"""Node ids as the one tensor type every layer takes: the base of the dependence chain.

Data, storage, cache, communication and loader all accept ids as a tensor,
array or list; they normalize them here so the checks (integers only, no
silent wrap of huge unsigned ids) are the same everywhere.
"""
from __future__ import annotations

import numpy as np
import torch

_EXACT_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)  # convert to int64 losslessly
_INT64_MAX = np.iinfo(np.int64).max


def as_id_tensor(ids, device="cpu") -> torch.Tensor:
    """ids as a contiguous 1-D int64 tensor on ``device`` (from a tensor, array or list).

    Every integer dtype and byte order is accepted. Non-integers raise a
    TypeError naming the dtype; unsigned ids too large for int64 (which no
    dataset can hold) raise an IndexError naming the id instead of wrapping.
    """
    if isinstance(ids, torch.Tensor):
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise _not_integers(ids.dtype)
        if ids.dtype not in _EXACT_ID_DTYPES:  # uint16/32/64: numpy range-checks them below
            ids = ids.cpu().numpy()
    if not isinstance(ids, torch.Tensor):
        array = np.asarray(ids)
        if array.size == 0:
            array = array.astype(np.int64)  # [] would otherwise be float64
        if array.dtype.kind not in "iu":
            raise _not_integers(array.dtype)
        if array.dtype.kind == "u" and array.dtype.itemsize == 8 and int(array.max()) > _INT64_MAX:
            position = int(np.flatnonzero(array.reshape(-1) > _INT64_MAX)[0])
            raise IndexError(f"node id {int(array.reshape(-1)[position])} at position {position} is out of range: "
                             f"it does not fit int64, and node ids lie in [0, num_nodes)")
        ids = torch.from_numpy(np.ascontiguousarray(array.astype(np.int64, copy=False)))  # also native byte order
    return ids.reshape(-1).to(device=device, dtype=torch.int64).contiguous()


def _not_integers(dtype) -> TypeError:
    hint = "a boolean mask becomes ids with np.flatnonzero(mask)" if str(dtype).endswith("bool") else \
        "convert whole-number ids with ids.astype(np.int64)"
    return TypeError(f"node ids must be integers, got dtype {dtype}; {hint}")


def unique_ids(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted distinct ids, index of each id in them) of a 1-D int64 tensor, on its device."""
    if ids.device.type == "cpu":
        # np.unique: torch.unique (a parallel sort) took 50x longer on a loaded 2-core machine.
        unique, inverse = np.unique(ids.numpy(), return_inverse=True)
        return torch.from_numpy(unique), torch.from_numpy(inverse.reshape(-1))
    return torch.unique(ids, sorted=True, return_inverse=True)
