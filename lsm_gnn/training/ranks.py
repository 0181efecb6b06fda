"""The trainer's collectives between ranks: each named, so that one that fails or times out says which rank is
missing rather than a bare timeout. With no process group every call is a plain local one."""
from __future__ import annotations

import contextlib

from lsm_gnn.comm.group import TIMEOUT_ENV, CollectiveError, collective_timeout, first_line, is_collective_failure


def distributed() -> bool:
    """Whether a process group is up (then the run's ranks train together)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


class Ranks:
    """This process's ``rank`` of ``world_size``; ``progress`` (a ProgressBoard, None on one process) tells a
    failed collective which ranks are behind."""

    def __init__(self, rank: int, world_size: int, progress=None):
        self.rank, self.world_size, self.progress = rank, world_size, progress

    @contextlib.contextmanager
    def collectives(self, what: str):
        """Turns a failed or timed-out collective inside the block into one message naming the missing rank."""
        try:
            yield
        except RuntimeError as exc:
            if self.progress is None or not is_collective_failure(exc):
                raise
            raise CollectiveError(
                f"rank {self.rank}: a collective of {what} failed after at most "
                f"{collective_timeout().total_seconds():g} s ({TIMEOUT_ENV}): {self.progress.laggards()}; check "
                f"its log. ({first_line(exc)})") from None

    def barrier(self) -> None:
        """Every rank waits for the others (the node-embedding table's steps are in lockstep)."""
        if distributed():
            import torch.distributed as dist

            with self.collectives("a barrier of the embedding table"):
                dist.barrier()

    def rank0_decides(self, value, what: str):
        """Rank 0's ``value`` on every rank (values computed alike may still differ in the last bit)."""
        if not distributed():
            return value
        import torch.distributed as dist

        decision = [value]
        with self.collectives(what):
            dist.broadcast_object_list(decision, src=0)
        return decision[0]

    def gather(self, own, what: str) -> list:
        """Every rank's ``own``, in rank order, on every rank."""
        if not distributed():
            return [own]
        import torch.distributed as dist

        states = [None] * self.world_size
        with self.collectives(what):
            dist.all_gather_object(states, own)
        return states
