"""What every rank must share: one collective timeout, the same settings, and a trace of progress.

- :func:`collective_timeout` reads ``LSM_GNN_TIMEOUT_S`` once for every
  process group (the default one and the exchange's), so a stopped rank
  makes the others fail after that many seconds, not after gloo's default.
- :func:`check_agreement` compares a dict of settings across ranks at start
  and names the rank and key that differ, instead of letting gloo abort on
  mismatched tensor sizes or ranks train on inconsistent shards.
- :class:`ProgressBoard` records each rank's last iteration in the
  process group's key-value store, so a rank whose collective failed can
  say which rank stopped answering and where it was.
"""
from __future__ import annotations

import math
import os
import threading
from datetime import timedelta

TIMEOUT_ENV = "LSM_GNN_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0


class RankMismatchError(ValueError):
    """Ranks were started with settings that must agree but do not."""


class CollectiveError(RuntimeError):
    """A collective failed or timed out: another rank died, stopped or is stuck."""


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` came from a process group's backend (a timeout or a closed connection)."""
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", ())
    text = str(exc)
    return isinstance(exc, dist_error) or isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("gloo", "Gloo", "NCCL", "Connection closed by peer", "Timed out waiting"))


def collective_timeout() -> timedelta:
    """The timeout of every collective, from ``LSM_GNN_TIMEOUT_S`` (seconds, default 300)."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a positive number of seconds; set it to e.g. 300, or "
                         "unset it for the default")
    return timedelta(seconds=seconds)


def first_line(exc: BaseException, limit: int = 160) -> str:
    """The start of a backend's error message: gloo's run to several lines of advice."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else repr(exc)
    return line if len(line) <= limit else line[:limit] + "..."


def check_agreement(settings: dict, group=None,
                    fix: str = "Start every rank with the same config file, overrides and dataset") -> None:
    """Raises :class:`RankMismatchError` on every rank unless all ranks pass equal ``settings``
    (a flat mapping of dotted keys to plain values).

    The message names the first rank that differs from rank 0 and each key
    that differs, with both values. Collective: every rank must call it.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if world == 1:
        return
    gathered: list = [None] * world
    dist.all_gather_object(gathered, dict(settings), group=group)
    reference = gathered[0]
    for rank, other in enumerate(gathered[1:], start=1):
        keys = sorted(set(reference) | set(other))
        differ = [k for k in keys if reference.get(k) != other.get(k)]
        if differ:
            detail = "; ".join(f"{k} is {other.get(k)!r} on rank {rank} but {reference.get(k)!r} on rank 0"
                               for k in differ[:5])
            more = f" (and {len(differ) - 5} more)" if len(differ) > 5 else ""
            raise RankMismatchError(f"rank {rank} disagrees with rank 0: {detail}{more}. {fix}")


class ProgressBoard:
    """Each rank's last reached step of one activity (``name``), kept in the default process group's store.

    With no store (``store=None``) marks are kept locally only, and
    :meth:`laggards` can name the peer only when there is one.
    """

    def __init__(self, rank: int, world_size: int, store=None):
        self.rank, self.world_size = rank, world_size
        self.store = store
        self.step = -1

    @classmethod
    def for_default_group(cls, name: str) -> ProgressBoard:
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        try:
            # The store rendezvous made; its accessor is private API, so a missing one only costs detail.
            from torch.distributed.distributed_c10d import _get_default_store

            store = dist.PrefixStore(f"lsm_gnn/progress/{name}/", _get_default_store())
        except Exception:
            store = None
        return cls(rank, world, store)

    def mark(self, step: int) -> None:
        """Records that this rank has reached ``step``."""
        self.step = step
        if self.store is not None:
            try:
                self.store.set(str(self.rank), str(step))
            except Exception:
                self.store = None  # the store's host is gone; the failure that follows says so

    def _peer_steps(self, ranks: list[int], timeout_s: float) -> dict[int, int] | None:
        """Each rank's last marked step (-1: none) from the store, or None if the store does not answer within
        ``timeout_s``. The query runs on a daemon thread: with the link to the store's host down, a store
        call blocks in recv until the kernel gives up on the connection (minutes), whatever the store's
        timeout says; the error message must not wait for that."""
        found: dict[int, int] = {}
        failed: list[BaseException] = []

        def query():
            try:
                self.store.set_timeout(timedelta(seconds=timeout_s))
                for rank in ranks:
                    found[rank] = int(self.store.get(str(rank))) if self.store.check([str(rank)]) else -1
            except BaseException as exc:  # reported as "unreachable" below
                failed.append(exc)

        thread = threading.Thread(target=query, name="lsm-gnn-progress-query", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive() or failed:
            self.store = None  # stuck or broken: later calls must not block on it either
            return None
        return found

    def laggards(self) -> str:
        """Which rank this one is probably waiting for, as a phrase for an error message."""
        others = [r for r in range(self.world_size) if r != self.rank]
        behind = []
        if self.store is not None:
            steps = self._peer_steps(others, timeout_s=5.0)
            if steps is None:
                return ("rank 0, the host of the rendezvous store, is unreachable: it died, or the network "
                        "between the hosts is down")
            for rank, step in steps.items():
                if step < self.step:
                    behind.append(f"rank {rank} (last at step {step})" if step >= 0 else
                                  f"rank {rank} (never started)")
        if behind:
            return f"{', '.join(behind)} did not reach step {self.step}: it stopped, crashed or is stuck"
        if len(others) == 1:
            return f"rank {others[0]} did not answer: it stopped, crashed or is stuck"
        return f"one of ranks {others} did not answer: it stopped, crashed or is stuck"
