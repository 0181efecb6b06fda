"""Distributed set-up and the small helpers the training tasks share: joining the process group from a
launcher's environment, moving batches to a device, summing across ranks."""
from __future__ import annotations

import os

import torch

from lsm_gnn.comm.group import collective_timeout


def distributed_context(device: torch.device) -> tuple[int, int]:
    """(rank, world size); initialises torch.distributed from torchrun's or MPI's environment if needed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env = os.environ
    rank = env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK")))
    world = env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE")))
    if rank is None or world is None:
        return 0, 1
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        raise RuntimeError("a distributed launch needs MASTER_ADDR and MASTER_PORT in the environment "
                           "(torchrun sets them; with mpirun use launch/mpirun.sh)")
    backend = "nccl" if device.type == "cuda" else "gloo"
    _import_modules_binding_the_default_group()
    # A finite timeout, the same for every group: a rank that dies makes the others fail instead of hanging.
    dist.init_process_group(backend, rank=int(rank), world_size=int(world), timeout=collective_timeout())
    return dist.get_rank(), dist.get_world_size()


def _import_modules_binding_the_default_group() -> None:
    # torch.distributed.nn.functional binds the default group into its functions' defaults (group=group.WORLD)
    # when first imported, and DDP imports it: imported after init_process_group, it keeps the default group
    # alive past destroy_process_group (see leave_process_group). Imported before, it binds None.
    import torch.distributed.nn.functional  # noqa: F401


def leave_process_group() -> None:
    """Destroys every process group, joining their threads now, before the interpreter finalizes.

    A gloo group's worker threads release each finished collective's tensors, and with them Python objects,
    which takes the GIL. Still running while the interpreter finalizes (the group kept alive by a reference),
    such a thread is ended by Python inside C++ code that may not be unwound, and the process aborts
    (`terminate called without an active exception`, SIGABRT) after a successful run, now and then.
    Destroyed here, the group's destructor waits for its queue and joins its threads while the GIL is free.
    """
    import gc

    import torch.distributed as dist

    gc.collect()  # in case a model (DDP) or a shared cache caught in a reference cycle still holds a group
    dist.destroy_process_group()


def batch_to(batch, device):
    """The batch's tensors on ``device`` (a no-op on CPU or when ``device`` is None)."""
    if device is None or torch.device(device).type == "cpu":
        return batch
    return batch.to(device)


def all_reduce_sum(values: list[float]) -> list[float]:
    """``values`` summed over all ranks (unchanged in a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()
