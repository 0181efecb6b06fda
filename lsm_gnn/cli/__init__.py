"""The `lsm-gnn` command: prepare | train | plan | inspect | bench."""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from lsm_gnn.utils.fileio import check_output_file, write_json_output
from lsm_gnn.utils.units import format_bytes


def _inspect(args) -> int:
    if os.path.isfile(args.path):
        return _inspect_checkpoint(args)
    from lsm_gnn.cli.prepare import format_interactions, shown_by_type, user_item_counts
    from lsm_gnn.data import open_dataset

    ds = open_dataset(args.path, check="fast")
    if args.verify:
        # Checksums first: a file changed since it was written is named as such before the value scan.
        ds.verify_checksums()
        ds = open_dataset(args.path, check="full")
    if shown_by_type(ds):
        return _inspect_typed(ds, args)
    f = ds.features
    summary = {
        "path": ds.path, "name": ds.name, "schema_version": ds.meta["version"],
        "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
        "degree": _degrees(ds.indptr),
        "features": {"dim": f.dim, "dtype": f.dtype, "row_bytes": f.row_bytes, "row_stride": f.row_stride,
                     "file_bytes": f.file_bytes},
        "num_classes": ds.num_classes(),
        "splits": {name: int(ds.split(name).shape[0]) for name in ds.split_names()},
        "scores": ds.score_names(),
        "generator": ds.meta.get("generator"),
    }
    user_item = user_item_counts(ds)
    if user_item is not None:
        summary.update(user_item)
    if _printed_json(summary, args):
        return 0
    print(f"dataset   {ds.name}  ({ds.path})")
    print(f"nodes     {ds.num_nodes:,}   edges {ds.num_edges:,}   degree mean {summary['degree']['mean']:.2f} "
          f"max {summary['degree']['max']:,}   isolated {summary['degree']['zero']:,}")
    packed = f" ({f.rows_per_block} rows per 512 B block)" if f.rows_per_block > 1 else ""
    print(f"features  dim {f.dim} {f.dtype}, row {f.row_bytes} B, stride {f.row_stride} B{packed}, "
          f"file {format_bytes(f.file_bytes)}")
    if user_item is not None:
        print(f"users     {user_item['num_users']:,}   items {user_item['num_items']:,}   interactions "
              f"{format_interactions(user_item['interactions'])} (train: the users' CSR rows)")
    print(f"labels    {ds.num_classes()} classes" if ds.num_classes() is not None else "labels    none")
    print("splits    " + (", ".join(f"{k} {v:,}" for k, v in summary["splits"].items()) or "none"))
    print("scores    " + (", ".join(summary["scores"]) or "none"))
    if args.verify:
        print("checksums ok")
    return 0


def _printed_json(summary: dict, args) -> bool:
    """Records a passed ``--verify`` in ``summary`` and, with ``--json``, prints it (True: nothing else to print)."""
    if args.verify:
        summary["checksums"] = "ok"
    if args.json:
        print(json.dumps(summary, indent=2))
    return bool(args.json)


def _degrees(indptr, chunk: int = 1 << 22) -> dict:
    """Mean, max and zero count of the row lengths, read in chunks of the (mapped) indptr: memory stays
    bounded whatever the node count."""
    num_rows = indptr.shape[0] - 1
    if num_rows <= 0:
        return {"mean": 0.0, "max": 0, "zero": 0}
    largest, zero = 0, 0
    for start in range(0, num_rows, chunk):
        degrees = np.diff(np.asarray(indptr[start:start + chunk + 1]))
        largest, zero = max(largest, int(degrees.max())), zero + int((degrees == 0).sum())
    return {"mean": float(int(indptr[-1]) - int(indptr[0])) / num_rows, "max": largest, "zero": zero}


def _inspect_typed(ds, args) -> int:
    """``inspect`` of a graph of several node types or relations: per node type and per relation."""
    from lsm_gnn.data.dataset import relation_key

    types = {}
    for t in ds.node_types:
        f = ds.node_type(t).features
        types[t] = {"num_nodes": ds.num_nodes_of(t),
                    "features": None if f is None else {"dim": f.dim, "dtype": f.dtype, "row_bytes": f.row_bytes,
                                                        "row_stride": f.row_stride, "file_bytes": f.file_bytes},
                    "num_classes": ds.num_classes(t),
                    "splits": {name: int(ds.split(name, t).shape[0]) for name in ds.split_names(t)},
                    "scores": ds.score_names(t)}
    relations = {relation_key(r): {"num_edges": ds.num_edges_of(r), "degree": _degrees(ds.csr(r)[0])}
                 for r in ds.relations}
    summary = {"path": ds.path, "name": ds.name, "schema_version": ds.meta["version"], "target": ds.target,
               "num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "node_types": types,
               "relations": relations, "generator": ds.meta.get("generator")}
    if _printed_json(summary, args):
        return 0
    print(f"dataset   {ds.name}  ({ds.path}), heterogeneous: {len(types)} node types, {len(relations)} relations")
    print(f"nodes     {ds.num_nodes:,}   edges {summary['num_edges']:,}   target {ds.target or 'none'}")
    for t, info in types.items():
        f = info["features"]
        feats = "no features" if f is None else f"features {f['dim']} {f['dtype']} ({format_bytes(f['file_bytes'])})"
        labels = f", {info['num_classes']} classes" if info["num_classes"] is not None else ""
        splits = "".join(f", {k} {v:,}" for k, v in info["splits"].items())
        print(f"  {t:<14} {info['num_nodes']:>12,} nodes, {feats}{labels}{splits}; scores: "
              f"{', '.join(info['scores']) or 'none'}")
    for key, info in relations.items():
        d = info["degree"]
        print(f"  {key:<36} {info['num_edges']:>12,} edges, in-degree mean {d['mean']:.2f} max {d['max']:,}")
    if args.verify:
        print("checksums ok")
    return 0


