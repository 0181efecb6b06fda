"""Trainable node embeddings: rows of an on-disk table, read and updated through the feature path.

A :class:`NodeEmbedding` holds the writable :class:`~lsm_gnn.features.Features` over the table (the table
itself, the write-back cache over it, or the shared cache over ranks), the row format and the row-wise
optimizer. Per training iteration:

1. the loader reads the batch's input nodes' rows like features (:meth:`NodeEmbedding.read`, through the
   source's ``gather``: lookups, misses, write-back of dirty victims) and hands the embeddings to the model as
   ``batch.emb``;
2. after backward, :meth:`NodeEmbedding.step` sums the gradient per node and the owner of each row applies the
   optimizer to it in its cache line (``update``), which becomes dirty;
3. a checkpoint flushes every dirty line and syncs the table (:meth:`NodeEmbedding.flush`); the trainer then
   records the table's new generation.

The embeddings keep their own order: a training read (``training=True``) waits until every earlier training
read's batch was stepped, so every batch reads the rows exactly as a dense embedding trained on the same
batches would hold them, however far ahead the loader samples. Reading, stepping and flushing take turns on
one lock, so a checkpoint's flush never meets a lookup of the next batch, and each read's I/O counts are
its own. :meth:`settle` forgets batches read that will not be stepped (an epoch cut short).
"""
from __future__ import annotations

import os
import threading
import time

import torch

from lsm_gnn.config import ConfigError
from lsm_gnn.embedding.rows import RowLayout, RowOptimizer, initial_rows
from lsm_gnn.storage import EmbeddingTable
from lsm_gnn.utils.ids import as_id_tensor, unique_ids


def open_table(path: str, layout: RowLayout, num_rows: int, *, seed: int, init_std: float, rank: int = 0,
               world_size: int = 1, generation: int | None = None, barrier=lambda: None,
               progress: bool = False) -> EmbeddingTable:
    """The embedding table at ``path`` for this rank, as a run needs it.

    Resuming (``generation``: what the checkpoint recorded), rank 0 rolls the table back or forward to that
    generation. Starting fresh (None), a missing table is made (``N(0, init_std^2)`` rows seeded by ``seed``)
    and an existing one must be untrained (generation 0, after rolling back what a run left unfinished):
    a trained table is never silently trained again from scratch. The other ranks open it after ``barrier``.
    """
    fresh = generation is None
    if rank == 0:
        if not os.path.exists(path):
            if not fresh:
                raise ConfigError(f"the checkpoint was trained with the node embedding table {path}, which is gone; "
                                  "restore it, or start fresh with checkpoint.resume=false or another checkpoint.dir")
            EmbeddingTable.create(path, num_rows, layout.row_bytes, layout=layout.as_dict(), progress=progress,
                                  init=lambda start, stop: initial_rows(layout, start, stop, seed=seed,
                                                                        std=init_std)).close()
        table = EmbeddingTable.open(path, rank=0, expect_generation=generation, recover=True, world_size=world_size)
    barrier()
    if rank != 0:
        table = EmbeddingTable.open(path, rank=rank, expect_generation=generation, recover=False)
    try:
        have = RowLayout.from_dict(table.layout)
    except (KeyError, TypeError, ValueError) as exc:
        table.close()
        raise ConfigError(f"{path} holds no node embedding table of lsm-gnn ({exc}); point "
                          "model.node_embedding.path elsewhere") from None
    if have != layout or table.num_rows != num_rows:
        table.close()
        raise ConfigError(f"{path} holds {table.num_rows:,} embeddings of {have.dim} {have.dtype} values for "
                          f"{have.optimizer}; this run asks for {num_rows:,} of {layout.dim} {layout.dtype} for "
                          f"{layout.optimizer}: point model.node_embedding.path elsewhere or match its settings")
    if fresh and table.generation != 0:
        table.close()
        raise ConfigError(f"{path} was trained already (generation {table.generation}) and this run starts fresh; "
                          "resume the run that trained it (its checkpoint.dir), or delete the table or point "
                          "model.node_embedding.path elsewhere to train new embeddings")
    return table


