"""A trainer's checkpoint: ``last.pt`` holds everything needed to continue exactly where the run stopped (model,
optimizer, loader position, every rank's RNG, the epoch's accumulators, the evaluations and the selection, the
log's length), and with node embeddings the generation of the table it pairs with. Writes are atomic
(:func:`lsm_gnn.training.checkpoint_files.atomic_torch_save`): a kill leaves the previous checkpoint whole."""
from __future__ import annotations

import os
import shutil
import time

import torch

from lsm_gnn.config import Config, ConfigError
from lsm_gnn.training.checkpoint_files import (CheckpointError, atomic_torch_save, load_checkpoint,
                                remove_stale_checkpoint_temporaries)
from lsm_gnn.utils.fileio import contained_path

# Settings a resumed run must share with the checkpoint, or its losses would differ.
RESUME_KEYS = ("dataset", "model", "sampler", "train.task", "train.seed", "train.lr", "train.weight_decay",
               "train.embedding_l2")
# What a model evaluated (lsm-gnn evaluate, export) must share with its checkpoint: the weights' shapes and meaning
# (a type's own table settings are checked against the table when it opens). The rest (seed, learning rate, batch
# size, threads, a cache's capacity, where a table lies) shapes training or speed only: an override is taken.
EVALUATION_KEYS = ("dataset", "model.kind", "model.hidden", "model.heads", "model.node_embedding.dim",
                   "model.node_embedding.dtype", "model.node_embedding.optimizer", "model.node_embedding.features",
                   "sampler.fanouts", "train.task")


def dataset_identity(meta: dict) -> dict:
    """What makes a dataset the same one wherever it lies: its data files' checksums. The block-sums file is left
    out: it follows from the others, and ``prepare checksums`` gives it a new name."""
    blocks = meta.get("block_checksums") or {}
    return {name: crc for name, crc in meta.get("checksums", {}).items() if name != blocks.get("file")}


def _with_defaults(saved: dict, defaults: dict) -> dict:
    """``saved`` with every key it lacks taken from ``defaults``, recursively."""
    out = dict(saved)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _with_defaults(out[key], value)
    return out


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


def rng_state() -> dict:
    """This process's generators (torch's, and CUDA's where there is one)."""
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def saved_embeddings(saved: dict | None, dataset) -> dict:
    """The node embeddings' state per node type a checkpoint recorded (one written before node types had tables
    of their own kept its one-type graph's under ``embedding``)."""
    if not saved:
        return {}
    if "embeddings" in saved:
        return dict(saved["embeddings"])
    return {dataset.node_types[0]: saved["embedding"]} if saved.get("embedding") else {}