def _inspect_checkpoint(args) -> int:
    from lsm_gnn.training.checkpoint_files import CHECKPOINT_VERSION, CheckpointError, load_checkpoint

    ckpt = load_checkpoint(args.path)
    try:
        cfg, loader = ckpt["config"], ckpt["loader"]
        params = sum(int(np.prod(t.shape)) for t in ckpt["model"].values())
        last = ckpt["history"][-1] if ckpt["history"] else {}
        summary = {"path": args.path, "version": ckpt.get("version", CHECKPOINT_VERSION), "dataset": cfg["dataset"],
                   "task": cfg["train"]["task"], "model": cfg["model"], "fanouts": cfg["sampler"]["fanouts"],
                   "batch_size": cfg["sampler"]["batch_size"], "parameters": params,
                   "world_size": ckpt["world_size"], "iterations_done": ckpt["iterations_done"],
                   "next_epoch": loader["epoch"], "next_position": loader["position"],
                   "last_epoch": {k: v for k, v in last.items() if k != "stages_s"}}
        m = cfg["model"]
        lines = [f"checkpoint {args.path} (version {summary['version']}, checksum verified)",
                 f"dataset    {cfg['dataset']}   task {cfg['train']['task']}",
                 f"model      {m['kind']} hidden {m['hidden']}, {len(cfg['sampler']['fanouts'])} layers, "
                 f"{params:,} parameters",
                 f"sampler    fanouts {cfg['sampler']['fanouts']}, batch {cfg['sampler']['batch_size']}",
                 f"progress   {ckpt['iterations_done']} iterations on {ckpt['world_size']} rank(s); resumes at "
                 f"epoch {loader['epoch']}, batch {loader['position']}"]
        if last:
            evals = ", ".join(f"{s} {next(iter(last[s].items()))[0]} {next(iter(last[s].items()))[1]:.4f}"
                              for s in ("val", "test") if s in last)
            lines.append(f"last epoch {last['epoch']}: loss {last['loss']:.4f}" + (f", {evals}" if evals else ""))
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        raise CheckpointError(f"{args.path} is an lsm-gnn checkpoint without a trainer state ({exc!r} is missing "
                              "or malformed); it was not written by 'lsm-gnn train'") from None
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print("\n".join(lines))
    return 0


def _train(args) -> int:
    from lsm_gnn.config import load_config, load_grid
    from lsm_gnn.training.trainer import train

    overrides = list(args.overrides)
    if args.json:  # fail before training, not after it
        check_output_file(args.json, "--json")
    if args.config and "=" in args.config and not os.path.exists(args.config):
        overrides.insert(0, args.config)  # no config file, only overrides
        args.config = None
    if args.grid:
        runs = load_grid(args.config, overrides)
        results = []
        for i, (assignment, cfg) in enumerate(runs):
            print(f"\n== run {i + 1}/{len(runs)}: " + ", ".join(f"{k}={v}" for k, v in assignment.items()))
            result = train(cfg)
            last = result["history"][-1] if result["history"] else {}
            results.append({"settings": assignment, "wall_s": result["wall_s"], "stages_s": result["stages_s"],
                            "hit_ratio": last.get("hit_ratio"), "bytes_read": last.get("bytes_read"),
                            "eval": result["eval"]})
        print(f"\n{'run':<50}{'hit ratio':>10}{'wall s':>9}")
        for r in results:
            name = ", ".join(f"{k}={v}" for k, v in r["settings"].items())
            hit = "-" if r["hit_ratio"] is None else f"{r['hit_ratio']:.3f}"
            print(f"{name:<50}{hit:>10}{r['wall_s']:>9.1f}")
        if args.json:
            write_json_output(args.json, {"runs": results}, "lsm-gnn train --grid", "--json")
        return 0
    result = train(load_config(args.config, overrides))
    if args.json:
        write_json_output(args.json, result, "lsm-gnn train", "--json")
    return 0


