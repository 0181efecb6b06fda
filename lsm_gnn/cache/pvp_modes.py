"""The victim buffer's part of one cache lookup: one strategy per PVP mode, with a hook for each stage of
:mod:`lsm_gnn.cache.plan` it takes part in, over the cache's :class:`~lsm_gnn.cache.plan.LookupPlan`, and for
the cache's other calls that concern parked rows (update, prefetch, settle, read-ahead).
:func:`victim_part` builds the buffer and picks one when the cache is built, so the cache never asks which
mode runs or whether a buffer exists."""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import nullcontext

import torch

from lsm_gnn.cache.pvp import DEFAULT_QUEUE_BYTES, VictimBuffer, queue_capacity_for
from lsm_gnn.kernels import ops as _ops  # noqa: F401  (registers torch.ops.lsm_gnn)


class WithoutPVP:
    """A cache without a victim buffer: each hook of a lookup's stages does nothing."""

    buffer: VictimBuffer | None = None
    reinstalls = True  # the ids a parked line serves pass through the cache (serving hits first can run)

    def serving(self):
        return nullcontext()

    def room(self, policy) -> torch.Tensor | None:
        """The queues' free room, for the policy that reads it."""
        return None

    def take(self, plan) -> None:
        """begin: the lines prefetched for the batch."""

    def before_assign(self, plan) -> None:
        """Before the cache's assign."""

    def claim(self, plan, assigned, cache_data: torch.Tensor, scan_base: int
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """assign, serving hits first, before the one read back (``assigned``: the assign's outputs on the
        device): the victim buffer's device work that decides what the storage reads. Returns (a mask over the
        distinct ids of those the storage need not read, the number of those a parked line serves as a
        1-element tensor, or None without PVP)."""
        return assigned.hit, None

    def park(self, plan, cache_data: torch.Tensor, scan_base: int) -> None:
        """evict: the batch's victims to their queues."""

    def after_assign(self, plan, cache_data: torch.Tensor) -> None:
        """After the assign, back at every distinct id, once hit rows whose line a miss took are out."""

    def serve(self, plan, cache_data: torch.Tensor) -> None:
        """fill, after the storage reads and the gather: the rows of the ids the queue served."""

    def parked(self, iteration: int) -> torch.Tensor | None:
        """The ids parked for ``iteration`` (:meth:`VictimBuffer.parked_for`), which read-ahead leaves out."""
        return None

    def discard(self, nodes: torch.Tensor) -> None:
        """Drops the parked copies of ``nodes``, whose rows an update changed in storage."""

    def prefetch(self, iteration: int) -> None:
        """Starts moving the queue of ``iteration`` into the prefetch buffer."""

    def close(self) -> None:
        """Joins a prefetch in flight."""


class _FromQueue(WithoutPVP, ABC):
    """What both PVP modes do: take the prefetched lines, park victims, settle the served count."""

    def __init__(self, buffer: VictimBuffer):
        self.buffer = buffer

    def serving(self):
        return self.buffer.serving()

    def room(self, policy) -> torch.Tensor | None:
        return self.buffer.room() if policy.name == "hybrid_pvp_room" else None

    def take(self, plan) -> None:
        plan.prefetched = self.buffer.take(plan.t)

    def parked(self, iteration: int) -> torch.Tensor | None:
        return self.buffer.parked_for(iteration)

    def discard(self, nodes: torch.Tensor) -> None:
        self.buffer.discard(nodes)

    def prefetch(self, iteration: int) -> None:
        self.buffer.prefetch_async(iteration)

    def close(self) -> None:
        self.buffer.close()

    def park(self, plan, cache_data: torch.Tensor, scan_base: int) -> None:
        done = plan.done
        # Victims leave for their queue before the fill overwrites their lines (claim parked them already).
        if done.evictions and not plan.claimed:
            self.buffer.enqueue(done.evicted_tag, done.evicted_record, done.evicted_line, cache_data, plan.t,
                                scan_base)

    def serve(self, plan, cache_data: torch.Tensor) -> None:
        if plan.pvp_hits and self._to_positions(plan):
            torch.ops.lsm_gnn.pvp_scatter(plan.rows, cache_data, plan.prefetched[2], plan.inverse, plan.from_pvp,
                                          plan.entry, None, False)  # (indices the lookup's own ops made)
        self.buffer.consumed(plan.t, plan.pvp_hits)

    @abstractmethod
    def _to_positions(self, plan) -> bool:
        """Whether the served rows must be scattered to their positions (the gather did not serve them)."""


class BypassFromQueue(_FromQueue):
    """The paper's mode (``pvp_reinstall=False``): the ids a prefetched line serves skip the cache, which
    looks up only the others; their rows are scattered to their positions."""

    reinstalls = False

    def before_assign(self, plan) -> None:
        node, record, _ = plan.prefetched
        if not node.numel():  # nothing prefetched: no PVP work in this batch
            return
        served, entry, _ = torch.ops.lsm_gnn.pvp_match(plan.ids, plan.inverse, plan.unique.numel(), node, record)
        keep = torch.nonzero(~served).reshape(-1)
        if keep.numel() < plan.unique.numel():  # the cache sees the others only; no hit can win over these
            plan.keep, plan.cache_ids = keep, plan.unique[keep]
            plan.from_pvp, plan.entry = served, entry
            plan.pvp_hits = plan.unique.numel() - keep.numel()

    def _to_positions(self, plan) -> bool:
        return True  # they have no line


class ReinstallFromQueue(_FromQueue):
    """``pvp_reinstall=True`` (the default): the ids a prefetched line serves pass through the cache as misses
    whose rows come from that line, so the cache evolves as without PVP; the batch's gather serves them."""

    def claim(self, plan, assigned, cache_data: torch.Tensor, scan_base: int
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Every entry offered to the queues on the device (one that evicted nothing is not a victim), so no count
        # is read; the lines come from the assign just run, so the kernels' checks would be reads back for nothing.
        plan.claimed = True
        self.buffer.enqueue(assigned.evicted_tag, assigned.evicted_record, assigned.evicted_line, cache_data, plan.t,
                            scan_base, check=False)
        node, record, _ = plan.prefetched
        if not node.numel():
            return assigned.hit, None
        served, entry, _ = torch.ops.lsm_gnn.pvp_match(plan.ids, plan.inverse, assigned.hit.numel(), node, record,
                                                       False)
        plan.from_pvp, plan.entry = served & ~assigned.hit, entry  # a cache hit wins over a queued copy
        return assigned.hit | served, plan.from_pvp.sum().reshape(1)

    def after_assign(self, plan, cache_data: torch.Tensor) -> None:
        node, record, rows = plan.prefetched
        if plan.claimed:  # matched before the read back: their rows into their new lines
            if plan.pvp_hits:
                torch.ops.lsm_gnn.pvp_install(cache_data, rows, plan.from_pvp, plan.entry, plan.line, False)
        elif node.numel():  # matched to the ids the cache missed, their rows into those ids' new lines
            plan.from_pvp, plan.entry = torch.ops.lsm_gnn.pvp_fill(plan.ids, plan.inverse, plan.hit, plan.line,
                                                                   node, record, rows, cache_data)

    def serve(self, plan, cache_data: torch.Tensor) -> None:
        if plan.from_pvp is not None and not plan.claimed:
            plan.pvp_hits = int(plan.from_pvp.sum())
        super().serve(plan, cache_data)

    def _to_positions(self, plan) -> bool:
        # Hit rows were gathered before the fill (a batch evicting lines it uses), or some have no line.
        return not plan.one_gather or bool(plan.done.bypassed)


def victim_part(pvp: bool, reinstall: bool, queue_capacity: int | None, queue_bytes, *, window: int, storage,
                cache_bytes: int, device: torch.device, num_threads: int = 0) -> WithoutPVP:
    """A cache's ``pvp``, ``pvp_reinstall``, ``pvp_queue_capacity`` and ``pvp_queue_bytes``
    (:class:`~lsm_gnn.cache.SoftwareCache`) as its victim buffer (``.buffer``; None without PVP), the queues sized
    by lines or by bytes (a share of ``cache_bytes``), inside the strategy of its mode: none, the paper's
    bypass, or reinstall."""
    if queue_capacity is not None and queue_bytes is not None:
        raise ValueError(f"give the victim queues' size once: pvp_queue_capacity={queue_capacity!r} (lines "
                         f"per queue) or pvp_queue_bytes={queue_bytes!r} (all queues), not both")
    if not pvp:
        if reinstall:
            raise ValueError("pvp_reinstall=True needs pvp=True")
        return WithoutPVP()
    if queue_capacity is None:
        queue_capacity = queue_capacity_for(DEFAULT_QUEUE_BYTES if queue_bytes is None else queue_bytes,
                                            window + 1, storage.row_bytes, cache_bytes,
                                            at_least_one=queue_bytes is None)
    buffer = VictimBuffer(window, queue_capacity, storage.dim, storage.dtype, device, first_iteration=0,
                          num_threads=num_threads)
    return ReinstallFromQueue(buffer) if reinstall else BypassFromQueue(buffer)
