"""Short measurements the planner's model takes its constants from, kept in a file between plans.

- storage: random reads of distinct rows of the dataset's own feature file
  (on a heterogeneous graph each featured node type's file, on its own)
  through the run's backend and queue depth, at a few batch sizes; a line
  fitted through (reads issued, seconds) gives a fixed cost per batch and a
  cost per read (its inverse is the IOPS at that queue depth);
- memcpy: bandwidth of copying rows of the dataset's row size (what a cache
  hit costs at best), for reference beside the per-id cache cost;
- train: a short run of the trainer itself, features served by a storage
  that reads nothing, so the train and sample stages are measured as a run
  sees them (the loader thread sampling beside the training step).

Each part is stored under a key of everything it depends on (the feature
file's identity, backend, queue depth, model, batches, threads), so a plan
over another cache size or policy reuses it and a changed setting measures
again.

A calibration taken while other work loads the machine is wrong for every
plan after it, so each part is measured several times (:func:`repeated`:
more while its runs disagree) and stored with its spread, its date and how
busy other processes kept the cores meanwhile; :func:`trust_warnings` says
what a plan should not trust, and :func:`out_of_range` finds a stored memcpy
far below what the machine copies now.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import resource
import statistics
import tempfile
import time

import numpy as np
import torch

from lsm_gnn.utils.fileio import NotOurFileError, atomic_write_bytes, check_output_file
from lsm_gnn.planner.simulate import ReadGeometry, trace_features
from lsm_gnn.training.resources import training_threads
from lsm_gnn.utils.timing import median_seconds

CALIBRATION_VERSION = 6  # 6: the training part measures the node embeddings' update
#: a part whose runs' main figure spreads wider than this (range over median) is measured again, then reported
STEADY_SPREAD = 0.15
#: each part's main figure: what its spread is judged by
MAIN_FIGURE = {"storage": "per_read_us", "memcpy": "memcpy_gb_per_s", "train": "train_ms"}
#: cores other processes may keep busy during a calibration before a plan warns of it
OTHER_LOAD_WARNING = 0.25
DEFAULT_FILE = os.path.join(os.path.expanduser("~"), ".cache", "lsm-gnn", "plan-calibration.json")


CALIBRATION_FORMAT = "lsm-gnn-plan-calibration"


class CalibrationStore:
    """A JSON file of calibration entries by key. A missing file counts as empty, as does one of an older
    calibration version; a file that is not a calibration (a dataset's ``meta.json``, a damaged file, a
    directory) is refused, never written over."""

    def __init__(self, path: str | None):
        self.path = path
        self.entries: dict = {}
        if not path:
            return
        if os.path.lexists(path):
            data = self._read(path)
            if data.get("version") == CALIBRATION_VERSION:
                self.entries = data["entries"]
        else:  # a new file: refuse a path that cannot be written now, not after measuring
            directory = os.path.dirname(os.path.abspath(path))
            if path == DEFAULT_FILE:  # the planner's own cache directory: made on first use
                os.makedirs(directory, exist_ok=True)
            check_output_file(path, "--calibration")

    @staticmethod
    def _read(path: str) -> dict:
        """The calibration at ``path``; ValueError naming the file when it is not one (nothing is written)."""
        fix = ("give --calibration another file (or 'none' to measure every time), or delete that file if it is "
               "a calibration of yours you can lose")
        if os.path.islink(path) or not os.path.isfile(path):
            raise NotOurFileError(f"--calibration {path} is not a regular file; it is left as it is: {fix}")
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError) as exc:
            raise NotOurFileError(f"--calibration {path} is not a calibration file this planner wrote "
                                  f"({type(exc).__name__}: {exc}); it is left as it is: {fix}") from None
        ours = isinstance(data, dict) and isinstance(data.get("entries"), dict) and isinstance(
            data.get("version"), int) and data.get("format", CALIBRATION_FORMAT) == CALIBRATION_FORMAT
        if not ours:
            raise NotOurFileError(f"--calibration {path} is a JSON file but no calibration of lsm-gnn plan (it has no "
                                  f"'version' and 'entries'); it is left as it is: {fix}")
        return data

    @staticmethod
    def key(kind: str, identity: dict) -> str:
        text = json.dumps({"kind": kind, **identity}, sort_keys=True, default=str)
        return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def get_or_measure(self, kind: str, identity: dict, measure, refresh: bool = False) -> tuple[dict, bool]:
        """(the entry, whether it came from the file)."""
        key = self.key(kind, identity)
        if not refresh and key in self.entries:
            return self.entries[key]["value"], True
        value = measure()
        self.entries[key] = {"identity": identity, "value": value, "measured_at": time.time()}
        self.save()
        return value, False

    def save(self) -> None:
        if not self.path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if os.path.lexists(self.path):
            self._read(self.path)  # still a calibration: nothing else took its place while this one measured
        document = {"format": CALIBRATION_FORMAT, "version": CALIBRATION_VERSION, "entries": self.entries}
        atomic_write_bytes(json.dumps(document, indent=1).encode(), self.path)


def machine_busy_seconds() -> float | None:
    """CPU seconds every process of the machine has spent busy since boot (``/proc/stat``), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def repeated(measure, figure: str, repeats: int = 3, most: int = 5, spread_limit: float = STEADY_SPREAD) -> dict:
    """``measure()`` run ``repeats`` times, and again (up to ``most``) while ``figure`` spreads wider than
    ``spread_limit``; the run with the median ``figure``, and beside it ``spread`` (the runs' range over their
    median), ``figures`` (every run's), ``other_load`` (cores other processes kept busy meanwhile, from
    ``/proc/stat`` less this process's CPU time; None off Linux) and ``measured_at`` (Unix seconds)."""
    runs: list[dict] = []
    busy, own, start = machine_busy_seconds(), process_cpu_seconds(), time.perf_counter()
    while len(runs) < repeats or (len(runs) < most and spread_of([r[figure] for r in runs]) > spread_limit):
        runs.append(measure())
    wall = time.perf_counter() - start
    other = None
    if busy is not None and wall > 0:
        other = max(machine_busy_seconds() - busy - (process_cpu_seconds() - own), 0.0) / wall
    figures = [r[figure] for r in runs]
    middle = sorted(runs, key=lambda r: r[figure])[len(runs) // 2]
    return {**middle, "spread": spread_of(figures), "figures": figures, "other_load": other,
            "measured_at": time.time()}


def spread_of(values) -> float:
    """Range over median (0 for fewer than two values)."""
    values = sorted(values)
    if len(values) < 2:
        return 0.0
    middle = values[len(values) // 2]
    return (values[-1] - values[0]) / middle if middle else float("inf")


def trust_warnings(calibration: dict) -> list[str]:
    """What a plan should not trust in ``calibration`` ({part: its measurement}): parts whose runs disagreed
    and parts measured while other processes kept cores busy."""
    warnings = []
    parts = [(part, part, value) for part, value in calibration.items() if part in MAIN_FIGURE]
    # a heterogeneous graph's feature files, each calibrated on its own
    parts += [(f"storage of {t}", "storage", value) for t, value in calibration.get("storage_by_type", {}).items()]
    for part, kind, value in parts:
        if not isinstance(value, dict):
            continue
        spread, other = value.get("spread"), value.get("other_load")
        if spread is not None and spread > STEADY_SPREAD:
            warnings.append(f"the {part} calibration's runs differ by {spread:.0%} ({MAIN_FIGURE[kind]} "
                            f"{', '.join(f'{x:.3g}' for x in value['figures'])}): its figure is uncertain")
        if other is not None and other > OTHER_LOAD_WARNING:
            warnings.append(f"other processes kept {other:.1f} core(s) busy while {part} was calibrated: "
                            "recalibrate on a quiet machine (lsm-gnn plan --recalibrate)")
    return warnings


def out_of_range(stored: dict, now: dict, floor: float = 0.2) -> str | None:
    """Why a stored memcpy calibration cannot be this machine's (below ``floor`` x what it copies ``now``, a
    short probe), or None: such a calibration was taken under load, and every part taken with it is suspect.
    The floor is wide: a copy of cache-sized rows varies 2-3x between quiet runs of one machine."""
    have, can = stored.get("memcpy_gb_per_s", 0.0), now["memcpy_gb_per_s"]
    if have < floor * can:
        return (f"the stored calibration's memcpy ({have:.2f} GB/s) is below {floor:.0%} of what this machine "
                f"copies now ({can:.2f} GB/s)")
    return None


def file_identity(path: str) -> dict:
    st = os.stat(path)
    return {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def measure_storage(dataset, backend: str, batch_sizes=(64, 512, 4096), seconds: float = 0.5, seed: int = 0) -> dict:
    """Seconds per batch of random distinct rows = fixed + per_read x reads, fitted over ``batch_sizes``
    (capped at the node count); each size is read for about ``seconds``. The storage is opened as a run
    opens it (the backend's default queue depth). ``cpu_fraction``: the share of that time the CPU was busy
    (submitting, reaping, copying rows out), which competes with training for cores."""
    from lsm_gnn.storage import open_storage

    rng = np.random.default_rng(seed)
    xs, ys = [], []
    cpu_s = wall_s = 0.0
    with open_storage(dataset, backend) as storage:
        geometry = read_geometry(dataset, getattr(storage, "alignment", 512))
        queue_depth = getattr(storage, "queue_depth", None)
        sizes = sorted({min(int(b), dataset.num_nodes) for b in batch_sizes})
        for size in sizes:
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                ids = torch.from_numpy(rng.choice(dataset.num_nodes, size, replace=False))
                reads = geometry.plan(ids)[1]
                t, cpu = time.perf_counter(), process_cpu_seconds()
                storage.read(ids)
                xs.append(reads)
                ys.append(time.perf_counter() - t)
                cpu_s, wall_s = cpu_s + process_cpu_seconds() - cpu, wall_s + ys[-1]
        direct = getattr(storage, "direct", None)
    fixed, per_read = fit_line(xs, ys)
    return {"backend": backend, "queue_depth": queue_depth, "fixed_ms": 1e3 * fixed, "per_read_us": 1e6 * per_read,
            "iops": 1.0 / per_read if per_read > 0 else float("inf"), "samples": len(xs), "direct": direct,
            "alignment": geometry.alignment, "cpu_fraction": min(cpu_s / wall_s, 1.0) if wall_s else 0.0}


def process_cpu_seconds() -> float:
    """CPU seconds of this process, every thread (a pread backend reads on a team of threads), user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fit_line(xs, ys) -> tuple[float, float]:
    """Least-squares (intercept, slope), both clamped at >= 0 (a negative cost is noise)."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    if x.size < 2 or np.ptp(x) == 0:
        return 0.0, float(y.mean() / max(x.mean(), 1.0)) if y.size else 0.0
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:  # through the origin instead
        return 0.0, float((x * y).sum() / (x * x).sum())
    return float(intercept), max(float(slope), 0.0)


def read_geometry(dataset, alignment: int = 512) -> ReadGeometry:
    """The read plan's inputs for ``dataset``, reads aligned to ``alignment`` (the open storage's O_DIRECT
    alignment)."""
    layout = dataset.features
    return ReadGeometry(dataset.num_nodes, layout.row_bytes, layout.row_stride, os.path.getsize(dataset.feature_path),
                        int(alignment))


def measure_memcpy(dim: int, dtype: torch.dtype, rows: int = 4096, pool_bytes: int = 64 << 20,
                   repeats: int = 20) -> dict:
    """GB/s of a plain copy (``memcpy_gb_per_s``) and of gathering ``rows`` random rows of ``dim`` x
    ``dtype`` from a pool with ``index_select`` (``row_gather_gb_per_s``: what copying cache hits out costs)."""
    row_bytes = dim * torch.empty((), dtype=dtype).element_size()
    pool = torch.ones((max(pool_bytes // row_bytes, rows), dim), dtype=dtype)  # ones: every page touched
    out = torch.empty((rows, dim), dtype=dtype)
    idx = torch.randint(0, pool.shape[0], (rows,))

    gather_s = median_seconds(lambda: torch.index_select(pool, 0, idx, out=out), repeats)
    copy_s = median_seconds(lambda: out.copy_(pool[:rows]), repeats)
    return {"row_bytes": row_bytes, "memcpy_gb_per_s": rows * row_bytes / copy_s / 1e9,
            "row_gather_gb_per_s": rows * row_bytes / gather_s / 1e9}


def calibration_config(cfg, work_dir: str, iterations: int, node_types=()):
    """``cfg``'s run cut to its first ``iterations`` training steps, for timing them: no evaluation (nor what
    watches one: early stopping), no checkpoint, its log and any node embedding table in ``work_dir``, never the
    user's (each of ``node_types``' in a directory of its own). Valid
    wherever ``cfg`` is, whatever keys it sets."""
    from lsm_gnn.config import EarlyStoppingConfig, build_config

    settings = cfg.to_dict()
    # Epochs enough for the steps however short an epoch is; the iteration limit ends the run.
    settings["train"].update(max_iterations=iterations, eval_splits=[], epochs=iterations,
                             early_stopping=dataclasses.asdict(EarlyStoppingConfig()))
    settings["log"].update(dir=work_dir, progress=False, tensorboard=False, every=1)
    settings["checkpoint"].update(dir="", resume=False)
    embedding = settings["model"]["node_embedding"]
    tables = os.path.join(work_dir, "node_embedding")  # fresh tables: the user's left as they are
    embedding["path"] = tables
    for own in embedding["types"].values():
        own.pop("path", None)
    for t in node_types:  # each type's table in a directory of its own (the section's path would be every type's)
        embedding["types"].setdefault(t, {})["path"] = os.path.join(tables, t)
    return build_config(settings)


def measure_training(cfg, dataset, steps: int = 32, skip: int = 3) -> dict:
    """The trainer itself for ``steps`` iterations, features from a storage that reads nothing; means of
    the per-iteration train, sample and (with node embeddings) update stages after ``skip`` warm-up
    iterations."""
    from lsm_gnn.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="lsm-gnn-plan-") as log_dir:
        run_cfg = calibration_config(cfg, log_dir, steps + skip, dataset.node_types)
        features = trace_features(dataset)
        if not cfg.model.node_embedding.features:  # the run reads none: its own path (no storage) is the run's
            features = None
        trainer = Trainer(run_cfg, out=io.StringIO(), features=features)
        trainer.fit()
        with open(os.path.join(log_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
    times = [r["time"] for r in records if "iteration" in r][skip:]
    if not times:
        raise ValueError("the training calibration ran no iterations; does the train split have seeds?")
    # Means, as a run's stage times are: on a shared machine the step time swings between modes (another
    # job takes a core from training's thread team) for seconds at a time, and a median picks one mode.
    return {"steps": len(times), "train_ms": 1e3 * statistics.fmean(t["train"] for t in times),
            "sample_ms": 1e3 * statistics.fmean(t["sample"] for t in times),
            # the optimizer's step on the batch's node embeddings (0 without): after train, before the next read
            "update_ms": 1e3 * statistics.fmean(t.get("update", 0.0) for t in times),
            "torch_threads": training_threads(cfg.train.threads)}