def _bench_storage(args) -> int:
    from lsm_gnn.cli.prepare import shown_by_type
    from lsm_gnn.data import open_dataset
    from lsm_gnn.storage.probe import probe_backend

    if args.json:
        check_output_file(args.json, "--json")
    ds = open_dataset(args.path, check="fast")
    # A feature file per node type, each measured on its own (named when there are several).
    files = [(t if shown_by_type(ds) else None, ds.node_type(t)) for t in ds.feature_types]
    results = []
    print(("" if files[0][0] is None else f"{'node type':<14}") + f"{'backend':<10}{'rows/s':>12}{'GB/s':>9}{'ampl.':>8}"
          f"{'batch ms':>10}")
    for node_type, source in files:
        for backend in args.backends.split(","):
            options = {} if backend == "memory" else {"queue_depth": args.queue_depth}
            r = probe_backend(source, backend, batch_size=args.batch_size, seconds=args.seconds, **options)
            results.append(r if node_type is None else {"node_type": node_type, **r})
            print(("" if node_type is None else f"{node_type:<14}") + f"{backend:<10}{r['rows_per_s']:>12,.0f}"
                  f"{r['gb_per_s']:>9.3f}{r['amplification']:>8.2f}{r['mean_batch_ms']:>10.2f}")
    if args.json:
        write_json_output(args.json, {"results": results}, "lsm-gnn bench storage", "--json")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from lsm_gnn import __version__
    from lsm_gnn.cli.evaluate import add_evaluate_parsers
    from lsm_gnn.cli.plan import add_plan_parser
    from lsm_gnn.cli.plot import add_plot_parser
    from lsm_gnn.cli.prepare import add_prepare_parser, number_in, parse_positive
    from lsm_gnn.cli.report import add_report_parser

    parser = argparse.ArgumentParser(prog="lsm-gnn", description="GNN training with node features on SSD")
    parser.add_argument("--version", action="version", version=f"lsm-gnn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{prepare,train,evaluate,export,plot,report,plan,inspect,bench}")
    add_prepare_parser(sub)

    train = sub.add_parser("train", help="train a GNN from a YAML config",
                           description="Train from a config file (see configs/) with key=value overrides, "
                                       "e.g. lsm-gnn train configs/demo.yaml dataset=data/g cache.policy=rr")
    train.add_argument("config", nargs="?", help="YAML config (defaults apply to keys it leaves out)")
    train.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config keys, e.g. train.epochs=2")
    train.add_argument("--grid", action="store_true", help="run every combination of the config's grid section")
    train.add_argument("--json", help="also write the result summary to this file")
    train.set_defaults(func=_train)
    add_evaluate_parsers(sub)
    add_plot_parser(sub)
    add_report_parser(sub)
    add_plan_parser(sub)

    inspect = sub.add_parser("inspect", help="print a dataset's or a checkpoint's summary")
    inspect.add_argument("path", help="dataset directory or checkpoint file")
    inspect.add_argument("--verify", action="store_true", help="scan values and verify checksums (reads every file)")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of text")
    inspect.set_defaults(func=_inspect)

    bench = sub.add_parser("bench", help="quick measurements on a dataset")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="{storage}")
    storage = bench_sub.add_parser("storage", help="random-row read throughput per storage backend")
    storage.add_argument("path", help="dataset directory")
    storage.add_argument("--backends", default="io_uring,pread,mmap", help="comma-separated backend names")
    storage.add_argument("--batch-size", type=parse_positive, default=4096)
    storage.add_argument("--queue-depth", type=parse_positive, default=64)
    storage.add_argument("--seconds", type=number_in(0, above_low=True), default=2.0, help="per backend")
    storage.add_argument("--json", help="also write the results to this file")
    storage.set_defaults(func=_bench_storage)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        # key=value after an option (train ... --grid dataset=...): argparse has closed the positionals there
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    joined_before = _in_process_group()
    try:
        code = _run(args)
    finally:
        if not joined_before and _in_process_group():
            _leave_process_group()
    if code == INTERRUPTED and argv is None:
        # Everything worth keeping is written (checkpoints are atomic, logs flushed, the loader joined);
        # the interpreter's own teardown after an interrupt can still abort in torch's static destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def _in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _leave_process_group() -> None:
    # Left to interpreter exit, gloo's threads can abort the process (SIGABRT), after an error on one rank
    # or after a successful run (lsm_gnn.comm.distributed.leave_process_group).
    from lsm_gnn.comm.distributed import leave_process_group

    try:
        leave_process_group()
    except Exception:
        pass


def _run(args) -> int:
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("lsm-gnn: interrupted; a training run continues from its last checkpoint when started again",
              file=sys.stderr)
        return INTERRUPTED
    except (ValueError, KeyError, IndexError, OSError, RuntimeError) as exc:
        # User-facing failures (bad dataset, bad option, an id out of range, a stopped rank) print one clear
        # line, not a traceback.
        print(f"lsm-gnn: error: {_one_line(exc)}", file=sys.stderr)
        if os.environ.get("LSM_GNN_TRACEBACK"):
            raise
        return 1
    except Exception as exc:  # a bug: still one line, with the way to get the traceback for a report
        if os.environ.get("LSM_GNN_TRACEBACK"):
            raise
        print(f"lsm-gnn: internal error: {type(exc).__name__}: {_one_line(exc)} (run again with "
              "LSM_GNN_TRACEBACK=1 for the traceback, and please report it)", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines) if lines else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
