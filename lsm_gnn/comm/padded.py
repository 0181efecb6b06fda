"""Variable-length int64 messages between every pair of ranks in one ``all_to_all_single``, usually.

``all_to_all_single`` must be told up front how many elements it receives
from each rank. Sending those counts first costs a collective of its own:
a round trip, and a second wait for the slowest rank. Instead every message
travels in a chunk of ``capacity`` words that every rank knows without
asking, and says its own length inside it::

    chunk = [length of this message, longest message the sender sends any rank,
             the message's first capacity - 2 words, zeros to fill the chunk]

After the collective every rank has read every sender's longest message, so
all of them know, with no further exchange, whether any message outgrew its
chunk. If one did, one more collective (the *spill*) carries the words past
each chunk, with sizes both sides read from the chunks. Every rank then sets
the same capacity for the next call from the same numbers: room for the
longest message seen plus half, grown at most 4x and shrunk at most 2x per
call, so one long message (a new window's whole future, once an epoch)
costs a spill rather than padding every later call.

A rank's message to itself never travels: it is handed back as it is.
``exchange`` waits for the messages; ``start`` posts them and ``finish``
receives them later, so the collective runs while the caller works on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch

HEADER_WORDS = 2        # [message length, sender's longest message]
MIN_CAPACITY = 1024     # words per chunk (8 KiB): the floor every rank starts from
MAX_GROWTH, MAX_SHRINK = 4, 2

#: ``post(send, send_counts, recv_counts, what)`` starts one ``all_to_all_single`` and returns a handle whose
#: ``wait()`` gives the received tensor (the caller's wrapper names failures and keeps the stats)
Post = Callable[[torch.Tensor, list, list, str], "Posted"]


class Posted(Protocol):
    def wait(self) -> torch.Tensor: ...


def next_capacity(capacity: int, longest: int) -> int:
    """The chunk size every rank uses after a call whose longest message was ``longest`` words."""
    wanted = max(MIN_CAPACITY, HEADER_WORDS + longest + longest // 2)
    return int(min(max(wanted, capacity // MAX_SHRINK), capacity * MAX_GROWTH))


@dataclass
class Pending:
    """Messages on their way (:meth:`PaddedAllToAll.start`); :meth:`PaddedAllToAll.finish` receives the rest."""
    messages: list[np.ndarray]
    longest: int
    posted: Posted
    post: Post


class PaddedAllToAll:
    """Sends each rank one int64 message of any length. Collective: every rank of the group calls it in the same
    order. One ``all_to_all`` call, two when a message outgrew the agreed chunk; :meth:`exchange` waits for
    them, :meth:`start` and :meth:`finish` let the first run while the caller does other work."""

    def __init__(self, rank: int, world_size: int, what: str, capacity: int = MIN_CAPACITY):
        if capacity < HEADER_WORDS + 1:
            raise ValueError(f"a chunk must hold its {HEADER_WORDS} header words and one more; got {capacity}")
        self.rank, self.world_size, self.what = rank, world_size, what
        self.capacity = capacity
        self.spills = 0  # calls that needed the second collective
        self._pending: Pending | None = None

    def exchange(self, messages: list[np.ndarray], post: Post) -> list[np.ndarray]:
        """``messages[d]`` (1-D int64) goes to rank ``d``; returns the message each rank sent this one, by rank."""
        return self.finish(self.start(messages, post))

    def start(self, messages: list[np.ndarray], post: Post) -> Pending:
        """Posts the chunks of ``messages`` (as :meth:`exchange`); :meth:`finish` must follow before the next
        start, since the next chunk's size comes from this call's messages."""
        if self._pending is not None:
            raise RuntimeError(f"{self.what}: a call is still in flight; finish it before starting the next")
        if len(messages) != self.world_size:
            raise ValueError(f"{self.what}: one message per rank ({self.world_size}), got {len(messages)}")
        messages = [np.asarray(m, dtype=np.int64).reshape(-1) for m in messages]
        peers = [d for d in range(self.world_size) if d != self.rank]
        body = self.capacity - HEADER_WORDS
        longest = max((messages[d].size for d in peers), default=0)
        send = np.zeros((len(peers), self.capacity), dtype=np.int64)
        for row, d in zip(send, peers):
            first = messages[d][:body]
            row[0], row[1] = messages[d].size, longest
            row[HEADER_WORDS:HEADER_WORDS + first.size] = first
        counts = [0 if d == self.rank else self.capacity for d in range(self.world_size)]
        self._pending = Pending(messages, longest, post(torch.from_numpy(send.reshape(-1)), counts, counts,
                                                        self.what), post)
        return self._pending

    def finish(self, pending: Pending) -> list[np.ndarray]:
        """The message each rank sent this one in the call ``pending`` started, by rank."""
        if pending is not self._pending:
            raise RuntimeError(f"{self.what}: finishing a call that is not the one in flight")
        self._pending = None
        messages, longest, post = pending.messages, pending.longest, pending.post
        peers = [d for d in range(self.world_size) if d != self.rank]
        body = self.capacity - HEADER_WORDS
        got = pending.posted.wait().cpu().numpy().reshape(len(peers), self.capacity)
        lengths = dict(zip(peers, got[:, 0].tolist()))
        everyone_longest = max([longest, *got[:, 1].tolist()])
        if everyone_longest > body:  # every rank knows it: each read every sender's longest message
            self.spills += 1
            send_counts = [0 if d == self.rank else max(0, messages[d].size - body) for d in range(self.world_size)]
            recv_counts = [max(0, lengths[s] - body) if s != self.rank else 0 for s in range(self.world_size)]
            spilled = np.concatenate([messages[d][body:] for d in peers]) if peers else np.empty(0, np.int64)
            rest = post(torch.from_numpy(np.ascontiguousarray(spilled, dtype=np.int64)), send_counts,
                        recv_counts, f"{self.what}, spill").wait().cpu().numpy()
            rest = np.split(rest, np.cumsum(recv_counts)[:-1])
        else:
            rest = None
        received = []
        for s in range(self.world_size):
            if s == self.rank:
                received.append(messages[s])
                continue
            row = got[s if s < self.rank else s - 1]  # the chunks come in rank order, none from this rank
            first = row[HEADER_WORDS:HEADER_WORDS + min(lengths[s], body)]
            received.append(np.concatenate([first, rest[s]]) if rest is not None and rest[s].size else first)
        self.capacity = next_capacity(self.capacity, everyone_longest)
        return received