class Checkpointer:
    """Writes and restores ``trainer``'s checkpoints (``checkpoint.dir/last.pt``; None: no checkpoint.dir).

    It reads the trainer's parts as they are at each call: ``cfg``, ``module``, ``optimizer``, ``loader``,
    ``iterations_done``, ``history``, ``epoch_state``, ``selection``, ``log``, ``embeddings`` and ``ranks``.
    """

    def __init__(self, trainer, directory: str):
        self.trainer = trainer
        self.directory = directory
        self.path = os.path.join(directory, "last.pt") if directory else None

    def saved(self, resume: bool) -> dict | None:
        """The checkpoint this run resumes from: ``last.pt`` where ``resume`` and it exists, else None."""
        if not (self.path and resume and os.path.lexists(self.path)):
            return None
        contained_path(self.directory, "last.pt", CheckpointError,
                       fix="resume from checkpoint.dir's own last.pt: copy the file there instead of linking it")
        return load_checkpoint(self.path)

    def remove_stale_temporaries(self, *paths: str | None) -> None:
        """The temporaries a killed write left beside these checkpoints (rank 0, the only writer)."""
        for path in paths:
            if path:
                remove_stale_checkpoint_temporaries(path)

    def rng_by_rank(self) -> list[dict]:
        """Every rank's generators, for rank 0's checkpoint: each rank draws its own dropout masks, so a resume
        that gave every rank rank 0's state trained on other masks (losses off by 1e-4 from the next step)."""
        t = self.trainer
        return t.ranks.gather(rng_state(), f"the checkpoint after iteration {t.iterations_done}")

    def state_dict(self, rng_by_rank: list[dict] | None = None) -> dict:
        """The trainer's state as a checkpoint holds it; ``rng_by_rank`` (every rank's generators, which
        :meth:`save` gathers) defaults to this process's alone."""
        t = self.trainer
        rng_by_rank = rng_by_rank or [rng_state()]
        return {"config": t.cfg.to_dict(), "model": t.module.state_dict(),
                "optimizer": t.optimizer.state_dict(), "loader": t.loader.state_dict(),
                "iterations_done": t.iterations_done, "history": t.history, "epoch_state": t.epoch_state,
                "evaluations": t.selection.evaluations, "selection": t.selection.state,
                "log_offset": t.log.offset(), "rng": rng_by_rank[0], "rng_by_rank": rng_by_rank,
                "world_size": t.world_size, "time": time.time(),
                "dataset_checksums": dataset_identity(t.dataset.meta)}

    def save(self, path: str | None = None) -> str | None:
        """Writes the checkpoint to ``path`` (default ``last.pt``), every rank together; the path, or None."""
        t = self.trainer
        path = path or self.path
        if path is None:
            return None
        rng_by_rank = self.rng_by_rank()  # a collective: every rank saves together
        if not t.embeddings:
            if t.rank == 0:
                atomic_torch_save(self.state_dict(rng_by_rank), path)
            return path
        # Every rank's dirty rows on disk first; then the checkpoint names each table's next generation, and only
        # then does each table take it (a crash in between: each table is rolled forward or back to match last.pt).
        for embedding in t.embeddings.values():
            embedding.flush()
        t.ranks.barrier()
        if path != self.path:
            # best.pt: the tables as they are now, each copied into a directory of its own beside it. The run's
            # tables keep their generations and journals (last.pt's): a kill before the next last.pt still rolls
            # them back.
            if t.rank == 0:
                state = self.state_dict(rng_by_rank)
                names = {node_type: self._snapshot_table(path, node_type, embedding)
                         for node_type, embedding in t.embeddings.items()}
                state["embeddings"] = {node_type: {**embedding.state_dict(), "snapshot": names[node_type]}
                                       for node_type, embedding in t.embeddings.items()}
                atomic_torch_save(state, path)
                self._remove_old_snapshots(path, keep=set(names.values()))
            t.ranks.barrier()
            return path
        if t.rank == 0:
            state = self.state_dict(rng_by_rank)
            state["embeddings"] = {node_type: {**embedding.state_dict(), "generation": embedding.table.generation + 1}
                                   for node_type, embedding in t.embeddings.items()}
            atomic_torch_save(state, path)
        for embedding in t.embeddings.values():
            self.commit_table(embedding, embedding.table.generation + 1)
        return path

    def _snapshot_table(self, path: str, node_type: str, embedding) -> str:
        """Copies ``node_type``'s flushed table beside ``path`` (a checkpoint that is not last.pt), named after it,
        the node type (on a typed graph), the table's generation and the iteration (two better evaluations can
        share a generation); returns the name, which the checkpoint records (relative: the folder may move)."""
        from lsm_gnn.storage.table import snapshot_table

        stem = os.path.splitext(os.path.basename(path))[0]
        whose = "" if embedding.node_type is None else f".{embedding.node_type}"
        generation = embedding.table.generation
        base = f"{stem}_node_embedding{whose}.g{generation}-i{self.trainer.iterations_done}"
        name, copies = base, 1
        # A resumed run redoing the same evaluation finds that name taken (perhaps by the best.pt on disk, which
        # must keep its table until it is replaced): the next free one.
        while os.path.lexists(os.path.join(os.path.dirname(os.path.abspath(path)), name)):
            copies += 1
            name = f"{base}.{copies}"
        snapshot_table(embedding.table.path, os.path.join(os.path.dirname(os.path.abspath(path)), name), generation)
        return name

    def _remove_old_snapshots(self, path: str, keep: set[str]) -> None:
        """The copies of earlier generations ``path`` no longer names (it was replaced first: a crash between
        leaves one more copy, never a checkpoint without its table)."""
        folder = os.path.dirname(os.path.abspath(path))
        prefix = f"{os.path.splitext(os.path.basename(path))[0]}_node_embedding."
        for name in os.listdir(folder):
            if name.startswith(prefix) and name not in keep:
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)

    def commit_table(self, embedding, generation: int) -> None:
        """``embedding``'s table's generation recorded (rank 0) and every rank's undo journal started afresh
        for it."""
        t = self.trainer
        t.ranks.barrier()
        if t.rank == 0:
            embedding.table.set_generation(generation)
        t.ranks.barrier()
        embedding.table.reset_journal(generation)

    def resume(self, path: str, ckpt: dict | None = None) -> dict:
        """Puts the trainer back in the state ``path`` (``ckpt``, when already loaded) recorded; returns that."""
        t = self.trainer
        ckpt = load_checkpoint(path) if ckpt is None else ckpt
        self._check_fits(path, ckpt)
        try:
            t.module.load_state_dict(ckpt["model"])
            t.optimizer.load_state_dict(ckpt["optimizer"])
            if not t.evaluation_only:  # where the training batches stand: evaluation draws none of them
                t.loader.load_state_dict(ckpt["loader"])
            # This rank's own generators (checkpoints before lsm-gnn 0.3 kept rank 0's only).
            rng = ckpt["rng_by_rank"][t.rank] if "rng_by_rank" in ckpt else ckpt["rng"]
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
            t.iterations_done = int(ckpt["iterations_done"])
            t.history = list(ckpt["history"])
            states = saved_embeddings(ckpt, t.dataset)
            for node_type, embedding in t.embeddings.items():
                embedding.steps = int(states[node_type]["steps"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"cannot resume from {path}: its state does not fit this run ({exc}); start "
                                  "fresh with checkpoint.resume=false or another checkpoint.dir") from None
        t.epoch_state = ckpt.get("epoch_state")
        t.selection.restore(ckpt)
        t.log.rewind(ckpt.get("log_offset"))  # what was logged after the checkpoint is redone
        t.resumed_from = path
        return ckpt

    def _check_same_dataset(self, path: str, ckpt: dict, saved_path: str) -> None:
        """A dataset at another path than the checkpoint's (moved, copied, or spelled otherwise) is the same one
        when its files' checksums equal those the checkpoint recorded (or, for a checkpoint before they were
        recorded, those of the dataset still at the saved path)."""
        t = self.trainer
        recorded = ckpt.get("dataset_checksums")
        if recorded is None:
            from lsm_gnn.data import open_dataset

            try:
                recorded = dataset_identity(open_dataset(saved_path, check="shape").meta)
            except (OSError, ValueError):
                recorded = {}
        now = dataset_identity(t.dataset.meta)
        if recorded and recorded == now:
            return
        why = ("its files differ from those it was trained on (their checksums in meta.json)" if recorded else
               f"the checkpoint records no checksums of its dataset and {saved_path} cannot be read to compare")
        raise ConfigError(f"{path} was trained on dataset {saved_path}; dataset={t.cfg.dataset} is not the same "
                          f"dataset: {why}. Give dataset= that dataset or a copy of it")

    def _check_fits(self, path: str, ckpt: dict) -> None:
        """Refuses a checkpoint of other settings (its losses would differ) or of another number of ranks."""
        t = self.trainer
        try:
            # Keys added to the config since the checkpoint was written count with their defaults.
            saved, now = _with_defaults(ckpt["config"], Config().to_dict()), t.cfg.to_dict()
            keys = EVALUATION_KEYS if t.evaluation_only else RESUME_KEYS
            differ = [k for k in keys if _lookup(saved, k) != _lookup(now, k)]
            world_size = ckpt["world_size"]
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"{path} lacks the trainer state ({exc!r} is missing); it was not written by "
                                  "the lsm-gnn trainer") from None
        if "dataset" in differ:
            self._check_same_dataset(path, ckpt, _lookup(saved, "dataset"))
            differ.remove("dataset")
        if differ:
            detail = "; ".join(f"{k}: saved {_lookup(saved, k)!r}, now {_lookup(now, k)!r}" for k in differ)
            if t.evaluation_only:
                raise ConfigError(f"cannot evaluate {path} with other settings of its model ({detail}): the weights "
                                  "were trained for the saved ones; drop those overrides")
            raise ConfigError(f"cannot resume from {path}: the run's settings changed ({detail}). Use the saved "
                              "settings, or start fresh with checkpoint.resume=false or another checkpoint.dir")
        if world_size != t.world_size:
            raise ConfigError(f"{path} was written by {world_size} ranks; this run has {t.world_size}")
