"""``lsm-gnn prepare``: make datasets (synthetic, from .npy files, from a folder, heterogeneous) and recompute
scores.

:func:`add_prepare_parser` plugs the command into the main program's
sub-parsers; every sub-command sets ``func`` to a handler that takes the
parsed arguments, prints a one-line summary and returns an exit code.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets

import numpy as np

from lsm_gnn.data import open_dataset
from lsm_gnn.data.dataset import Dataset
from lsm_gnn.data.format import META_FILE, DatasetError, crc32_file
from lsm_gnn.data.scores import SCORE_NAMES, compute_scores
from lsm_gnn.data.writer import save_npy
from lsm_gnn.utils.fileio import atomic_write_bytes, fsync_path


# -- argument types --------------------------------------------------------------

def parse_count(text: str) -> int:
    """A non-negative count from ``"1000000"``, ``"1_000_000"`` or ``"1e6"``."""
    cleaned = str(text).strip().replace("_", "")
    try:
        value = int(cleaned)
    except ValueError:
        try:
            number = float(cleaned)
        except ValueError:
            raise argparse.ArgumentTypeError(f"cannot read {text!r} as a count; use an integer such as 1000000 "
                                             "or a power of ten such as 1e6") from None
        if not number.is_integer():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        value = int(number)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a count cannot be negative, got {text!r}")
    return value


def parse_positive(text: str) -> int:
    """:func:`parse_count` that is at least 1 (a size or a count of things that must exist)."""
    value = parse_count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1, got 0")
    return value


def number_in(low: float, high: float = float("inf"), *, above_low: bool = False):
    """An argparse type: a finite number in ``[low, high]`` (``(low, high]`` with ``above_low``); nan, inf and
    numbers outside are refused with the range, which argparse prefixes with the option's name."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value > low if above_low else value >= low) or not value <= high or value == float("inf"):
            bounds = f"{'above' if above_low else 'at least'} {low:g}" + \
                (f" and at most {high:g}" if high != float("inf") else "")
            raise argparse.ArgumentTypeError(f"must be a finite number {bounds}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def parse_names(text: str) -> tuple[str, ...]:
    """Comma-separated static score names; ``none`` or an empty string for none."""
    names = tuple(n.strip() for n in text.split(",") if n.strip() and n.strip().lower() != "none")
    unknown = sorted(set(names) - set(SCORE_NAMES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown score(s) {', '.join(unknown)}; valid: {', '.join(SCORE_NAMES)}")
    return names


def parse_type_dims(text: str) -> dict[str, int]:
    """``"institute=0,fos=64"`` -> per-node-type feature dims (0: no features)."""
    dims = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        type_name, sep, value = part.partition("=")
        if not sep or not type_name.strip():
            raise argparse.ArgumentTypeError(f"expected TYPE=DIM pairs such as institute=0,fos=64, got {text!r}")
        dims[type_name.strip()] = parse_count(value)
    return dims


def parse_fractions(text: str) -> tuple[float, float, float]:
    """``"0.6,0.2,0.2"`` -> train, val, test fractions."""
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or not all(0 <= p <= 1 for p in parts) or sum(parts) > 1 + 1e-9:  # nan fails 0 <= p
        raise argparse.ArgumentTypeError(f"expected train,val,test fractions summing to at most 1, got {text!r}")
    return parts


def user_item_counts(ds) -> dict | None:
    """Users, items and interactions per split of a user-item dataset (train: the user rows of the CSR;
    val and test: its edge splits), None for any other dataset."""
    if ds.num_users is None:
        return None
    interactions = {"train": int(ds.indptr[ds.num_users])}
    interactions.update({name: int(ds.edge_split(name).shape[0]) for name in ds.edge_split_names})
    return {"num_users": int(ds.num_users), "num_items": int(ds.num_items), "interactions": interactions}


def format_interactions(counts: dict) -> str:
    """``train/val/test 1,000/-/200`` from :func:`user_item_counts`' interactions."""
    splits = ("train", "val", "test")
    return "train/val/test " + "/".join(f"{counts[s]:,}" if s in counts else "-" for s in splits)


def shown_by_type(ds) -> bool:
    """Whether the command line shows ``ds`` per node type (a graph of several node types or relations) or
    plain (a graph of one, as schema 1 writes it): the one place the CLI asks."""
    return not ds.is_homogeneous


def summarize(ds) -> str:
    """One line describing a dataset (schema 1 or 2)."""
    if shown_by_type(ds):
        return summarize_typed(ds)
    features = f"features {ds.feature_dim} x {ds.feature_dtype.name}"
    scores = f"scores: {', '.join(ds.score_names()) or 'none'}"
    user_item = user_item_counts(ds)
    if user_item is not None:
        return (f"{ds.path}: {user_item['num_users']:,} users, {user_item['num_items']:,} items, interactions "
                f"{format_interactions(user_item['interactions'])}, {ds.num_edges:,} CSR edges (both directions), "
                f"{features}, {scores}")
    splits = "/".join(f"{len(ds.split(s)):,}" if s in ds.split_names() else "-" for s in ("train", "val", "test"))
    return (f"{ds.path}: {ds.num_nodes:,} nodes, {ds.num_edges:,} edges, {features}, "
            f"{ds.num_classes() if ds.num_classes() is not None else 'no'} classes, train/val/test {splits}, {scores}")


def summarize_typed(ds) -> str:
    """One line describing a graph of several node types or relations: types, relations, the target's labels
    and splits."""
    types = ", ".join(f"{t} {ds.num_nodes_of(t):,}" for t in ds.node_types)
    dims = ", ".join(f"{t} {ds.node_type(t).feature_dim}" for t in ds.feature_types) or "none"
    target = ds.target
    if target is None:
        labels = "no target"
    else:
        splits = "/".join(f"{len(ds.split(s, target)):,}" if s in ds.split_names(target) else "-"
                          for s in ("train", "val", "test"))
        labels = f"target {target}: {ds.num_classes(target)} classes, train/val/test {splits}"
    scores = ", ".join(sorted({name for t in ds.node_types for name in ds.score_names(t)})) or "none"
    return (f"{ds.path}: {ds.num_nodes:,} nodes ({types}), {len(ds.relations)} relations, "
            f"{ds.num_edges:,} edges, feature dims {dims}, {labels}, scores: {scores}")


# -- scores in place ----------------------------------------------------------------

def recompute_scores(path, names=SCORE_NAMES) -> Dataset:
    """Recomputes static scores of an existing dataset, atomically.

    New scores go to fresh file names; ``meta.json`` (with their checksums) is
    then replaced by rename, so a reader sees the old description with the
    old files or the new one with the new files. Old score files are removed
    only after the switch, so a ``Dataset`` opened before that has not yet
    read a replaced score must be reopened. A failure (a full disk raises
    :class:`~lsm_gnn.data.writer.DiskFullError`) removes the new files and
    leaves the dataset as it was.
    """
    ds = open_dataset(path, check="shape")
    names = tuple(names)
    values = compute_scores(ds.indptr, ds.indices, names)
    with open(ds.file_path(META_FILE)) as f:
        meta = json.load(f)
    token = secrets.token_hex(4)
    os.makedirs(ds.file_path("scores"), exist_ok=True)
    replaced, created = [], []
    try:
        for name, array in values.items():
            rel = f"scores/{name}.{token}.npy"
            created.append(ds.file_path(rel))
            save_npy(ds.file_path(rel), np.asarray(array, dtype=np.float32))
            fsync_path(ds.file_path(rel))
            old = meta.setdefault("scores", {}).get(name)
            if old is not None:
                replaced.append(old)
                meta.setdefault("checksums", {}).pop(old, None)
                meta.get("block_checksums", {}).get("files", {}).pop(old, None)  # its sums stay, unreferenced
            meta["scores"][name] = rel
            meta.setdefault("checksums", {})[rel] = crc32_file(ds.file_path(rel))
        fsync_path(ds.file_path("scores"))
        # The directory fsync stays below, outside the cleanup: once meta.json is replaced it names the new files.
        atomic_write_bytes(json.dumps(meta, indent=2, sort_keys=True).encode(), ds.file_path(META_FILE),
                           sync_directory=False)
    except BaseException:
        for file in created:
            with contextlib.suppress(FileNotFoundError):
                os.remove(file)
        raise
    fsync_path(ds.path)
    for rel in replaced:
        if rel not in meta["scores"].values():
            try:
                os.remove(ds.file_path(rel))
            except FileNotFoundError:
                pass
    return open_dataset(ds.path, check="shape")


# -- handlers ---------------------------------------------------------------------------

def _run_synthetic(args: argparse.Namespace) -> int:
    from lsm_gnn.data.synthetic import generate_synthetic

    ds = generate_synthetic(args.out, num_nodes=args.num_nodes, avg_degree=args.avg_degree,
                            feature_dim=args.feature_dim, feature_dtype=args.dtype, num_classes=args.classes,
                            seed=args.seed, homophily=args.homophily, split=args.split, scores=args.scores,
                            overwrite=args.overwrite, progress=not args.no_progress)
    print(summarize(ds))
    return 0


def _run_bipartite(args: argparse.Namespace) -> int:
    from lsm_gnn.data.bipartite import generate_bipartite

    ds = generate_bipartite(args.out, num_users=args.num_users, num_items=args.num_items,
                            avg_interactions=args.avg_interactions, feature_dim=args.feature_dim, seed=args.seed,
                            num_communities=args.communities, test_fraction=args.test_fraction,
                            val_fraction=args.val_fraction, scores=args.scores, overwrite=args.overwrite,
                            progress=not args.no_progress)
    print(summarize(ds))
    return 0


def _run_hetero_synthetic(args: argparse.Namespace) -> int:
    from lsm_gnn.data.synthetic_hetero import NODE_TYPES, generate_hetero_synthetic

    dims = {t: args.feature_dim for t in NODE_TYPES}
    dims.update(args.feature_dims or {})
    tuning = {key: getattr(args, key) for key in ("num_authors", "num_institutes", "num_fos", "citations_per_paper",
                                                  "authors_per_paper", "topics_per_paper", "homophily")}
    ds = generate_hetero_synthetic(args.out, num_papers=args.num_papers, feature_dim=dims, feature_dtype=args.dtype,
                                   num_classes=args.num_classes, seed=args.seed, split=args.split, scores=args.scores,
                                   overwrite=args.overwrite, progress=not args.no_progress,
                                   **{key: value for key, value in tuning.items() if value is not None})
    print(summarize(ds))
    return 0


def _run_hetero_igbh(args: argparse.Namespace) -> int:
    from lsm_gnn.data.convert_hetero import hetero_from_igbh

    ds = hetero_from_igbh(args.out, args.src, size=args.size, label_file=args.label_file,
                          num_classes=args.num_classes, split_fractions=args.random_split or (0.6, 0.2, 0.2),
                          seed=args.seed, add_reverse=not args.no_reverse, feature_dtype=args.dtype,
                          raw_feature_dim=args.raw_feature_dim, num_nodes=args.num_nodes,
                          scores=args.scores, overwrite=args.overwrite, progress=not args.no_progress)
    print(summarize(ds))
    return 0


def _run_hetero_arrays(args: argparse.Namespace) -> int:
    from lsm_gnn.data.convert_hetero import hetero_from_manifest

    ds = hetero_from_manifest(args.out, args.manifest, add_reverse=not args.no_reverse, feature_dtype=args.dtype,
                              scores=args.scores, overwrite=args.overwrite, progress=not args.no_progress)
    print(summarize(ds))
    return 0


def _common_convert_kwargs(args: argparse.Namespace) -> dict:
    return {"undirected": args.undirected, "dedup": not args.keep_duplicates, "self_loops": not args.drop_self_loops,
            "feature_dtype": args.dtype, "random_split_fractions": args.random_split, "edge_layout": args.edge_layout,
            "scores": args.scores, "overwrite": args.overwrite, "progress": not args.no_progress}


def _run_npy(args: argparse.Namespace) -> int:
    from lsm_gnn.data.convert import from_npy_files

    ds = from_npy_files(args.out, features=args.features, edge_index=args.edge_index, indptr=args.indptr,
                        indices=args.indices, labels=args.labels, train_idx=args.train_idx, val_idx=args.val_idx,
                        test_idx=args.test_idx, **_common_convert_kwargs(args))
    print(summarize(ds))
    return 0


def _run_folder(args: argparse.Namespace) -> int:
    from lsm_gnn.data.convert import from_folder

    ds = from_folder(args.out, args.src, features=args.features, edge_index=args.edge_index, labels=args.labels,
                     **_common_convert_kwargs(args))
    print(summarize(ds))
    return 0


def _run_interactions(args: argparse.Namespace) -> int:
    from lsm_gnn.data.interactions import ID_FILES, from_interactions

    ds = from_interactions(args.out, args.interactions, format=args.format, user_col=args.user_col,
                           item_col=args.item_col, time_col=args.time_col, split_col=args.split_col,
                           header=args.header, delimiter=args.delimiter, split=args.split,
                           val_fraction=args.val_fraction, test_fraction=args.test_fraction,
                           min_user_interactions=args.min_user_interactions, seed=args.seed,
                           duplicates=args.duplicates, user_features=args.user_features,
                           item_features=args.item_features, user_feature_ids=args.user_feature_ids,
                           item_feature_ids=args.item_feature_ids, feature_dim=args.feature_dim,
                           feature_dtype=args.dtype,
                           scores=args.scores, overwrite=args.overwrite, progress=not args.no_progress)
    print(summarize(ds))
    converted = ds.meta["converted"]
    repeats = converted["repeated_rows"]
    kept = "kept as parallel training edges" if converted["duplicates"] == "keep" else "dropped"
    print(f"{converted['interactions']:,} distinct (user, item) pairs"
          + (f" ({repeats:,} repeated rows {kept})" if repeats else "")
          + f"; node ids map back to the file's ids through {ID_FILES['users']} and {ID_FILES['items']}")
    return 0


def _run_checksums(args: argparse.Namespace) -> int:
    from lsm_gnn.data.verify import record_checksums

    changed = record_checksums(args.dataset)
    print(f"{args.dataset}: checksums recorded anew; changed: {', '.join(changed) or 'none'}")
    return 0


def _run_scores(args: argparse.Namespace) -> int:
    print(summarize(recompute_scores(args.dataset, args.names)))
    return 0


def _run_embedding(args: argparse.Namespace) -> int:
    from lsm_gnn.build import table_key, table_name
    from lsm_gnn.embedding import RowLayout, initial_rows
    from lsm_gnn.storage import EmbeddingTable
    from lsm_gnn.utils.units import format_bytes

    ds = open_dataset(args.dataset, check="shape")
    node_type = args.node_type or ds.node_types[0]
    if args.node_type is None and table_name(ds, node_type) is not None:  # a typed graph's tables are by type
        raise DatasetError(f"{args.dataset} has node types {ds.node_types}; name the one whose nodes get the table "
                           "with --node-type")
    if node_type not in ds.node_types:
        raise DatasetError(f"--node-type {node_type!r} is not a node type of {args.dataset}; it has {ds.node_types}")
    key = table_key(ds, node_type)
    num_rows = ds.num_nodes_of(node_type)
    try:
        layout = RowLayout(args.dim, args.dtype, args.optimizer)
    except ValueError as exc:
        raise DatasetError(f"--dim/--dtype/--optimizer: {exc}") from None
    EmbeddingTable.create(args.out, num_rows, layout.row_bytes, layout=layout.as_dict(),
                          progress=not args.no_progress,
                          init=lambda start, stop: initial_rows(layout, start, stop, seed=args.seed,
                                                                std=args.init_std)).close()
    size = format_bytes(num_rows * layout.row_bytes)
    print(f"{args.out}: {num_rows:,} embeddings of {layout.dim} {layout.dtype} values with {layout.optimizer} "
          f"state, {layout.row_bytes} bytes a row ({size}); train it with {key}.path={args.out} "
          f"{key}.dim={layout.dim} {key}.dtype={layout.dtype} {key}.optimizer={layout.optimizer}")
    return 0


# -- the parser ---------------------------------------------------------------------------

def _add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True,
                   help="dataset directory to write: new or empty (written atomically through a hidden "
                        ".NAME.tmp-* directory beside it, which a killed run leaves and the next one removes)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it is an lsm-gnn dataset holding only its own files; the old one stays "
                        "until the new one is complete. Anything else at --out is refused, never deleted")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--scores", type=parse_names, default=SCORE_NAMES, metavar="NAMES",
                   help=f"static scores to compute, comma-separated or 'none' (default: {','.join(SCORE_NAMES)})")


def _add_convert_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--edge-layout", choices=("rows", "pairs"),
                   help="how the edge file is laid out: rows (2, E) or pairs (E, 2); needed only for a 2 x 2 array "
                        "(two edges), which reads either way")
    p.add_argument("--undirected", action="store_true", help="add the reverse of every edge")
    p.add_argument("--keep-duplicates", action="store_true",
                   help="keep parallel (repeated) edges; by default one of each is kept")
    p.add_argument("--drop-self-loops", action="store_true",
                   help="drop edges from a node to itself (kept by default)")
    p.add_argument("--dtype", default=None, help="stored feature dtype (default: the input's, float32 for float64)")
    p.add_argument("--random-split", type=parse_fractions, default=None, metavar="TRAIN,VAL,TEST",
                   help="when the input has no split, draw a seeded one over labeled nodes, e.g. 0.6,0.2,0.2")


