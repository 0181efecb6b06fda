"""A run's metrics log (``log.dir/metrics.jsonl``) read back for ``lsm-gnn plot`` and ``lsm-gnn report``: every
record checked, field by field, before anything draws or prints it.

The log is JSON lines that :mod:`lsm_gnn.training.metrics` writes: ``{"iteration": ...}`` per logged
iteration, ``{"evaluation": {...}}``, ``{"epoch_summary": {...}}`` and one ``{"run_summary": {...}}``. A log
from a shared folder or a download may hold anything, so :func:`read_log` returns only records whose every field
used has the type and range the trainer writes; a line it cannot use is skipped with one warning naming the
file, the line and the field, and a file that holds no record at all is refused as no metrics log.
"""
from __future__ import annotations

import json
import math
import os
import sys

SPLITS = ("train", "val", "test")
#: the record kinds, each by the key that marks it
KINDS = ("iteration", "evaluation", "epoch_summary", "run_summary")
MAX_COUNT = 2**63 - 1  # what the trainer's counters (int64) can hold
MAX_WARNINGS = 10  # lines named one by one; the rest are counted


class Unusable(ValueError):
    """A field of a record that cannot be used as it is: ``field`` names it (``run_summary.best.epoch``)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field


def _shown(value) -> str:
    """``value`` as JSON, cut short (control characters escaped: it goes to a terminal)."""
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _name(key: str) -> str:
    """A key as a field's name in a message: as it is, or as JSON where it holds what a terminal would act on."""
    return key if key.isprintable() and len(key) <= 40 else _shown(key)


# -- checks: each takes (value, field name) and returns the value to use, or raises Unusable ---------------------

def optional(check):
    """``check``, or None for a missing field or a null."""
    def check_value(value, field):
        return None if value is None else check(value, field)
    check_value.optional = True
    return check_value


def count(value, field):
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise Unusable(field, f"{_shown(value)} is no count (a whole number from 0)")
    return value


def real(low: float = -math.inf, high: float = math.inf, nan: bool = False):
    """A finite number in [low, high] (NaN too where ``nan``: an epoch without iterations has no mean loss)."""
    def check_value(value, field):
        try:
            number = float(value) if type(value) in (int, float) else None
        except OverflowError:
            number = None
        if number is None or not (math.isfinite(number) and low <= number <= high or nan and math.isnan(number)):
            span = "a number" if (low, high) == (-math.inf, math.inf) else \
                f"a number from {low:g}" if high == math.inf else f"a number in [{low:g}, {high:g}]"
            raise Unusable(field, f"{_shown(value)} is not {span}")
        return number
    return check_value


ratio = real(0.0, 1.0)
seconds = real(0.0)


def boolean(value, field):
    if type(value) is not bool:
        raise Unusable(field, f"{_shown(value)} is not true or false")
    return value


def text(value, field):
    if type(value) is not str:
        raise Unusable(field, f"{_shown(value)} is not a string")
    return value


def choice(*choices):
    def check_value(value, field):
        if type(value) is not str or value not in choices:
            raise Unusable(field, f"{_shown(value)} is not one of {', '.join(choices)}")
        return value
    return check_value


def each(check):
    """An object whose every value passes ``check`` (its keys are names: stages, node types, metrics)."""
    def check_value(value, field):
        if type(value) is not dict:
            raise Unusable(field, f"{_shown(value)} is not an object")
        return {key: check(item, f"{field}.{_name(key)}") for key, item in value.items()}
    return check_value


def items(check):
    """A list whose every item passes ``check``."""
    def check_value(value, field):
        if type(value) is not list:
            raise Unusable(field, f"{_shown(value)} is not a list")
        return [check(item, f"{field}[{i}]") for i, item in enumerate(value)]
    return check_value


def fields(spec: dict):
    """An object with ``spec``'s fields (others are left out): each checked, a missing one refused unless
    optional."""
    def check_value(value, field):
        if type(value) is not dict:
            raise Unusable(field, f"{_shown(value)} is not an object")
        out = {}
        for key, check in spec.items():
            name = f"{field}.{key}" if field else key
            if key not in value and not getattr(check, "optional", False):
                raise Unusable(name, "is missing")
            out[key] = check(value.get(key), name)
        return out
    return check_value


