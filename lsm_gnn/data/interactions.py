"""User-item datasets from interaction files (CSV, TSV, ``.npy``), for link prediction.

:func:`from_interactions` reads one row per interaction (a user id, an item
id, optionally a timestamp and a split name), gives users the dense node ids
``[0, num_users)`` and items ``[num_users, num_users + num_items)``, splits
the interactions into train (the CSR, both directions), val and test
(``val_edges.npy``, ``test_edges.npy``) and writes a dataset that
``train.task=link`` accepts as is (static scores included).

* **Ids.** Users and items are separate id spaces (a user id may equal an
  item id). Without a feature file, ids are any strings or integers,
  numbered in sorted order (numerically when every id of a side is an
  integer); with one, every row becomes a node, in order, and ids are its
  row numbers, or the ids a ``user_feature_ids``/``item_feature_ids`` file
  gives its rows. ``user_ids.npy`` and ``item_ids.npy`` map
  node ids back (:func:`id_maps`).
* **Splits.** ``user-random``: each user with at least
  ``min_user_interactions`` interactions gives ``round(test_fraction * n)``
  of them (at least one) to test and ``round(val_fraction * n)`` to val,
  chosen at random with ``seed``, keeping one or more for training; users
  with fewer keep all theirs in training. ``temporal``: the same counts, but
  a user's latest interactions are held out (ties in file order). ``column``:
  a column names each interaction's split (train, val/valid/validation,
  test).
* **Repeats** of a (user, item) pair: ``duplicates="drop"`` keeps one, the
  earliest (by timestamp, then file order), which alone decides the pair's
  split; ``"keep"`` also keeps the repeats as parallel training edges (a
  held-out pair is stored once); ``"error"`` refuses them.

Files are parsed in chunks of ``READ_CHUNK`` rows (reading the file is
:mod:`lsm_gnn.data.interaction_files`'s); memory peaks at about 80
bytes per interaction (the columns as arrays, then the sorts that find
repeats and split) plus a dictionary of the distinct ids.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from lsm_gnn.data.convert import converter_progress, dtype_of, open_npy, stored_feature_dtype, write_feature_chunks
from lsm_gnn.data.dataset import Dataset
from lsm_gnn.data.interaction_files import file_format, is_number, read_interactions, show
from lsm_gnn.data.scores import SCORE_NAMES, check_score_names
from lsm_gnn.data.writer import DatasetWriter, save_npy

RANDOM_FEATURE_BLOCK = 1 << 16  # rows per RNG block of generated features (output independent of chunking)
SPLIT_MODES = ("user-random", "temporal", "column")
DUPLICATE_MODES = ("drop", "keep", "error")
_TRAIN, _VAL, _TEST = 0, 1, 2  # the part codes interaction_files.SPLIT_VALUES gives split names
ID_FILES = {"users": "user_ids.npy", "items": "item_ids.npy"}


# -- ids -----------------------------------------------------------------------------------------------------

class _IdSpace:
    """Dense ids of one side (users or items). With ``rows`` (a feature file's), raw ids are those row numbers;
    without, raw ids get codes in order of first appearance, renumbered in sorted order by :meth:`finish`."""

    def __init__(self, side: str, rows: int | None, feature_file: str | None, row_ids: np.ndarray | None = None):
        self.side, self.rows, self.feature_file = side, rows, feature_file
        self.codes: dict = {}
        #: the ids of the feature file's rows, in row order (compared as text), or None: ids are row numbers
        self.row_ids = row_ids
        self.row_of = None if row_ids is None else {str(v): r for r, v in enumerate(row_ids.tolist())}

    def encode(self, values, lines: np.ndarray, where: str) -> np.ndarray:
        values = np.asarray(values)
        if self.row_of is not None:
            if values.dtype.kind == "f":
                values = self._integers(values, lines, where)
            uniques, inverse = np.unique(values.astype(str), return_inverse=True)
            rows = np.fromiter((self.row_of.get(v, -1) for v in uniques.tolist()), np.int64, uniques.size)
            missing = np.flatnonzero(rows < 0)
            if missing.size:
                first = np.flatnonzero(inverse.reshape(-1) == missing[0])[0]
                raise ValueError(f"{where} {lines[first]}: {self.side[:-1]} id {show(values[first])} is not among "
                                 f"the ids of {self.feature_file}'s rows ({self.side[:-1]}_feature_ids); "
                                 f"{missing.size:,} such ids in this chunk")
            return rows[inverse.reshape(-1)]
        if self.rows is not None:
            ids = self._integers(values, lines, where)
            bad = np.flatnonzero((ids < 0) | (ids >= self.rows))
            if bad.size:
                raise ValueError(f"{where} {lines[bad[0]]}: {self.side[:-1]} id {ids[bad[0]]} is outside the "
                                 f"{self.rows:,} rows of {self.feature_file}; with a feature file, {self.side[:-1]} "
                                 f"ids must be its row numbers 0..{self.rows - 1}")
            return ids
        if values.dtype.kind == "f":
            values = self._integers(values, lines, where)
        elif values.dtype.kind in "US":
            empty = np.flatnonzero(values == "")
            if empty.size:
                raise ValueError(f"{where} {lines[empty[0]]}: the {self.side[:-1]} id is empty")
        uniques, inverse = np.unique(values, return_inverse=True)
        codes = np.fromiter((self.codes.setdefault(v, len(self.codes)) for v in uniques.tolist()), np.int64,
                            uniques.size)
        return codes[inverse.reshape(-1)]

    def _integers(self, values: np.ndarray, lines: np.ndarray, where: str) -> np.ndarray:
        try:
            as_float = values.astype(np.float64)
        except ValueError:
            bad = next(j for j, v in enumerate(values.tolist()) if not is_number(v))
            raise ValueError(f"{where} {lines[bad]}: {self.side[:-1]} id {show(values[bad])} is not an integer"
                             + (f"; with {self.feature_file}, ids must be its row numbers" if self.feature_file
                                else "")) from None
        wrong = np.flatnonzero(~np.isfinite(as_float) | (as_float != np.round(as_float)))
        if wrong.size:
            raise ValueError(f"{where} {lines[wrong[0]]}: {self.side[:-1]} id {show(values[wrong[0]])} is not an "
                             "integer")
        return values.astype(np.int64) if values.dtype.kind in "iu" else as_float.astype(np.int64)

    def finish(self) -> tuple[int, np.ndarray, np.ndarray | None]:
        """``(count, raw ids in node order, remap of the codes or None)``."""
        if self.row_ids is not None:
            return self.rows, self.row_ids, None
        if self.rows is not None:
            return self.rows, np.arange(self.rows, dtype=np.int64), None
        keys = list(self.codes)
        raw = np.array(keys)
        if raw.dtype.kind in "US":
            try:  # integer ids read as text are numbered, and stored, as integers ("007" and "7" stay text)
                numbers = raw.astype(np.int64)
                if [str(n) for n in numbers.tolist()] == keys:
                    raw = numbers
            except (ValueError, OverflowError):  # not all integers, or beyond int64: the ids stay text
                pass
        order = np.argsort(raw, kind="stable")
        remap = np.empty(len(keys), dtype=np.int64)
        remap[order] = np.arange(len(keys))
        return len(keys), raw[order], remap


def id_maps(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(user_ids, item_ids)`` of a dataset made by :func:`from_interactions`: node ``u`` is the file's user
    ``user_ids[u]``, node ``num_users + j`` its item ``item_ids[j]``."""
    files = dataset.meta.get("id_maps")
    if not files:
        raise KeyError(f"dataset {dataset.path} has no id maps; only lsm_gnn.data.from_interactions "
                       "(lsm-gnn prepare interactions) writes them")
    return tuple(np.load(dataset.file_path(files[side])) for side in ("users", "items"))


# -- splitting -------------------------------------------------------------------------------------------------

def held_out_counts(n: np.ndarray, val_fraction: float, test_fraction: float, min_user_interactions: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(test, val)`` counts per user from its interaction count ``n``: round(fraction x n), test at least one,
    one interaction or more always left for training; users under ``min_user_interactions`` hold none out."""
    eligible = n >= max(min_user_interactions, 2)
    test = np.where(eligible, np.floor(test_fraction * n + 0.5), 0).astype(np.int64)
    if test_fraction > 0:
        test = np.where(eligible, np.maximum(test, 1), 0)
    test = np.minimum(test, np.maximum(n - 1, 0))
    val = np.where(eligible, np.floor(val_fraction * n + 0.5), 0).astype(np.int64)
    val = np.minimum(val, np.maximum(n - 1 - test, 0))
    return test, val


def per_user_split(users: np.ndarray, order_key: np.ndarray, num_users: int, val_fraction: float,
                   test_fraction: float, min_user_interactions: int) -> np.ndarray:
    """Part (0 train, 1 val, 2 test) of each interaction: a user's interactions sorted by ``order_key`` (ties by
    position) give their last ones to test and the ones before those to val."""
    n = np.bincount(users, minlength=num_users)
    test, val = held_out_counts(n, val_fraction, test_fraction, min_user_interactions)
    order = np.lexsort((np.arange(users.size), order_key, users))
    by_user = users[order]
    from_end = (np.cumsum(n) - 1)[by_user] - np.arange(users.size)  # 0 for a user's last interaction
    parts = np.full(users.size, _TRAIN, dtype=np.int8)
    parts[order] = np.where(from_end < test[by_user], _TEST,
                            np.where(from_end < test[by_user] + val[by_user], _VAL, _TRAIN))
    return parts


# -- the converter -----------------------------------------------------------------------------------------------

def _check_fraction(value: float, what: str) -> float:
    value = float(value)
    if not 0 <= value < 1:
        raise ValueError(f"{what} must be in [0, 1), got {value}")
    return value


def _feature_source(features: Any, side: str) -> tuple[Any, str | None]:
    if features is None:
        return None, None
    label = os.fspath(features) if isinstance(features, (str, os.PathLike)) else f"the {side[:-1]} feature array"
    array = open_npy(features, f"{side[:-1]}_features")
    if not hasattr(array, "shape") or len(array.shape) != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        shape = getattr(array, "shape", None)
        raise ValueError(f"{label} must be a 2-D array with one row per {side[:-1]} id, got shape {shape}")
    return array, label


def _feature_row_ids(ids: Any, side: str, rows: int | None) -> np.ndarray | None:
    """The ids of a feature file's rows: an array, a ``.npy`` file, or a text file of one id per line."""
    if ids is None:
        return None
    what = f"{side[:-1]}_feature_ids"
    if rows is None:
        raise ValueError(f"{what} names the ids of {side[:-1]}_features' rows; pass {side[:-1]}_features too")
    if isinstance(ids, (str, os.PathLike)) and not os.fspath(ids).endswith(".npy"):
        with open(ids) as fh:
            values = np.array([line.strip() for line in fh if line.strip()])
    else:
        values = np.asarray(open_npy(ids, what)).reshape(-1)
    if len(values) != rows:
        raise ValueError(f"{what} has {len(values):,} ids but the feature file has {rows:,} rows: one id per row")
    texts = values.astype(str)
    uniques, counts = np.unique(texts, return_counts=True)
    if uniques.size != texts.size:
        raise ValueError(f"{what}: id {show(uniques[np.argmax(counts)])} names {counts.max()} rows; each id names one")
    return values


def from_interactions(path, interactions, *, format: str | None = None, user_col: Any = 0, item_col: Any = 1,
                      time_col: Any = None, split_col: Any = None, header: bool | None = None,
                      delimiter: str | None = None, split: str | None = None, val_fraction: float = 0.1,
                      test_fraction: float = 0.2, min_user_interactions: int = 3, seed: int = 0,
                      duplicates: str = "drop", user_features=None, item_features=None,
                      user_feature_ids=None, item_feature_ids=None, feature_dim: int = 64,
                      feature_dtype=None, scores=SCORE_NAMES, name: str | None = None, overwrite: bool = False,
                      progress: bool = True) -> Dataset:
    """Writes a user-item dataset from an interaction file and returns it opened (see the module docstring).

    ``interactions`` is a CSV or TSV file (``format`` from the extension,
    ``.tsv`` for TSV, else CSV; ``delimiter`` overrides) or a ``.npy`` array
    ``(E, k)`` (or structured, columns by field name). Columns are 0-based
    indices or header names; ``header=None`` reads a header when a column is
    given by name, else guesses from the first rows (``csv.Sniffer``).
    ``split`` is ``"user-random"`` (default), ``"temporal"`` (needs
    ``time_col``) or ``"column"`` (default when ``split_col`` is given).
    Timestamps are numbers or ISO 8601 dates. ``user_features`` /
    ``item_features`` are ``.npy`` files or arrays, row r for id r, or for
    id ``user_feature_ids[r]`` / ``item_feature_ids[r]`` where given (an
    array, a ``.npy`` or a text file of one id per line; ids are compared as
    text, and an interaction whose id has no row is refused); of equal
    width they share the feature columns, else the users' come first and the
    items' after them (zeros elsewhere). A side without one gets seeded
    standard-normal features, of the other side's width or ``feature_dim``.
    ``scores`` as in :class:`~lsm_gnn.data.writer.DatasetWriter`.
    """
    file_path = os.fspath(interactions)
    if not os.path.isfile(file_path):
        raise FileNotFoundError(f"interactions: no such file {file_path}")
    fmt = file_format(file_path, format)
    opts = _check_splitting(split or ("column" if split_col is not None else "user-random"), time_col, split_col,
                            duplicates, val_fraction, test_fraction, min_user_interactions, seed)
    scores = check_score_names(scores)
    sources = {side: _feature_source(f, side) for side, f in (("users", user_features), ("items", item_features))}
    spaces = _id_spaces(sources, {"users": user_feature_ids, "items": item_feature_ids})
    feature_info = _feature_layout(sources, feature_dim, feature_dtype)  # checked before the file is read
    columns = {"user": user_col, "item": item_col}
    columns.update((role, col) for role, col in (("time", time_col), ("split", split_col)) if col is not None)
    info, arrays = read_interactions(file_path, fmt, columns, header, delimiter, spaces, progress)
    pairs = _split_interactions(file_path, info, arrays, spaces, opts)
    del arrays  # the file's columns: only the distinct pairs are written
    meta = _conversion_meta(file_path, fmt, info, opts, pairs, sources)
    with DatasetWriter(path, num_nodes=pairs.num_users + pairs.num_items, feature_dim=feature_info["dim"],
                       feature_dtype=feature_info["dtype"].name, name=name, overwrite=overwrite, extra_meta=meta,
                       scores=scores) as writer:
        _write_features(writer, sources, feature_info, (pairs.num_users, pairs.num_items), seed, progress)
        _write_interactions(writer, pairs, keep_repeats=duplicates == "keep")
        return writer.commit()


class _Splitting(NamedTuple):
    """How :func:`from_interactions` splits pairs and treats repeats, in the order ``meta.json`` lists them."""
    split: str
    val_fraction: float
    test_fraction: float
    min_user_interactions: int
    seed: Any
    duplicates: str


def _check_splitting(split: str, time_col: Any, split_col: Any, duplicates: str, val_fraction: float,
                     test_fraction: float, min_user_interactions: int, seed: Any) -> _Splitting:
    """The split options, checked: a known mode with the column it needs, fractions that hold out test pairs."""
    if split not in SPLIT_MODES:
        raise ValueError(f"split={split!r} is not one of {', '.join(SPLIT_MODES)}")
    if split == "temporal" and time_col is None:
        raise ValueError("split='temporal' needs the timestamp column: pass time_col (CLI: --time-col)")
    if split == "column" and split_col is None:
        raise ValueError("split='column' needs the column naming each row's split: pass split_col (CLI: --split-col)")
    if duplicates not in DUPLICATE_MODES:
        raise ValueError(f"duplicates={duplicates!r} is not one of {', '.join(DUPLICATE_MODES)}")
    val_fraction, test_fraction = _check_fraction(val_fraction, "val_fraction"), _check_fraction(test_fraction,
                                                                                                 "test_fraction")
    if split != "column" and (test_fraction == 0 or val_fraction + test_fraction >= 1):
        raise ValueError(f"test_fraction must be > 0 and val_fraction + test_fraction < 1, got {val_fraction}, "
                         f"{test_fraction}")
    return _Splitting(split, val_fraction, test_fraction, min_user_interactions, seed, duplicates)


def _id_spaces(sources: dict, given_ids: dict) -> dict[str, _IdSpace]:
    """Each side's id space: its feature file's rows (named by ``given_ids`` where given), else the ids read."""
    spaces = {}
    for side, (array, label) in sources.items():
        rows = None if array is None else int(array.shape[0])
        spaces[side] = _IdSpace(side, rows, label, _feature_row_ids(given_ids[side], side, rows))
    return spaces


class _Interactions(NamedTuple):
    """The distinct (user, item) pairs of a file, in dense ids (items from 0), and the part each went to."""
    num_users: int
    num_items: int
    user_ids: np.ndarray  # raw ids in node order
    item_ids: np.ndarray
    users: np.ndarray  # of each distinct pair, in file order
    items: np.ndarray
    counts: np.ndarray  # how many rows hold each pair
    part: np.ndarray  # _TRAIN, _VAL or _TEST of each pair
    held: dict[str, int]  # pairs in val and test
    repeats: int  # rows that repeat an earlier pair


def _split_interactions(file_path: str, info: dict, arrays: dict, spaces: dict, opts: _Splitting) -> _Interactions:
    """The file's rows as dense ids, one per distinct pair (the earliest decides), each given its part."""
    (num_users, user_ids, users), (num_items, item_ids, items) = _dense_ids(arrays, spaces)
    lines = arrays["line"]
    representative, counts = _earliest_of_each_pair(users * num_items + items, arrays.get("time"), lines)
    repeats = users.size - representative.size
    if repeats and opts.duplicates == "error":
        row = representative[np.flatnonzero(counts > 1)[0]]  # the first repeated pair in the file
        same = np.flatnonzero((users == users[row]) & (items == items[row]))
        shown = ", ".join(str(n) for n in np.sort(lines[same])[:5])
        user, item = show(user_ids[users[row]]), show(item_ids[items[row]])
        raise ValueError(f"{file_path}: user {user} and item {item} interact more than once ({info['unit']}s {shown}); "
                         f"{repeats:,} rows repeat a pair. Pass duplicates='drop' or 'keep' (CLI: --duplicates)")
    r_users = users[representative]
    if opts.split == "column":
        part = arrays["split"][representative]
    else:
        key = (arrays["time"][representative] if opts.split == "temporal"
               else np.random.default_rng(opts.seed).random(representative.size))
        part = per_user_split(r_users, key, num_users, opts.val_fraction, opts.test_fraction,
                              opts.min_user_interactions)
    return _Interactions(num_users, num_items, user_ids, item_ids, r_users, items[representative], counts, part,
                         _held_out(part, file_path, opts), repeats)


def _dense_ids(arrays: dict, spaces: dict) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per side (users, items): its node count, raw ids in node order and each row's dense id."""
    sides = []
    for side, column in (("users", "user"), ("items", "item")):
        count, raw_ids, remap = spaces[side].finish()
        sides.append((count, raw_ids, arrays[column] if remap is None else remap[arrays[column]]))
    return sides


def _held_out(part: np.ndarray, file_path: str, opts: _Splitting) -> dict[str, int]:
    """Pairs in val and test; refuses an empty test, or an empty val that ``val_fraction`` asked for."""
    held = {name: int((part == code).sum()) for name, code in (("val", _VAL), ("test", _TEST))}
    if held["test"] == 0:
        raise ValueError(f"{file_path}: no interaction went to test"
                         + (" (the split column names none)" if opts.split == "column" else
                            f": no user has {max(opts.min_user_interactions, 2)} or more interactions; lower "
                            "min_user_interactions (CLI: --min-user-interactions)"))
    if opts.split != "column" and opts.val_fraction > 0 and held["val"] == 0:
        raise ValueError(f"{file_path}: val_fraction={opts.val_fraction} held out no interaction (every user's "
                         "round(val_fraction x n) is 0); raise it, or pass val_fraction=0 and train with "
                         "train.eval_splits=[test]")
    return held


def _conversion_meta(file_path: str, fmt: str, info: dict, opts: _Splitting, pairs: _Interactions,
                     sources: dict) -> dict:
    """What ``meta.json`` records of the conversion: the file, how it was read and split, and the id maps."""
    converted = {
        "from": "interactions", "file": os.path.abspath(file_path), "format": fmt, "header": info["header"],
        "columns": {role: (c if isinstance(c, str) else int(c)) for role, c in info["columns"].items()},
        **opts._asdict(), "min_user_interactions": int(opts.min_user_interactions), "seed": int(opts.seed),
        "repeated_rows": int(pairs.repeats), "interactions": int(pairs.users.size),
        "features": {side: label or "random" for side, (_, label) in sources.items()},
    }
    if "delimiter" in info:
        converted["delimiter"] = info["delimiter"]
    return {"converted": converted, "id_maps": dict(ID_FILES)}


def _write_interactions(writer: DatasetWriter, pairs: _Interactions, keep_repeats: bool) -> None:
    """The train pairs as edges both ways, val and test as sorted held-out pairs, and the id maps."""
    num_users = pairs.num_users
    writer.set_bipartite(num_users, pairs.num_items)
    train = pairs.part == _TRAIN
    t_users, t_items = pairs.users[train], pairs.items[train]
    if keep_repeats:  # repeats become parallel training edges
        t_users, t_items = np.repeat(t_users, pairs.counts[train]), np.repeat(t_items, pairs.counts[train])
    # An item -> user message and its reverse: a user's row lists its items, an item's row its users.
    writer.write_edges([(t_items + num_users, t_users)], undirected=True, dedup=not keep_repeats)
    for split_name, code in (("val", _VAL), ("test", _TEST)):
        if pairs.held[split_name]:
            chosen = pairs.part == code
            held = np.stack([pairs.users[chosen], pairs.items[chosen] + num_users], axis=1)
            writer.write_edge_split(split_name, held[np.lexsort((held[:, 1], held[:, 0]))])
    save_npy(os.path.join(writer.tmp, ID_FILES["users"]), pairs.user_ids)
    save_npy(os.path.join(writer.tmp, ID_FILES["items"]), pairs.item_ids)


def _earliest_of_each_pair(pair: np.ndarray, times: np.ndarray | None, lines: np.ndarray
                           ) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, counts)``: for each distinct ``pair`` key, its earliest row (by time, then line), the rows in
    file order, and how many rows hold that pair."""
    order = np.lexsort((lines, pair) if times is None else (lines, times, pair))
    first = np.ones(order.size, dtype=bool)
    first[1:] = pair[order[1:]] != pair[order[:-1]]
    counts = np.diff(np.append(np.flatnonzero(first), order.size))
    rows = order[first]
    by_row = np.argsort(rows, kind="stable")  # file order, so the random split does not depend on the sort
    return rows[by_row], counts[by_row]


def _feature_layout(sources: dict, feature_dim: int, feature_dtype) -> dict:
    """Width, per-side column offset and stored dtype of the features."""
    dims = {side: None if array is None else int(array.shape[1]) for side, (array, _) in sources.items()}
    given = [d for d in dims.values() if d is not None]
    if not given and (isinstance(feature_dim, bool) or int(feature_dim) != feature_dim or feature_dim <= 0):
        raise ValueError(f"feature_dim must be a positive integer, got {feature_dim!r}")
    if len(given) == 2 and given[0] != given[1]:  # side by side: users' columns, then items'
        dim, offsets = sum(given), {"users": 0, "items": dims["users"]}
        widths = dims
    else:
        dim = given[0] if given else int(feature_dim)
        offsets, widths = {"users": 0, "items": 0}, {"users": dim, "items": dim}
    source_dtypes = [dtype_of(array) for array, _ in sources.values() if array is not None]
    source = np.result_type(*source_dtypes) if source_dtypes else np.dtype(np.float32)
    if len(given) < 2 and np.issubdtype(source, np.integer) and feature_dtype is None:
        source = np.dtype(np.float32)  # the generated side is Gaussian
    return {"dim": dim, "offsets": offsets, "widths": widths, "dtype": stored_feature_dtype(source, feature_dtype)}


def _write_features(writer: DatasetWriter, sources: dict, layout: dict, counts: tuple[int, int], seed: int,
                    progress: bool) -> None:
    """Users' rows then items', each from its file or generated, placed at the side's column offset."""
    dim, dtype = layout["dim"], layout["dtype"]
    with converter_progress(progress, total=sum(counts), desc="features", unit="node") as bar:
        for stream, ((side, (array, _)), count) in enumerate(zip(sources.items(), counts)):
            offset, width = layout["offsets"][side], layout["widths"][side]

            def write(rows, offset=offset, width=width):
                if width == dim:
                    writer.write_features(rows)
                else:
                    placed = np.zeros((rows.shape[0], dim), dtype=dtype)
                    placed[:, offset:offset + width] = rows
                    writer.write_features(placed)

            if array is not None:
                write_feature_chunks(write, array, dtype, bar)
                continue
            for block, start in enumerate(range(0, count, RANDOM_FEATURE_BLOCK)):
                rng = np.random.default_rng([seed, stream, block])
                rows = rng.standard_normal((min(RANDOM_FEATURE_BLOCK, count - start), width), dtype=np.float32)
                write(rows.astype(dtype))
                bar.update(rows.shape[0])