class NodeEmbedding:
    """The trainable embeddings of every node, ``layout.dim`` values each.

    ``source`` is a writable Features over ``table`` (rows of ``layout.row_bytes`` bytes); ``cache`` is the
    software cache inside it, if any (for its write-back counters); ``world_size`` ranks average their
    gradients as DDP does for dense parameters. ``steps`` counts optimizer steps taken (Adam's bias correction).
    """

    def __init__(self, source, layout: RowLayout, optimizer: RowOptimizer, *, table=None, cache=None,
                 world_size: int = 1, steps: int = 0, node_type: str | None = None):
        if not getattr(source, "writable", False):
            raise TypeError(f"node embeddings need a writable source (an embedding table or a cache over one), got "
                            f"{type(source).__name__}")
        self.source, self.layout, self.optimizer = source, layout, optimizer
        self.table, self.cache, self.world_size = table, cache, int(world_size)
        self.steps = int(steps)
        self.node_type = node_type  # whose rows these are (on a graph of several types), for what it prints
        self._unstepped = 0  # training reads not yet stepped; the next one waits for 0
        self._turn = threading.Condition()
        self._lock = threading.RLock()  # read, step and flush use the source one at a time

    @property
    def dim(self) -> int:
        return self.layout.dim

    def describe(self) -> str:
        whose = f"{self.node_type} " if self.node_type else ""
        return (f"{whose}node embeddings of {self.dim} {self.layout.dtype} values with row-wise {self.layout.optimizer} "
                f"({self.layout.row_bytes} bytes a row) from {self.source.describe()}")

    # -- the order of gathers and updates ----------------------------------------------------------------------

    def _take_turn(self, stop: threading.Event | None) -> bool:
        """Waits until every earlier training read was stepped, then counts this one; False if ``stop`` is set
        meanwhile."""
        with self._turn:
            while self._unstepped:
                if stop is not None and stop.is_set():
                    return False
                self._turn.wait(0.05)
            self._unstepped += 1
        return True

    def _stepped(self) -> None:
        with self._turn:
            self._unstepped = max(0, self._unstepped - 1)
            self._turn.notify_all()

    def settle(self) -> None:
        """Joins the source's background work and forgets training reads that will not be stepped (a loader
        that stopped with batches it read ahead)."""
        self.source.settle()
        with self._turn:
            self._unstepped = 0
            self._turn.notify_all()

    # -- reading and updating --------------------------------------------------------------------------------

    def _io(self) -> dict:
        """This process's reads of the table and writes to it so far: misses, before-images for the journal,
        write-backs and rows written in place (the table's own counters; a shared cache's other slices are
        other processes')."""
        if self.table is None:
            return {"embedding_bytes_read": self.source.counters()["bytes_read"], "embedding_bytes_written": 0}
        return {"embedding_bytes_read": self.table.stats().bytes_read,
                "embedding_bytes_written": self.table.write_counters()["bytes_written"]}

    def _since(self, before: dict) -> dict:
        after = self._io()
        return {key: after[key] - before[key] for key in after}

    def read(self, nodes, future=None, *, training: bool = False, stop: threading.Event | None = None):
        """(float32 embeddings ``[len(nodes), dim]``, seconds by stage, bytes read and written, and with a cache
        its hits among the rows) of ``nodes``.
        ``training``: the batch will be stepped (:meth:`step`), so this waits until the batches read for
        training before it were; returns None if ``stop`` is set meanwhile."""
        if training and not self._take_turn(stop):
            return None
        with self._lock:
            before = self._io()
            start = time.perf_counter()
            rows, hit = self.source.gather(as_id_tensor(nodes), future=future)
            emb = self.layout.embeddings(rows)
            timings = {"embedding": time.perf_counter() - start}
            if self.cache is not None:
                timings["write-back"] = self.cache.last_timings.get("write-back", 0.0)
            io = self._since(before)
            if self.source.caches:  # the table's cache: its hits among the batch's rows, for the run's log
                io.update(embedding_hits=int(hit.sum()), embedding_rows=hit.numel())
            return emb, timings, io

    def step(self, nodes, grad: torch.Tensor) -> dict:
        """Applies one optimizer step to the rows of ``nodes`` (repeats allowed) given ``grad`` (``[len(nodes),
        dim]``: the gradient of this rank's loss): summed per node, averaged over ranks, at each row's owner.
        Collective over ranks: every rank steps once per iteration. Returns the table bytes it read and wrote
        (rows the cache holds none of are read and written in place)."""
        with self._lock:
            io = self._step(nodes, grad)
        self._stepped()
        return io

    def _step(self, nodes, grad: torch.Tensor) -> dict:
        before = self._io()
        nodes = as_id_tensor(nodes)
        unique, inverse = unique_ids(nodes)
        summed = torch.zeros((unique.numel(), self.dim), dtype=torch.float32)
        summed.index_add_(0, inverse, grad.detach().float().cpu())
        self.steps += 1
        step, scale = self.steps, 1.0 / self.world_size

        def apply(rows: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
            return self.optimizer.step(rows, grads * scale if self.world_size > 1 else grads, step)

        self.source.update(unique, summed, apply)
        return self._since(before)

    def flush(self) -> float:
        """Writes every dirty row this rank holds to the table and syncs it (before a checkpoint records the
        table's generation); returns the seconds it took."""
        with self._lock:
            start = time.perf_counter()
            self.source.flush()
            if self.table is not None:
                self.table.sync()
            return time.perf_counter() - start

    def close(self) -> None:
        """Joins background work and closes the table (flush first to keep what is dirty)."""
        self.source.settle()
        if self.table is not None:
            self.table.close()

    def state_dict(self) -> dict:
        return {"steps": self.steps, "layout": self.layout.as_dict(), "optimizer": self.optimizer.state_dict(),
                "generation": None if self.table is None else self.table.generation}
