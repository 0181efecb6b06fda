"""Variable-length messages in padded chunks (lsm_gnn.comm.padded), over an all_to_all simulated by threads."""
import threading

import numpy as np
import pytest
import torch

from lsm_gnn.comm.padded import HEADER_WORDS, MIN_CAPACITY, PaddedAllToAll, next_capacity


class ThreadGroup:
    """``world`` threads that meet in all_to_all_single's semantics: rank s's j-th chunk of ``send`` (sizes
    ``send_counts``) is rank j's s-th chunk of the result; both sides must agree on every size."""

    def __init__(self, world):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.posted = [None] * world
        self.calls = [[] for _ in range(world)]  # (what, elements sent) per rank

    def for_rank(self, rank):
        """``post`` for rank ``rank``: the collective runs at once (every thread meets in it)."""
        def post(send, send_counts, recv_counts, what):
            return Done(all_to_all(send, send_counts, recv_counts, what))

        def all_to_all(send, send_counts, recv_counts, what):
            assert send.dtype == torch.int64 and send.numel() == sum(send_counts)
            self.posted[rank] = (torch.split(send, send_counts), list(send_counts))
            self.calls[rank].append((what, send.numel()))
            self.barrier.wait()
            parts = []
            for s in range(self.world):
                chunks, counts = self.posted[s]
                assert counts[rank] == recv_counts[s], (what, rank, s, counts[rank], recv_counts[s])
                parts.append(chunks[rank])
            self.barrier.wait()
            return torch.cat(parts).clone()
        return post


class Done:
    def __init__(self, received):
        self.received = received

    def wait(self):
        return self.received


def run_rounds(world, rounds):
    """Every rank exchanges ``rounds[k][s][d]`` (rank s's message to d in round k); returns what each rank
    received in each round, the group's calls and each rank's capacities after every round."""
    group = ThreadGroup(world)
    received = [[None] * len(rounds) for _ in range(world)]
    capacity = [[None] * len(rounds) for _ in range(world)]
    errors = []

    def rank_main(rank):
        try:
            padded = PaddedAllToAll(rank, world, "ids")
            for k, messages in enumerate(rounds):
                received[rank][k] = padded.exchange(messages[rank], group.for_rank(rank))
                capacity[rank][k] = padded.capacity
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return received, group.calls, capacity


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_message_arrives_whole_and_a_spill_costs_exactly_one_more_call(world):
    rng = np.random.default_rng(world)
    # Lengths from empty to far over a chunk, so some rounds spill and the capacity grows and shrinks.
    lengths = [0, 1, 7, 500, MIN_CAPACITY - HEADER_WORDS, MIN_CAPACITY - HEADER_WORDS + 1, 6000, 40, 30_000, 3, 0]
    rounds = [[[rng.integers(-2**62, 2**62, n if (s, d) == (0, 1) else int(rng.integers(0, n + 1)))
                for d in range(world)] for s in range(world)] for n in lengths]  # 0 -> 1 gets the longest
    received, calls, capacity = run_rounds(world, rounds)
    for k, messages in enumerate(rounds):
        for r in range(world):
            for s in range(world):
                assert np.array_equal(received[r][k][s], messages[s][r]), (k, r, s)
        assert len({c[k] for c in capacity}) == 1, "ranks disagree on the next chunk"
    whats = [w for w, _ in calls[0]]
    assert all([w for w, _ in c] == whats for c in calls), "ranks made different collectives"
    spills = whats.count("ids, spill")
    assert whats.count("ids") == len(lengths)
    longest = [max((m.size for s, row in enumerate(msgs) for d, m in enumerate(row) if s != d), default=0)
               for msgs in rounds]
    chunk = [MIN_CAPACITY] + capacity[0][:-1]
    assert spills == sum(n > c - HEADER_WORDS for n, c in zip(longest, chunk)) and (world == 1 or spills >= 2)


def test_the_capacity_follows_the_longest_message_within_bounds():
    assert next_capacity(MIN_CAPACITY, 0) == MIN_CAPACITY
    assert next_capacity(10_000, 10_000) == HEADER_WORDS + 15_000  # room for the longest plus half
    assert next_capacity(MIN_CAPACITY, 10**6) == 4 * MIN_CAPACITY  # one long message grows it at most 4x
    assert next_capacity(100_000, 10) == 50_000  # and it shrinks at most 2x a call


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one message per rank"):
        PaddedAllToAll(0, 2, "ids").exchange([np.zeros(1, np.int64)], lambda *a: None)
    with pytest.raises(ValueError, match="header"):
        PaddedAllToAll(0, 2, "ids", capacity=2)


def test_a_started_call_must_be_finished_before_the_next_starts():
    """The next chunk's size comes from the call in flight: a second start before its finish is refused."""
    group = ThreadGroup(1)
    padded = PaddedAllToAll(0, 1, "ids")
    post = group.for_rank(0)
    first = padded.start([np.arange(5)], post)
    with pytest.raises(RuntimeError, match="still in flight"):
        padded.start([np.arange(3)], post)
    assert [m.tolist() for m in padded.finish(first)] == [list(range(5))]
    with pytest.raises(RuntimeError, match="not the one in flight"):
        padded.finish(first)
    assert [m.tolist() for m in padded.exchange([np.arange(2)], post)] == [[0, 1]]
