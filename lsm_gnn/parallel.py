"""Small helpers shared by the training tasks: moving batches to a device, summing across ranks."""
from __future__ import annotations

import torch


def batch_to(batch, device):
    """The batch's tensors on ``device`` (a no-op on CPU or when ``device`` is None)."""
    if device is None or torch.device(device).type == "cpu":
        return batch
    for hop in batch.hops:
        hop.edge_index = hop.edge_index.to(device, non_blocking=True)
    batch.x = batch.x.to(device, non_blocking=True)
    if getattr(batch, "y", None) is not None:
        batch.y = batch.y.to(device, non_blocking=True)
    return batch


def all_reduce_sum(values: list[float]) -> list[float]:
    """``values`` summed over all ranks (unchanged in a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()
