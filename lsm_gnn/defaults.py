"""The one table of defaults shared by the layers and the config.

Every layer's signature and the config schema (:mod:`lsm_gnn.config`) take
their default from here, so a default changes in one place. Values are the
paper's settings unless a measurement (``docs/benchmarks/README.md``) chose better.
"""
from __future__ import annotations

WAYS = 32                    # lines per cache set (the paper's 32-way cache)
WINDOW = 256                 # future mini-batches sampled ahead into the window buffer
PERIOD = 4                   # the window is scanned every PERIOD iterations
# All victim queues' memory, as a share of the cache's bytes. At equal memory a plain cache beat PVP at every
# measured size (docs/benchmarks/pvp.md, "PVP against a cache of the same bytes"), so the queues get a bounded
# quarter; the paper's 16,384 lines per queue reserved 70-280x the cache itself.
PVP_QUEUE_BYTES = "25%"
CAPACITY = "1.5%"            # cache size: a share of the nodes, or bytes ("4G")
FANOUTS = (5, 2, 2, 2)       # neighbors per hop, next to the seeds first
BATCH_SIZE = 2048            # seed nodes per mini-batch
# Batches whose misses a cache reads ahead (from a disk, on the CPU): the next one's, topped up after each
# lookup, and the one after, so the disk has a batch to read while the first is taken (docs/benchmarks/pipeline.md,
# "Read-ahead"); at most READ_AHEAD_BYTES of rows held: auto is READ_AHEAD_MAX_BYTES, or an eighth of the
# memory still available when the cache starts where that is less (a run under a tight memory cap).
READ_AHEAD_DEPTH = 2
READ_AHEAD_BYTES = "auto"
READ_AHEAD_MAX_BYTES = 64 << 20
READ_AHEAD_MEMORY_SHARE = 1 / 8
# Below this much memory available at the start, auto leaves what only speeds a run up off: read-ahead (its
# thread's reads cost about 40 MiB more than its budget in malloc's per-thread arenas, which a run under a 400 MiB
# cap did not have) and the preloaded topology (an anonymous copy, where the mapped file's pages can be reclaimed;
# under a 400 MiB cap a 26 MiB copy left the run 15 MiB from an OOM kill).
AUTO_MIN_ROOM = 256 << 20
# How the sampler reads a memory-mapped topology (lsm_gnn.sampling.neighbor.advise_mapped); auto preloads one
# (copies it into memory on huge pages) that takes at most a quarter of the memory left, with AUTO_MIN_ROOM left at
# least, else reads it at random.
TOPOLOGY_ACCESS = ("auto", "random", "normal", "preload")


def policy_for(pvp: bool) -> str:
    """The eviction policy used when none is named: the best measured with and without PVP (farthest for
    both). With PVP it beat hybrid_pvp_room at every size (docs/benchmarks/pvp.md, PVP section), and since it
    does not read the queues, reinstalling PVP leaves its decisions exactly as without PVP."""
    del pvp  # one policy for both today; the argument keeps callers honest if they differ again
    return "farthest"
