"""The exchange's collectives: each started on the exchange's process group, timed by kind, and turned,
when it fails, into an :class:`ExchangeError` that names the rank this one waited for.

:class:`Collectives` serves :class:`~lsm_gnn.comm.SharedCache`: ``post`` starts one ``all_to_all_single``
(the backend runs it in the background) and its ``wait()`` gives what arrived; ``all_to_all`` is the two
at once. :class:`ExchangeStats` holds what the exchange counted and timed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lsm_gnn.comm.group import TIMEOUT_ENV, ProgressBoard, first_line


class ExchangeError(RuntimeError):
    """A collective of the exchange failed: another rank died, hung or disagrees on the schedule."""


@dataclass
class ExchangeStats:
    iterations: int = 0
    requested: int = 0        # distinct ids this rank asked for, summed over iterations
    served: int = 0           # distinct ids this rank served as owner, summed over iterations
    remote_requested: int = 0  # of the requested ids, those owned by another rank
    exchange_seconds: float = 0.0  # in the exchange: its collectives and packing the messages
    serve_seconds: float = 0.0     # the local lookup for all ranks' requests
    last_exchange_seconds: float = 0.0
    collectives: int = 0           # all_to_all_single calls made (2 per lookup, 3 when a request spills)
    #: seconds in each kind of collective: "ids and future" (with the counts inside; mostly waiting for the
    #: slowest rank to arrive), "ids and future, spill" (the words past a chunk), "rows", and the "update ..."
    #: kinds of :meth:`SharedCache.update`
    collective_seconds: dict = field(default_factory=dict)
    collective_calls: dict = field(default_factory=dict)  # calls of each kind
    announced: int = 0             # lookups whose request went during the lookup before (``following``)
    #: seconds of the exchange's local work: "window" (the owners' windows; "window, filled" when a new
    #: window's whole future is forwarded, once an epoch), "pack" (ids and rows into messages), "flags from
    #: owners" (through shared memory: the hit flags of the rows in the owners' segments), "unpack" (rows into
    #: request order, this rank's own while the others' replies travel)
    local_seconds: dict = field(default_factory=dict)

    def add(self, what: str, start: float) -> float:
        """Adds the seconds since ``start`` to ``local_seconds[what]``; returns now."""
        now = time.perf_counter()
        self.local_seconds[what] = self.local_seconds.get(what, 0.0) + now - start
        return now

    def as_dict(self) -> dict:
        return {k: dict(v) if isinstance(v, dict) else v for k, v in vars(self).items()}


def exchange_backend(device: torch.device) -> str:
    """The process-group backend for a cache on ``device``: NCCL for a GPU cache where torch has it."""
    if torch.device(device).type == "cuda" and dist.is_nccl_available():
        return "nccl"
    return "gloo"


class Collectives:
    """Collectives on ``group`` (this rank's ``rank`` of ``world_size``), their tensors on ``device``, counted
    and timed in ``stats``; a failure names the rank waited for, from ``progress``."""

    def __init__(self, group, device: torch.device, timeout_s: float, stats: ExchangeStats,
                 progress: ProgressBoard):
        self.group, self.device, self.timeout_s, self.stats, self.progress = group, device, timeout_s, stats, progress
        self.rank = dist.get_rank(group)
        self.backend = str(dist.get_backend(group)).lower()

    def post(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int], what: str,
             recv: torch.Tensor | None = None) -> Posted:
        """Starts one ``all_to_all_single`` (the backend runs it in the background); ``wait()`` on the result
        gives ``recv`` once it arrived."""
        if recv is None:
            recv = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=self.device)
        send = send.to(self.device).contiguous()
        t = time.perf_counter()
        try:
            work = dist.all_to_all_single(recv, send, recv_counts, send_counts, group=self.group, async_op=True)
        except Exception as exc:  # gloo raises RuntimeError / DistBackendError with a terse message
            raise self.failed(what, exc) from None
        s = self.stats
        s.collectives += 1
        s.collective_calls[what] = s.collective_calls.get(what, 0) + 1
        return Posted(self, what, recv, send, work, time.perf_counter() - t)

    def all_to_all(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int], what: str,
                   recv: torch.Tensor | None = None) -> torch.Tensor:
        return self.post(send, send_counts, recv_counts, what, recv).wait()

    def failed(self, what: str, exc: BaseException) -> ExchangeError:
        return ExchangeError(
            f"rank {self.rank}: exchanging {what} at iteration {self.stats.iterations} failed after at most "
            f"{self.timeout_s:g} s ({TIMEOUT_ENV}): {self.progress.laggards()}; check its log. "
            f"({self.backend}: {first_line(exc)})")


class Posted:
    """One ``all_to_all_single`` in flight; :meth:`wait` gives what it received. The stats count the seconds
    this rank spent starting it and waiting for it, not those it ran in the background."""

    def __init__(self, collectives: Collectives, what: str, recv: torch.Tensor, send: torch.Tensor, work,
                 seconds: float):
        self.collectives, self.what, self.recv, self.work, self.seconds = collectives, what, recv, work, seconds
        self.send = send  # the backend reads it until the collective ends

    def wait(self) -> torch.Tensor:
        t = time.perf_counter()
        try:
            self.work.wait()
        except Exception as exc:
            raise self.collectives.failed(self.what, exc) from None
        seconds = self.collectives.stats.collective_seconds
        seconds[self.what] = seconds.get(self.what, 0.0) + self.seconds + time.perf_counter() - t
        self.send = None
        return self.recv