_metrics = each(optional(real()))  # a split's metrics ("count" among them); null: not measured
_splits = {split: optional(_metrics) for split in SPLITS}
_embedding = {"embedding_hit_ratio": optional(ratio), "embedding_bytes_read": optional(count),
              "embedding_bytes_written": optional(count)}

#: each record kind's fields, as the trainer writes them (lsm_gnn.training.metrics)
CHECKS = {
    "iteration": fields({"iteration": count, "epoch": optional(count), "loss": real(), "time": each(seconds),
                         "hit_ratio": optional(ratio), "hit_ratio_by_type": optional(each(optional(ratio))),
                         "bytes_read": count, **_embedding}),
    "evaluation": fields({"iterations": count, "epoch": optional(count), "seconds": optional(seconds), **_splits}),
    "epoch_summary": fields({"epoch": count, "complete": boolean, "iterations": count, "loss": real(nan=True),
                             "wall_s": seconds, "hit_ratio": optional(ratio),
                             "hit_ratio_by_type": optional(each(optional(ratio))), "bytes_read": count,
                             "pipeline_efficiency": optional(real(0.0)), **_embedding, **_splits}),
    "run_summary": fields({"iterations": count, "eval": optional(fields(_splits)),
                           "best": optional(fields({"metric": text, "mode": choice("min", "max"), "value": real(),
                                                    "epoch": count, "iterations": count,
                                                    "checkpoint": optional(text), "stopped_early": optional(boolean),
                                                    "eval": optional(fields(_splits))}))}),
}


def log_file(path: str) -> str:
    """The metrics log of ``path``, a run's log.dir or the file itself."""
    return os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path


def check_record(record) -> tuple[str, dict]:
    """(kind, the record's fields as checked) of one parsed line; Unusable names what cannot be used."""
    kind = next((k for k in KINDS if k in record), None) if type(record) is dict else None
    if kind is None:
        raise Unusable("record", f"{_shown(record)} is no record of an lsm-gnn run (an object with one of the keys "
                                 f"{', '.join(KINDS)})")
    return kind, CHECKS[kind](record if kind == "iteration" else record[kind], "" if kind == "iteration" else kind)


def read_log(path: str) -> dict:
    """The checked records of the metrics log at ``path`` (a log.dir or its metrics.jsonl), in file order:
    ``{"iterations": [...], "evaluations": [...], "epochs": [...], "summary": run summary or None}``. A line that
    is no usable record is skipped with a warning on stderr (``FILE:LINE: FIELD: why``); a file with no record at
    all, or with no iteration, raises ValueError."""
    file = log_file(path)
    if not os.path.isfile(file):
        raise ValueError(f"no metrics log at {file}: give a run's log.dir (or its metrics.jsonl)")
    log, skipped = {"iterations": [], "evaluations": [], "epochs": [], "summary": None}, []
    lists = {"iteration": log["iterations"], "evaluation": log["evaluations"], "epoch_summary": log["epochs"]}
    with open(file, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                kind, record = check_record(json.loads(line.decode("utf-8")))
            except UnicodeDecodeError:
                skipped.append((number, "not UTF-8 text"))
            except (ValueError, RecursionError) as exc:  # JSON's errors, Unusable among them
                skipped.append((number, str(exc) if isinstance(exc, Unusable) else "not JSON"))
            else:
                if kind == "run_summary":
                    log["summary"] = record
                else:
                    lists[kind].append(record)
    if not any(log.values()):
        why = f" (line {skipped[0][0]}: {skipped[0][1]})" if skipped else " (it is empty)"
        raise ValueError(f"{file} is not an lsm-gnn metrics log: it holds no record of a run{why}; give a run's "
                         "log.dir (or its metrics.jsonl)")
    for number, why in skipped[:MAX_WARNINGS]:
        print(f"lsm-gnn: warning: {file}:{number}: {why}; the line is skipped", file=sys.stderr)
    if len(skipped) > MAX_WARNINGS:
        print(f"lsm-gnn: warning: {file}: {len(skipped) - MAX_WARNINGS} more lines skipped", file=sys.stderr)
    if not log["iterations"]:
        raise ValueError(f"{file} holds no usable iteration records (log.every larger than the run?)")
    return log
