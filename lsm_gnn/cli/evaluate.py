"""``lsm-gnn evaluate`` and ``lsm-gnn export``: a trained model back from its checkpoint, to measure it on a split
or to write what it learned (every node's embedding; for a user-item dataset each user's top-k items).

The model comes back through the trainer's own resume (:class:`~lsm_gnn.training.trainer.Trainer` with ``resume_from``):
the checkpoint's config, with the caller's overrides on top (a moved dataset, another cache size, the
evaluation's fanouts), and nothing written: no checkpoint, no metrics log, no model selection. A model with node embeddings reads
its table as the checkpoint left it; a table trained further since (its generation has moved on) is refused.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from lsm_gnn.training.checkpoint_files import load_checkpoint
from lsm_gnn.utils.fileio import (
    DirectoryLocked, atomic_write_bytes, check_output_directory, check_output_file, write_json_output,
    write_output_record,
)

#: the file in ``export --out`` that lists what export wrote there, so a later export replaces those files only
EXPORT_RECORD = "export.json"


def restored_trainer(path: str, overrides=(), out=None):
    """A :class:`~lsm_gnn.training.trainer.Trainer` in the state the checkpoint at ``path`` recorded, writing nothing."""
    from lsm_gnn.config import ConfigError, build_config, parse_overrides
    from lsm_gnn.training.trainer import Trainer

    ckpt = load_checkpoint(path)
    if not isinstance(ckpt.get("config"), dict):
        raise ConfigError(f"{path} holds no trainer config: it was not written by 'lsm-gnn train'")
    # checkpoint.dir stays the run's (a node embedding table lives there by default), but nothing is written there
    # and no lock is taken on it, so a run still training there may go on. What is read stays consistent: the
    # checkpoint file is replaced whole by rename and read once; best.pt's table is a copy made before best.pt
    # named it and never written after (a later best gets a copy of its own); last.pt's table is the run's live
    # one, which opening it locks (the table's own lock): refused while that run trains, never read mid-write.
    cfg = build_config(ckpt["config"], *parse_overrides(overrides),
                       {"checkpoint": {"resume": False}, "log": {"dir": "", "progress": False}})
    try:
        return Trainer(cfg, out=out, resume_from=path, evaluation_only=True)
    except DirectoryLocked as exc:  # only a live table's lock is taken here
        raise DirectoryLocked(f"{path} reads its run's live node embedding table, which a run is training ("
                              f"{exc.holder}): evaluate that run's best.pt (its own copy of the table) now, or this "
                              "checkpoint once the run has ended", exc.holder) from None


def evaluate_command(args) -> int:
    if args.json:
        check_output_file(args.json, "--json")
    with restored_trainer(args.checkpoint, args.overrides, out=sys.stderr) as trainer:
        splits = args.split or trainer.task.splits
        missing = [s for s in splits if s not in trainer.task.splits]
        if missing:
            from lsm_gnn.config import ConfigError

            raise ConfigError(f"the dataset has no {missing} split; it has {trainer.task.splits}")
        result = {"checkpoint": os.path.abspath(args.checkpoint), "iterations": trainer.iterations_done}
        for split in splits:
            metrics = trainer.evaluate(split)
            result[split] = metrics
            print(f"{split}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in metrics.items()))
    if args.json:
        write_json_output(args.json, result, "lsm-gnn evaluate", "--json")
    return 0


def export_command(args) -> int:
    import torch

    from lsm_gnn.config import ConfigError
    from lsm_gnn.tasks.options import eval_batch_size, eval_fanouts, loader_options

    outputs = ["embeddings.npy"] + (["top_k.npy", "top_k.csv"] if args.top_k else [])
    check_output_directory(args.out, outputs, "--out", EXPORT_RECORD)  # before the model loads
    with restored_trainer(args.checkpoint, args.overrides, out=sys.stderr) as trainer:
        if trainer.cfg.train.task != "link":
            raise ConfigError("lsm-gnn export writes the node embeddings of a link-prediction model "
                              "(train.task=link); this checkpoint's task is " + trainer.cfg.train.task)
        from lsm_gnn.tasks.link_prediction import embed_nodes

        ds, cfg = trainer.dataset, trainer.cfg
        trainer.model.eval()
        with torch.no_grad():
            emb = embed_nodes(trainer.module, ds, trainer.features, eval_fanouts(cfg, trainer.task.fanouts),
                              np.arange(ds.num_nodes), batch_size=eval_batch_size(cfg), device=trainer.device,
                              **loader_options(cfg, 0, 1, evaluation=True)).float().cpu()
        written = [_save_npy(os.path.join(args.out, "embeddings.npy"), emb.numpy())]
        if args.top_k:
            written += _write_top_k(ds, emb, args.top_k, args.out)
    write_output_record(args.out, [os.path.basename(path) for path in written], "lsm-gnn export", "--out",
                        EXPORT_RECORD)
    for path in written:
        print(f"wrote {path}")
    return 0


def _save_npy(path: str, array: np.ndarray) -> str:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    atomic_write_bytes(buffer.getvalue(), path)
    return path


def _write_top_k(ds, emb, k: int, out: str) -> list[str]:
    """Each user's ``k`` best-scored items it has no interaction with in the dataset (training or held out):
    ``top_k.npy`` ``[users, k]`` item indices (node ``num_users + j`` is item ``j``, best first; -1 where a
    user has fewer candidates), and ``top_k.csv`` with the file's own ids where the dataset has them."""
    import torch

    from lsm_gnn.tasks.inference import row_entries
    from lsm_gnn.tasks.link_prediction import SCORE_CHUNK, _pairs_of, user_item_sizes

    num_users, num_items = user_item_sizes(ds)
    k = min(k, num_items)
    users, items = emb[:num_users], emb[num_users:]
    # Every split's held-out pairs, sorted by user once: each block of users takes its slice by binary search
    # instead of scanning all pairs again.
    held = np.concatenate([np.asarray(ds.edge_split(name)).reshape(-1, 2) for name in ds.edge_split_names]
                          or [np.zeros((0, 2), dtype=np.int64)])
    held = held[np.argsort(held[:, 0], kind="stable")]
    top = np.full((num_users, k), -1, dtype=np.int64)
    chunk = max(1, SCORE_CHUNK // max(1, num_items))
    for start in range(0, num_users, chunk):
        block = np.arange(start, min(start + chunk, num_users))
        known = np.zeros((block.size, num_items), dtype=bool)
        local, neighbours = row_entries(ds.indptr, ds.indices, block)
        keep = neighbours >= num_users
        known[local[keep], neighbours[keep] - num_users] = True
        local, held_items = _pairs_of(held, block)
        known[local, held_items - num_users] = True
        scores = (users[block] @ items.T).masked_fill_(torch.from_numpy(known), float("-inf"))
        values, index = scores.topk(k, dim=1)
        top[block] = np.where(torch.isfinite(values).numpy(), index.numpy(), -1)
    written = [_save_npy(os.path.join(out, "top_k.npy"), top)]
    try:
        from lsm_gnn.data.interactions import id_maps

        user_ids, item_ids = id_maps(ds)
    except KeyError:
        return written
    lines = ["user,rank,item"]
    for u in range(num_users):
        lines += [f"{user_ids[u]},{r + 1},{item_ids[j]}" for r, j in enumerate(top[u]) if j >= 0]
    path = os.path.join(out, "top_k.csv")
    atomic_write_bytes(("\n".join(lines) + "\n").encode(), path)
    return [*written, path]


def add_evaluate_parsers(sub) -> None:
    from lsm_gnn.cli.prepare import parse_count

    evaluate = sub.add_parser("evaluate", help="evaluate a checkpoint on a split",
                              description="Loads the model of a checkpoint written by 'lsm-gnn train' (last.pt or "
                                          "best.pt) and evaluates it; key=value overrides apply on top of the "
                                          "checkpoint's config (e.g. train.eval_fanouts=[-1,-1] dataset=... for a "
                                          "moved or copied dataset with the same checksums); settings the weights "
                                          "depend on (model.kind, model.hidden, sampler.fanouts, ...) stay the "
                                          "checkpoint's")
    evaluate.add_argument("checkpoint", help="a checkpoint file (checkpoint.dir/last.pt or best.pt)")
    evaluate.add_argument("overrides", nargs="*", metavar="key=value")
    evaluate.add_argument("--split", action="append", help="a split to evaluate (repeatable; default: every one)")
    evaluate.add_argument("--json", help="also write the metrics to this file")
    evaluate.set_defaults(func=evaluate_command)
    export = sub.add_parser("export", help="write a link model's embeddings and top-k items per user",
                            description="Loads a link-prediction checkpoint and writes every node's embedding "
                                        "(embeddings.npy) and, with --top-k, each user's best items it has no "
                                        "interaction with (top_k.npy, and top_k.csv with the file's own ids)")
    export.add_argument("checkpoint", help="a checkpoint file (checkpoint.dir/last.pt or best.pt)")
    export.add_argument("overrides", nargs="*", metavar="key=value")
    export.add_argument("--out", required=True,
                        help="folder for the files (made if missing); files of the same names are replaced only "
                             f"where an earlier export wrote them (listed in its {EXPORT_RECORD})")
    export.add_argument("--top-k", type=parse_count, default=0, help="items per user (0: embeddings only)")
    export.set_defaults(func=export_command)