def _add_hetero_parser(sub) -> None:
    """``prepare hetero ...``: schema-2 datasets, one sub-command per source (converters join ``synthetic``)."""
    parser = sub.add_parser("hetero", help="heterogeneous datasets: several node types, typed relations",
                            description="Create schema-2 datasets (node types with their own features, typed "
                                        "relations; see docs/dataset_format.md).")
    hetero = parser.add_subparsers(dest="hetero_command", metavar="{synthetic,igbh,arrays}")
    hetero.required = True

    p = hetero.add_parser("synthetic", help="IGBH-shaped graph: papers, authors, institutes, fields of study",
                          description="Generate an IGBH-shaped heterogeneous dataset straight to disk, in bounded "
                                      "memory: paper, author, institute, fos (field of study); paper cites paper, "
                                      "author writes paper, author affiliated_with institute, paper has_topic fos "
                                      "and their reverses. Paper labels need the neighbors' features to be learned.")
    _add_output_flags(p)
    p.add_argument("--num-papers", type=parse_positive, required=True, help="number of papers, e.g. 1e6")
    p.add_argument("--num-authors", type=parse_count, help="number of authors (default 1.2 x papers)")
    p.add_argument("--num-institutes", type=parse_count, help="number of institutes (default 0.005 x papers, >= 4)")
    p.add_argument("--num-fos", type=parse_count,
                   help="number of fields of study (default 0.01 x papers, at least --num-classes)")
    p.add_argument("--feature-dim", type=parse_count, default=128, help="feature columns of every type (default 128)")
    p.add_argument("--feature-dims", type=parse_type_dims, metavar="TYPE=DIM,...",
                   help="per-type feature columns overriding --feature-dim, 0 for a type without features, "
                        "e.g. institute=0,fos=64")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="feature dtype")
    p.add_argument("--num-classes", "--classes", dest="num_classes", type=parse_positive, default=19,
                   help="paper classes (default 19, as IGBH's coarse labels)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    p.add_argument("--citations-per-paper", type=number_in(0), help="citations generated per paper (default 10)")
    p.add_argument("--authors-per-paper", type=number_in(0),
                   help="mean authors a paper draws (default 2; every author also writes one paper)")
    p.add_argument("--topics-per-paper", type=number_in(0), help="mean fields a paper draws (default 2)")
    p.add_argument("--homophily", type=number_in(0, 1),
                   help="share of citations inside the paper's class (default 0.6)")
    p.add_argument("--split", type=parse_fractions, default=(0.6, 0.2, 0.2), metavar="TRAIN,VAL,TEST",
                   help="paper split fractions (default 0.6,0.2,0.2)")
    p.set_defaults(func=_run_hetero_synthetic)

    p = hetero.add_parser("igbh", help="convert an IGBH folder (the IGB repository's layout)",
                          description="Convert an IGBH download: <src>/<size>/processed/<type>/node_feat.npy, "
                                      "<type>/node_label_*.npy, <src>__<name>__<dst>/edge_index.npy. Every file is "
                                      "memory-mapped, so the conversion runs in bounded memory. (PyG HeteroData and "
                                      "DGL heterographs convert from Python: lsm_gnn.data.convert_hetero.)")
    _add_output_flags(p)
    p.add_argument("src", help="the IGBH root (holding <size>/processed) or a processed folder")
    p.add_argument("--size", help="tiny, small, medium, large or full (default: the only one there)")
    p.add_argument("--num-classes", type=parse_count, help="19 or 2983: picks node_label_19.npy or node_label_2K.npy")
    p.add_argument("--label-file", help="the paper label file to use, e.g. node_label_19.npy")
    p.add_argument("--dtype", default=None, help="stored feature dtype (default: the input's)")
    p.add_argument("--random-split", type=parse_fractions, default=None, metavar="TRAIN,VAL,TEST",
                   help="split of labeled papers when the folder has none (default 0.6,0.2,0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed of that split")
    p.add_argument("--no-reverse", action="store_true", help="do not add reverse relations (rev_<name>)")
    p.add_argument("--raw-feature-dim", type=parse_count, default=1024,
                   help="columns of headerless float32 feature files (IGB sizes large and full; default 1024)")
    p.add_argument("--num-nodes", type=parse_type_dims, metavar="TYPE=N,...",
                   help="node counts of types that have no files of their own")
    p.set_defaults(func=_run_hetero_igbh)

    p = hetero.add_parser("arrays", help="convert a folder of .npy files that a manifest names",
                          description="Convert your own typed arrays: a YAML (or JSON) manifest names, relative to "
                                      "its folder, each node type's features (or num_nodes), labels, num_classes "
                                      "and splits, and each relation's (2, E) or (E, 2) edge array as "
                                      "src__name__dst: file.npy, or {file: file.npy, layout: rows|pairs} (rows: "
                                      "(2, E), pairs: (E, 2); required for a 2 x 2 array). Example in "
                                      "docs/hetero.md. Every file is memory-mapped")
    _add_output_flags(p)
    p.add_argument("manifest", help="the manifest file (YAML or JSON)")
    p.add_argument("--no-reverse", action="store_true", help="do not add reverse relations (rev_<name>)")
    p.add_argument("--dtype", default=None, help="stored feature dtype (default: the input's)")
    p.set_defaults(func=_run_hetero_arrays)


def _add_interactions_parser(sub) -> None:
    p = sub.add_parser("interactions", help="user-item dataset from an interaction file (CSV, TSV, .npy)",
                       description="Convert a file of (user, item[, timestamp][, split]) interactions into a "
                                   "user-item dataset for train.task=link (see docs/link_prediction.md). Ids may be "
                                   "any strings or integers; user_ids.npy and item_ids.npy in the dataset map node "
                                   "ids back to them.")
    _add_output_flags(p)
    p.add_argument("--interactions", required=True, help="the interaction file: .csv, .tsv or .npy (E, k)")
    p.add_argument("--format", choices=("csv", "tsv", "npy"), help="file format (default: from the extension)")
    p.add_argument("--delimiter", help="field separator of a text file (default: ',' for csv, tab for tsv)")
    header = p.add_mutually_exclusive_group()
    header.add_argument("--header", action="store_true", default=None,
                        help="the first line names the columns (default: yes when a column is given by name, "
                             "else guessed)")
    header.add_argument("--no-header", dest="header", action="store_false", help="the first line is data")
    p.add_argument("--user-col", default="0", help="user id column: 0-based index or header name (default 0)")
    p.add_argument("--item-col", default="1", help="item id column: 0-based index or header name (default 1)")
    p.add_argument("--time-col", help="timestamp column (numbers or ISO 8601 dates), for --split temporal")
    p.add_argument("--split-col", help="column naming each row's split: train, val (valid) or test")
    p.add_argument("--split", choices=("user-random", "temporal", "column"),
                   help="per-user random (default), per-user latest to test (temporal), or --split-col's names "
                        "(column, the default when --split-col is given)")
    p.add_argument("--val-fraction", type=number_in(0, 1), default=0.1, help="share of each user's interactions to val "
                   "(default 0.1)")
    p.add_argument("--test-fraction", type=number_in(0, 1), default=0.2,
                   help="share of each user's interactions to test (default 0.2, at least one)")
    p.add_argument("--min-user-interactions", type=parse_count, default=3,
                   help="users with fewer interactions keep them all in training (default 3)")
    p.add_argument("--duplicates", choices=("drop", "keep", "error"), default="drop",
                   help="repeated (user, item) rows: keep the earliest (drop, default), keep all as parallel "
                        "training edges (keep), or refuse (error)")
    p.add_argument("--user-features", help=".npy [num_users, dim]: row r for user id r (or --user-feature-ids[r])")
    p.add_argument("--item-features", help=".npy [num_items, dim]: row r for item id r (or --item-feature-ids[r])")
    p.add_argument("--user-feature-ids", help="the user id of each row of --user-features, in row order: .npy, or "
                                              "text with one id per line (default: ids are row numbers)")
    p.add_argument("--item-feature-ids", help="the item id of each row of --item-features (as --user-feature-ids)")
    p.add_argument("--feature-dim", type=parse_count, default=64,
                   help="columns of the random features given to users and items without a feature file "
                        "(default 64)")
    p.add_argument("--dtype", default=None, help="stored feature dtype (default: the input's, else float32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random split and features")
    p.set_defaults(func=_run_interactions)


def add_prepare_parser(subparsers) -> argparse.ArgumentParser:
    """Adds ``prepare`` (``synthetic``, ``bipartite``, ``npy``, ``folder``, ``interactions``, ``hetero``, ``scores``) to
    ``subparsers``."""
    parser = subparsers.add_parser("prepare", help="create a dataset or recompute its static scores",
                                   description="Create datasets in the lsm-gnn format. A full disk stops with an "
                                               "error naming the file and leaves no partial dataset.")
    sub = parser.add_subparsers(dest="prepare_command",
                                metavar="{synthetic,bipartite,npy,folder,interactions,hetero,checksums,scores}")
    sub.required = True

    p = sub.add_parser("synthetic", help="R-MAT power-law graph with learnable communities",
                       description="Generate a synthetic dataset straight to disk (scales to 10^8 nodes).")
    _add_output_flags(p)
    p.add_argument("--num-nodes", type=parse_positive, required=True, help="number of nodes, e.g. 1e6")
    p.add_argument("--avg-degree", type=number_in(0, above_low=True), default=10.0,
                   help="CSR entries per node before dedup (default 10)")
    p.add_argument("--feature-dim", type=parse_positive, default=128, help="feature columns (default 128)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="feature dtype")
    p.add_argument("--classes", type=parse_positive, default=8, help="number of classes / communities (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    p.add_argument("--homophily", type=number_in(0, 1), default=0.75, help="fraction of edges drawn inside a class")
    p.add_argument("--split", type=parse_fractions, default=(0.6, 0.2, 0.2), metavar="TRAIN,VAL,TEST",
                   help="split fractions (default 0.6,0.2,0.2)")
    p.set_defaults(func=_run_synthetic)

    p = sub.add_parser("bipartite", help="user-item interaction graph for link prediction",
                       description="Generate a synthetic user-item dataset with held-out interactions "
                                   "(train with train.task=link; see docs/link_prediction.md).")
    _add_output_flags(p)
    p.add_argument("--num-users", type=parse_positive, required=True, help="number of users, e.g. 1e5")
    p.add_argument("--num-items", type=parse_positive, required=True, help="number of items")
    p.add_argument("--avg-interactions", type=number_in(0, above_low=True), default=20.0,
                   help="interactions per user (default 20)")
    p.add_argument("--feature-dim", type=parse_positive, default=64, help="feature columns (default 64)")
    p.add_argument("--communities", type=parse_positive, default=8, help="latent user/item communities (default 8)")
    p.add_argument("--test-fraction", type=number_in(0, 1), default=0.2, help="held-out share of each user's items")
    p.add_argument("--val-fraction", type=number_in(0, 1), default=0.0, help="validation share of each user's items")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    p.set_defaults(func=_run_bipartite)

    p = sub.add_parser("npy", help="convert .npy arrays (features, edge index or CSR, labels, splits)",
                       description="Convert .npy files, read memory-mapped in bounded memory.")
    _add_output_flags(p)
    p.add_argument("--features", required=True, help="[num_nodes, dim] feature array")
    p.add_argument("--edge-index", help="(2, E) or (E, 2) edges, source first")
    p.add_argument("--indptr", help="CSR indptr (instead of --edge-index)")
    p.add_argument("--indices", help="CSR indices (instead of --edge-index)")
    p.add_argument("--labels", help="per-node class ids (-1 or NaN for unlabeled)")
    p.add_argument("--train-idx", help="train node ids or boolean mask")
    p.add_argument("--val-idx", help="validation node ids or boolean mask")
    p.add_argument("--test-idx", help="test node ids or boolean mask")
    _add_convert_flags(p)
    p.set_defaults(func=_run_npy)

    p = sub.add_parser("folder", help="convert an OGB/IGB-style folder of .npy files",
                       description="Find node_feat.npy, edge_index.npy, node_label*.npy, *_idx.npy (recursively) "
                                   "and convert them.")
    p.add_argument("--src", required=True, help="the folder to convert")
    _add_output_flags(p)
    p.add_argument("--features", help="feature file inside --src when the search finds several")
    p.add_argument("--edge-index", help="edge file inside --src when the search finds several")
    p.add_argument("--labels", help="label file inside --src, e.g. processed/paper/node_label_19.npy")
    _add_convert_flags(p)
    p.set_defaults(func=_run_folder)

    _add_interactions_parser(sub)
    _add_hetero_parser(sub)

    p = sub.add_parser("embedding", help="a trainable node embedding table for a dataset (docs/embeddings.md)")
    p.add_argument("dataset", help="dataset directory whose nodes get an embedding each")
    p.add_argument("--out", required=True, help="the table's directory to create (refused if it exists)")
    p.add_argument("--dim", type=parse_positive, required=True, help="values per node")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"), help="stored embedding dtype")
    p.add_argument("--optimizer", default="adagrad", choices=("sgd", "adagrad", "adam"),
                   help="the row-wise optimizer whose state each row carries (default: adagrad)")
    p.add_argument("--init-std", type=number_in(0), default=0.1, help="initial values ~ N(0, std^2) (default: 0.1)")
    p.add_argument("--node-type", help="on a graph of several node types, whose nodes get the table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_embedding)

    p = sub.add_parser("checksums", help="record a dataset's checksums anew after an intended edit (atomic)",
                       description="Re-reads every file a dataset's meta.json names and records its checksums (whole "
                                   "and per block) anew: after you changed a file on purpose (labels.npy, a split), "
                                   "so that opening and data.verify accept it. A damaged file would be accepted "
                                   "the same way: restore damage instead.")
    p.add_argument("dataset", help="dataset directory")
    p.set_defaults(func=_run_checksums)

    p = sub.add_parser("scores", help="recompute static scores of a dataset in place (atomic)")
    p.add_argument("dataset", help="dataset directory")
    p.add_argument("--names", type=parse_names, default=SCORE_NAMES, metavar="NAMES",
                   help=f"comma-separated score names (default: {','.join(SCORE_NAMES)})")
    p.set_defaults(func=_run_scores)
    return parser
