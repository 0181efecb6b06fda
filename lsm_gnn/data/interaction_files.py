"""Reading an interaction file (CSV, TSV, ``.npy``) for :func:`~lsm_gnn.data.interactions.from_interactions`.

:func:`read_interactions` parses the file in chunks of ``READ_CHUNK`` rows into one array per column: user and
item ids as the codes of the caller's id spaces, timestamps as floats, split names as part codes
(``SPLIT_VALUES``), and each row's line number (of a ``.npy`` file: its row), which every error names.
"""
from __future__ import annotations

import csv
import os
from typing import Any, Iterator

import numpy as np

from lsm_gnn.data.convert import converter_progress, open_npy

READ_CHUNK = 1 << 18          # rows parsed per chunk
SPLIT_VALUES = {"train": 0, "val": 1, "valid": 1, "validation": 1, "test": 2}


# -- reading the file in chunks ---------------------------------------------------------------------------------

def file_format(file_path: str, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in ("csv", "tsv", "npy"):
            raise ValueError(f"format={fmt!r} is not supported; use csv, tsv or npy")
        return fmt
    ext = os.path.splitext(file_path)[1].lower()
    known = {".npy": "npy", ".tsv": "tsv", ".tab": "tsv", ".csv": "csv", ".txt": "csv"}
    if ext not in known:  # guessing csv would fail later on a parse error that does not say why
        raise ValueError(f"cannot tell the format of {file_path} from its extension {ext or '(none)'!r} (known: "
                         f"{', '.join(known)}); give --format csv, tsv or npy, and --delimiter for another "
                         "separator (e.g. a RecBole .inter file: --format tsv)")
    return known[ext]


def _column_index(spec: Any, names: list[str] | None, role: str, where: str) -> int:
    """A column given by 0-based index or by header name, as an index."""
    if isinstance(spec, (int, np.integer)) or (isinstance(spec, str) and spec.isdigit()):
        return int(spec)
    if names is None:
        raise ValueError(f"{role} column {spec!r} is a name, but {where} has no header; pass its 0-based index "
                         "or a file whose first row names the columns (CLI: --header)")
    if spec not in names:
        raise ValueError(f"{role} column {spec!r} is not in {where}'s header ({', '.join(names)}); pass one of "
                         "these names or a 0-based index")
    return names.index(spec)


def _not_utf8(file_path: str, exc: UnicodeDecodeError, where: str) -> ValueError:
    return ValueError(f"{file_path} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} {where} cannot be read "
                      "(a Latin-1 or Windows-1252 file?); save it as UTF-8, e.g. iconv -f latin1 -t utf-8 "
                      f"{file_path} > utf8.csv, and convert that")


def _text_chunks(file_path: str, fmt: str, columns: dict[str, Any], header: bool | None, delimiter: str | None
                 ) -> tuple[dict, Iterator[tuple[dict[str, list], np.ndarray]]]:
    """``(info, chunks)``: each chunk maps a role to its column's strings, with the file's line numbers."""
    delimiter = delimiter or ("\t" if fmt == "tsv" else ",")
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in "\r\n\"":
        raise ValueError(f"the delimiter (--delimiter) must be one character other than a quote or a line break, got "
                         f"{delimiter!r}; e.g. ',' or ';' (--format tsv for tabs)")
    f = open(file_path, newline="", encoding="utf-8-sig")  # closed by the generator
    try:
        try:
            sample = f.read(1 << 16)
        except UnicodeDecodeError as exc:
            raise _not_utf8(file_path, exc, "in its first 64 KiB") from None
        f.seek(0)
        if header is None:  # a name asks for a header; otherwise guess from the first rows' value types
            named = any(isinstance(s, str) and not s.isdigit() for s in columns.values())
            try:
                header = named or csv.Sniffer().has_header(sample)
            except csv.Error:
                header = False
        reader = csv.reader(f, delimiter=delimiter)
        names = None
        if header:
            names = next(reader, None)
            if names is None:
                raise ValueError(f"{file_path} is empty; it must hold one interaction per line")
            names = [n.strip() for n in names]
        index = {role: _column_index(spec, names, role, file_path) for role, spec in columns.items()}
    except BaseException:
        f.close()
        raise
    width = max(index.values()) + 1

    def rows_of(reader):
        try:
            yield from reader
        except UnicodeDecodeError as exc:
            raise _not_utf8(file_path, exc, f"after line {reader.line_num}") from None
        except csv.Error as exc:  # a field over csv's size limit, a NUL byte, an unclosed quote at the end
            raise ValueError(f"{file_path} line {reader.line_num}: cannot read it as {fmt.upper()} ({exc}); check the "
                             f"delimiter ({delimiter!r}) and the quoting (a stray '\"' makes the rest of the file one "
                             "field)") from None

    def chunks():
        with f:
            rows, lines = [], []
            for row in rows_of(reader):
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank line
                if len(row) < width:
                    role = next(r for r, i in index.items() if i >= len(row))
                    raise ValueError(f"{file_path} line {reader.line_num} has {len(row)} field(s) but the {role} "
                                     f"column is column {index[role]} (0-based); check the delimiter "
                                     f"({delimiter!r}) and the column options")
                rows.append(row)
                lines.append(reader.line_num)
                if len(rows) == READ_CHUNK:
                    yield {role: [r[i].strip() for r in rows] for role, i in index.items()}, np.array(lines)
                    rows, lines = [], []
            if rows:
                yield {role: [r[i].strip() for r in rows] for role, i in index.items()}, np.array(lines)

    info = {"header": names, "delimiter": delimiter, "columns": index}
    return info, chunks()


def _npy_chunks(file_path: str, columns: dict[str, Any]) -> tuple[dict, Iterator[tuple[dict, np.ndarray]]]:
    """Chunks of an ``(E, k)`` array (columns by index) or of a structured array (columns by field name)."""
    array = open_npy(file_path, "interactions")
    names = list(array.dtype.names) if array.dtype.names else None
    if names is None and array.ndim != 2:
        raise ValueError(f"{file_path} has shape {array.shape}; an interaction array must be (E, k), one row per "
                         "interaction, with user ids in one column and item ids in another")
    if names is not None:
        index = {role: names[_column_index(spec, names, role, file_path)] for role, spec in columns.items()}
    else:
        index = {role: _column_index(spec, None, role, file_path) for role, spec in columns.items()}
        bad = {role: i for role, i in index.items() if i >= array.shape[1]}
        if bad:
            raise ValueError(f"{file_path} has {array.shape[1]} columns but the {', '.join(bad)} column is "
                             f"{', '.join(map(str, bad.values()))} (0-based)")

    def chunks():
        for start in range(0, array.shape[0], READ_CHUNK):
            block = np.asarray(array[start:start + READ_CHUNK])
            cols = {role: block[i] if names else block[:, i] for role, i in index.items()}
            yield cols, np.arange(start, start + block.shape[0])  # 0-based row numbers

    return {"header": names, "columns": index}, chunks()


def show(value: Any) -> str:
    """A value as the user wrote it (numpy scalars as plain Python)."""
    return repr(value.item() if hasattr(value, "item") else value)


def is_number(text: Any) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


# -- timestamps and split names -----------------------------------------------------------------------------------

def _timestamps(values, lines: np.ndarray, where: str, kind: list) -> np.ndarray:
    """Seconds (or the file's own numeric unit) as float64; ``kind`` keeps numeric vs date across chunks."""
    values = np.asarray(values)
    if values.dtype.kind in "iuf":
        parsed, this = values.astype(np.float64), "number"
    else:
        try:
            parsed, this = values.astype(np.float64), "number"
        except ValueError:
            numeric = np.fromiter((is_number(v) for v in values.tolist()), bool, values.size)
            if numeric.any():  # numpy would read a number such as "100" as the year 100
                number, date = int(np.argmax(numeric)), int(np.argmin(numeric))
                raise ValueError(f"{where} {lines[date]}: timestamps mix numbers and dates ({show(values[number])} "
                                 f"on line {lines[number]}, {show(values[date])} here); use one kind") from None
            try:
                dates = values.astype("datetime64[s]")
            except ValueError:
                bad = next((j for j, v in enumerate(values.tolist()) if not _is_date_or_number(v)), 0)
                raise ValueError(f"{where} {lines[bad]}: timestamp {show(values[bad])} is neither a number nor an "
                                 "ISO 8601 date (e.g. 2024-05-01 or 2024-05-01T12:30:00)") from None
            parsed = np.where(np.isnat(dates), np.nan, dates.astype(np.int64).astype(np.float64))
            this = "date"
    if kind and kind[0] != this:
        raise ValueError(f"{where} {lines[0]}: timestamps mix numbers and dates ({this}s after {kind[0]}s); "
                         "use one kind")
    kind[:] = [this]
    missing = np.flatnonzero(~np.isfinite(parsed))
    if missing.size:
        raise ValueError(f"{where} {lines[missing[0]]}: the timestamp is missing, NaN or infinite "
                         f"({show(values[missing[0]])}); fill it in or drop the row")
    return parsed


def _is_date_or_number(text: Any) -> bool:
    if is_number(text):
        return True
    try:
        np.datetime64(text, "s")
    except ValueError:
        return False
    return True


def _split_codes(values, lines: np.ndarray, where: str) -> np.ndarray:
    values = np.char.lower(np.char.strip(np.asarray(values).astype(str)))
    uniques, inverse = np.unique(values, return_inverse=True)
    unknown = [u for u in uniques.tolist() if u not in SPLIT_VALUES]
    if unknown:
        bad = int(np.flatnonzero(values == unknown[0])[0])
        raise ValueError(f"{where} {lines[bad]}: split {unknown[0]!r} is not one of "
                         f"{', '.join(SPLIT_VALUES)}")
    return np.array([SPLIT_VALUES[u] for u in uniques.tolist()], dtype=np.int8)[inverse.reshape(-1)]


# -- the whole file -----------------------------------------------------------------------------------------------

def read_interactions(file_path: str, fmt: str, columns: dict, header: bool | None, delimiter: str | None,
                      spaces: dict, progress: bool) -> tuple[dict, dict[str, np.ndarray]]:
    """The file's columns as arrays (ids as codes of ``spaces``, timestamps as floats, split names as part
    codes, and each row's line number), chunk by chunk; ``info`` says what was read."""
    if fmt == "npy":
        info, chunks = _npy_chunks(file_path, columns)
    else:
        info, chunks = _text_chunks(file_path, fmt, columns, header, delimiter)
    info["unit"] = "row" if fmt == "npy" else "line"
    where = info["where"] = f"{file_path} {info['unit']}"  # errors name the line (of a .npy file: the row)
    parts: dict[str, list] = {role: [] for role in ("user", "item", "time", "split", "line")}
    time_kind: list = []
    with converter_progress(progress, desc="interactions", unit="row") as bar:
        for cols, lines in chunks:
            parts["user"].append(spaces["users"].encode(cols["user"], lines, where))
            parts["item"].append(spaces["items"].encode(cols["item"], lines, where))
            if "time" in cols:
                parts["time"].append(_timestamps(cols["time"], lines, where, time_kind))
            if "split" in cols:
                parts["split"].append(_split_codes(cols["split"], lines, where))
            parts["line"].append(lines)
            bar.update(lines.size)
    if not parts["line"]:
        after = "" if info["header"] is None else f" after its header line ({', '.join(map(str, info['header']))})"
        raise ValueError(f"{file_path} holds no interactions{after}; it needs one row per (user, item) interaction"
                         + (" (if that line is data, pass header=False, CLI: --no-header)" if after else ""))
    return info, {role: np.concatenate(chunks_) for role, chunks_ in parts.items() if chunks_}
