"""``make_plan``: predicted hit ratio, bytes read and ms per iteration by stage over a grid of caches.

Steps: record the run's trace (its own loader, no I/O); calibrate storage,
memcpy and a few training steps (or reuse a stored calibration); replay the
trace through each cache of the grid; feed the stage times to the model
(:mod:`lsm_gnn.planner.model`). The run modelled is the trainer's on one
rank for ``iterations`` iterations, evaluation left out.

With ``model.node_embedding`` the run also reads (and updates) its node embedding table through a cache of its
own, built and sized by the run's functions (:func:`lsm_gnn.build.embedding_cache_spec`): each grid point
replays the trace through that cache too, over a table that reads and writes nothing
(:func:`~lsm_gnn.planner.simulate.simulate_table`), for its hits, bytes read and bytes written; their time joins
the model's ``embedding`` stage, and the calibrated optimizer step its ``update``. A run of embeddings alone
(``model.node_embedding.features=false``) has no features' cache: its rows hold the table's alone.

The run has one cache per feature group (node types of one row format,
:func:`lsm_gnn.build.build_features`; a graph of one node type has one), each
with its share of the budget (:func:`lsm_gnn.build.resolve` sizes it as for the
run): the trace holds each group's ids as its window does, each group's cache
is replayed on its own, the groups' hits, bytes and reads are summed, and each
node type's feature file is calibrated on its own (the loader reads them one
after another). A plan reports as its run does: by node type where the run's
batches are typed, plain on a graph of one node type (:func:`_reported`).
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import os
import statistics
import sys
import time

import torch

from lsm_gnn.config import Config, ConfigError
from lsm_gnn.loader import NodeLoader
from lsm_gnn.utils.memcap import available_memory
from lsm_gnn.planner import calibrate
from lsm_gnn.planner.model import StageMs, bound_stage, contended_ms, recommend, run_ms
from lsm_gnn.planner.simulate import (TraceStorage, TraceTable, on_loader_thread, record_trace, simulate_cache,
                                      simulate_table, table_geometry, trace_features)
from lsm_gnn.training.resources import training_threads
from lsm_gnn.storage.base import TORCH_DTYPES
from lsm_gnn.training.metrics import ratios_text


#: batches the loader may queue ahead of training (NodeLoader's ``prefetch``, which the tasks leave at its default)
LOADER_QUEUE = inspect.signature(NodeLoader).parameters["prefetch"].default


def stage_times(storage_cal: dict, train_cal: dict, cache_ms: float, reads, read_ahead: bool = False,
                embedding_ms: float = 0.0) -> StageMs:
    """One iteration's stages: the calibrated sample, train and update (the node embeddings' optimizer step),
    the simulated cache time, the calibrated cost of ``reads`` storage reads (none: no storage call at all),
    read ahead or not, and ``embedding_ms`` (:func:`table_ms`).

    ``reads`` is {file: count} with ``storage_cal`` {file: its calibration}: the feature files, read one after
    another (a graph of one node type's one)."""
    read_ms = read_cpu = 0.0
    for name, count in reads.items():
        ms = storage_cal[name]["fixed_ms"] + 1e-3 * storage_cal[name]["per_read_us"] * count if count else 0.0
        read_ms, read_cpu = read_ms + ms, read_cpu + ms * storage_cal[name]["cpu_fraction"]
    return StageMs(sample=train_cal["sample_ms"], cache=cache_ms, read=read_ms, train=train_cal["train_ms"],
                   read_cpu=read_cpu, read_ahead=read_ahead, embedding=embedding_ms,
                   update=train_cal.get("update_ms", 0.0))


def table_ms(storage_cal: dict, cache_ms: float, reads: float, writes: float) -> float:
    """One iteration's reading of a node embedding table through its cache: the cache's own work, the table's
    reads at the storage calibration's cost (a file read as the features' is), and its row writes at that
    calibration's cost per read each (a write is uncalibrated: a buffered pwrite of a row into the page cache,
    at most what a read costs)."""
    ms = cache_ms + 1e-3 * storage_cal["per_read_us"] * writes
    return ms + (storage_cal["fixed_ms"] + 1e-3 * storage_cal["per_read_us"] * reads if reads else 0.0)


def reads_ahead(spec) -> bool:
    """Whether the run's cache reads misses ahead: ``cache.read_ahead`` as given, or its default (misses from a
    disk: :class:`~lsm_gnn.cache.SoftwareCache`), on the CPU or a GPU alike."""
    from lsm_gnn.cache.read_ahead import default_depth

    if spec.read_ahead is not None:
        return spec.read_ahead > 0
    return spec.source == "cache" and default_depth(spec.backend not in ("memory", "gds")) > 0


def _log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def grid_configs(cfg: Config, sizes: list[str], policies: list[str], pvp: list[bool]) -> list[Config]:
    """One config per (policy, PVP, size), sizes innermost, each checked as a run's would be."""
    from lsm_gnn.config import validate

    out = []
    for policy in policies:
        for on in pvp:
            for size in sizes:
                c = copy.deepcopy(cfg)
                c.cache.policy, c.cache.pvp, c.cache.capacity = policy, on, str(size)
                try:
                    out.append(validate(c))
                except ConfigError as exc:
                    raise ConfigError(f"plan grid point policy={policy} pvp={on} size={size}: {exc}") from None
    return out


#: backends whose reads the engine's read plan describes (memory reads nothing; gds is untested on hardware)
PLANNED_BACKENDS = ("auto", "io_uring", "pread", "mmap")


def _check_plannable(cfg: Config, dataset) -> None:
    if cfg.cache.backend not in PLANNED_BACKENDS:
        raise ConfigError(f"lsm-gnn plan models reads from a file (cache.backend in {', '.join(PLANNED_BACKENDS)}), "
                          f"got cache.backend={cfg.cache.backend}")
    if cfg.cache.features != "cache":
        raise ConfigError(f"lsm-gnn plan models the cached path (cache.features=cache), got "
                          f"cache.features={cfg.cache.features}")
    # What the run refuses on this graph, refused before the trace (as the run would).
    from lsm_gnn.build import check_owner
    from lsm_gnn.models import model_form

    if not dataset.feature_types:
        raise ConfigError(f"{dataset.path} has {len(dataset.node_types)} node types and {len(dataset.relations)} "
                          "relations but none with features: lsm-gnn plan models the features' caches")
    model_form(cfg, dataset)
    if cfg.cache.mode == "shared":
        try:
            check_owner(cfg.cache.owner, dataset)
        except ConfigError as exc:
            raise ConfigError(f"lsm-gnn plan cannot plan what runs over several ranks refuse: {exc}") from None


def _training_identity(cfg: Config, dataset) -> dict:
    d = cfg.to_dict()
    files = {t: calibrate.file_identity(dataset.node_type(t).feature_path) for t in dataset.feature_types}
    return {"dataset": files,
            "graph": calibrate.file_identity(os.path.join(dataset.path, "meta.json")),
            "model": d["model"], "sampler": d["sampler"], "task": d["train"]["task"], "device": d["train"]["device"],
            "lr": d["train"]["lr"], "window": d["cache"]["window"], "kernels": d["kernels"],
            "torch_threads": training_threads(cfg.train.threads)}


def make_plan(cfg: Config, *, sizes: list[str], policies: list[str], pvp: list[bool], iterations: int | None = None,
              cores: int | None = None, calibration_file: str | None = calibrate.DEFAULT_FILE,
              recalibrate: bool = False, train_steps: int = 32, storage_seconds: float = 0.5,
              tolerance: float = 0.05, log=_log_to_stderr) -> dict:
    """The plan of ``cfg``'s run over every (policy, PVP, size); see the module docstring. ``iterations``: how many
    of the run's iterations to model (None: all of them, or whole epochs up to :data:`MODELLED_ITERATIONS`)."""
    from lsm_gnn.data import open_dataset
    from lsm_gnn.storage import default_backend

    cores = _check_arguments(cfg, sizes, policies, pvp, iterations, cores, train_steps, storage_seconds, tolerance)
    dataset = open_dataset(cfg.dataset, check="fast")
    _check_plannable(cfg, dataset)
    grid = grid_configs(cfg, sizes, policies, pvp)
    specs = [_grid_spec(c, dataset) for c in grid]  # capacity and policy errors before any work
    backend = default_backend() if cfg.cache.backend == "auto" else cfg.cache.backend
    store = calibrate.CalibrationStore(calibration_file)  # refuses a file that is no calibration before the trace
    typed = trace_features(dataset)
    trace, lengths = _record(cfg, dataset, iterations, log, typed)
    given, iterations = iterations is not None, lengths["modelled"]
    cal, reported = _calibrations(cfg, dataset, backend, store, recalibrate, train_steps, storage_seconds, log,
                                  _busiest_layout(dataset, typed, trace))
    fill_sample_ms = 1e3 * statistics.median(trace.sample_s)
    rows = _plan_rows(grid, specs, dataset, typed, trace, iterations, cal, cores, fill_sample_ms, log)
    best = recommend([r for r in rows if "error" not in r], tolerance)
    return {"dataset": _dataset_summary(dataset, typed),
            "run": {"fanouts": cfg.sampler.fanouts, "batch_size": cfg.sampler.batch_size, "model": cfg.model.kind,
                    "hidden": cfg.model.hidden, "window": cfg.cache.window, "iterations": iterations,
                    "run_iterations": lengths["run"], "epochs": cfg.train.epochs,
                    "max_iterations": cfg.train.max_iterations, "iterations_given": given,
                    "trace_memory": lengths.get("memory"), "cores": cores,
                    "train_threads": cal["train"]["torch_threads"],
                    "backend": backend, "epoch_length": trace.epoch_length,
                    "nodes_per_batch": trace.nodes_per_batch, "fill_sample_ms": fill_sample_ms},
            "calibration": {**reported, "file": calibration_file},
            "rows": rows, "tolerance": tolerance, "recommendation": best}


def _check_arguments(cfg: Config, sizes: list[str], policies: list[str], pvp: list[bool], iterations: int | None,
                     cores: int | None, train_steps: int, storage_seconds: float, tolerance: float) -> int:
    """Refuses arguments :func:`make_plan` cannot plan with; returns the cores (default: this machine's)."""
    if iterations is not None and iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if storage_seconds <= 0 or train_steps < 1:
        raise ValueError(f"storage_seconds must be > 0 and train_steps >= 1, got {storage_seconds} and {train_steps}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if not sizes or not policies or not pvp:
        raise ValueError("the plan's grid is empty: give at least one size and one policy")
    cores = (os.cpu_count() or 1) if cores is None else int(cores)
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if not cfg.dataset:
        raise ConfigError("no dataset: give dataset=<directory> (make one with lsm-gnn prepare)")
    return cores


def _dataset_summary(dataset, typed) -> dict:
    """The dataset as a plan reports it: its nodes, per node type with its row format (featureless types: their
    count only), and its feature groups (one cache each)."""
    types = {}
    for t in dataset.node_types:
        layout = dataset.node_type(t).features
        types[t] = {"num_nodes": dataset.num_nodes_of(t)} if layout is None else {
            "num_nodes": dataset.num_nodes_of(t), "row_bytes": layout.row_bytes, "row_stride": layout.row_stride}
    return {"path": dataset.path, "num_nodes": dataset.num_nodes, "target": dataset.target,
            "relations": len(dataset.relations), "node_types": types, "groups": [g.types for g in typed.groups]}


def _busiest_layout(dataset, typed, trace):
    """The row format of the feature group whose rows the trace gathers most bytes of: what the run's hits
    mostly copy (the memcpy calibration's rows)."""
    gathered = [trace.of_group(typed, g).nodes_per_batch * group.features.row_bytes
                for g, group in enumerate(typed.groups)]
    return dataset.node_type(typed.groups[gathered.index(max(gathered))].types[0]).features


#: the trace's ids take at most this share of the memory available (a batch of a large graph holds millions)
TRACE_SHARE = 4

#: the most iterations a plan models by default in whole epochs (a replay costs about 12 ms per iteration and grid
#: point, a trace a batch's ids each), though at least one epoch: a hit ratio over less reads low
MODELLED_ITERATIONS = 1000


def run_length(cfg: Config, epoch_length: int) -> int:
    """The iterations of ``cfg``'s run (its ``train.epochs`` epochs of ``epoch_length``, or ``train.max_iterations``
    where that is less), early stopping aside."""
    epochs = cfg.train.epochs * epoch_length
    return min(epochs, cfg.train.max_iterations) if cfg.train.max_iterations else epochs


def modelled_length(run: int, epoch_length: int, most: int = MODELLED_ITERATIONS) -> int:
    """The iterations a plan models of a run of ``run``: all of them up to ``most``; else as many whole epochs as
    ``most`` holds, at least one whatever its length."""
    if run <= most:
        return run
    epoch_length = max(epoch_length, 1)
    return max(most // epoch_length, 1) * epoch_length


def _record(cfg: Config, dataset, iterations: int | None, log, features):
    """The trace of the run's first ``iterations`` batches (None: :func:`modelled_length` of the run's)
    and its window's, from its own loader (``features``: the graph's null feature groups,
    :func:`trace_features`), and the lengths: ``run``, ``modelled``, and ``memory`` (the trace's budget) where
    that cut the trace short."""
    from lsm_gnn.tasks import make_task

    window = cfg.cache.window
    lengths = {}

    def modelled(epoch_length: int) -> int:
        lengths["run"] = run_length(cfg, epoch_length)
        lengths["modelled"] = iterations or modelled_length(lengths["run"], epoch_length)
        log(f"plan: recording the trace of {lengths['modelled']} iterations (+{window} of window) ...")
        return lengths["modelled"] + window

    t0 = time.perf_counter()
    budget = available_memory()
    trace = record_trace(make_task(cfg, dataset), dataset, modelled, features, None if budget is None else budget // TRACE_SHARE)
    log(f"plan: {len(trace.batches)} batches, {trace.nodes_per_batch:,.0f} input nodes each "
        f"({time.perf_counter() - t0:.1f} s)")
    if len(trace.batches) < lengths["modelled"] + window:  # the memory's share for the trace is full
        lengths["modelled"] = max(len(trace.batches) - window, 1)
        lengths["memory"] = budget // TRACE_SHARE
    return trace, lengths


def modelled_text(run: dict) -> str:
    """What a plan modelled of the run, and how that differs from it."""
    from lsm_gnn.utils.units import format_bytes

    n, total, epoch = run["iterations"], run["run_iterations"], run["epoch_length"]
    epochs = f"{run['epochs']} epoch(s) of {epoch:,}" + (f", train.max_iterations={total:,}" if run["max_iterations"]
                                                         else "")
    if n == total:
        return f"modelled: the run's {total:,} iterations ({epochs})"
    part = f"{n / epoch:g} epoch(s)" if n % epoch == 0 else f"{n / epoch:.2f} of an epoch"
    if run.get("trace_memory"):
        why = (f"as many as a 1/{TRACE_SHARE} share of the memory available holds in the trace "
               f"({format_bytes(run['trace_memory'])})")
    elif run["iterations_given"]:
        why = "as --iterations asks"
    else:
        why = f"the whole epochs within {MODELLED_ITERATIONS:,} iterations (--iterations N models N)"
    return (f"modelled: {n:,} of the run's {total:,} iterations ({epochs}): {part}, {why}; the hit ratio is over "
            f"those, from a cold cache, and ms/it an average over them")


def _calibrations(cfg: Config, dataset, backend: str, store: calibrate.CalibrationStore, recalibrate: bool,
                  train_steps: int, storage_seconds: float, log, layout) -> tuple[dict, dict]:
    """Storage reads (each featured type's file on its own), memcpy (of ``layout``'s rows) and training steps,
    measured (each several times) or reused from ``store``: ``{storage_by_type, memcpy, train}``, and that with
    the ``warnings`` a plan reports beside it. A stored calibration whose memcpy is far below what the
    machine copies now was taken under load: it is measured again, every part."""
    dtype = TORCH_DTYPES[layout.dtype]
    memcpy_identity = {"dim": layout.dim, "dtype": layout.dtype, "cpus": os.cpu_count()}
    stored = store.entries.get(store.key("memcpy", memcpy_identity))
    if stored is not None and not recalibrate:
        why = calibrate.out_of_range(stored["value"], on_loader_thread(calibrate.measure_memcpy, layout.dim, dtype))
        if why is not None:
            log(f"plan: {why}: measuring every part again")
            recalibrate = True

    def measured(kind, identity, measure, what):
        log(f"plan: calibrating {what} ...")
        value, cached = store.get_or_measure(
            kind, identity, lambda: calibrate.repeated(measure, calibrate.MAIN_FIGURE[kind]), refresh=recalibrate)
        if cached:
            log(f"plan: {what}: reused from {store.path}, measured {_when(value.get('measured_at'))}")
        return value

    def storage_of(t):
        source = dataset.node_type(t)
        return measured("storage", {"features": calibrate.file_identity(source.feature_path), "backend": backend},
                        lambda: on_loader_thread(calibrate.measure_storage, source, backend, seconds=storage_seconds),
                        f"{backend} random reads of {t}'s features")

    files = {t: storage_of(t) for t in dataset.feature_types}
    memcpy_cal = measured("memcpy", memcpy_identity,
                          lambda: on_loader_thread(calibrate.measure_memcpy, layout.dim, dtype), "memcpy bandwidth")
    train_cal = measured("train", {**_training_identity(cfg, dataset), "steps": train_steps},
                         lambda: calibrate.measure_training(cfg, dataset, steps=train_steps),
                         f"{train_steps} training steps")

    def storage_text(c):
        return (f"{c['fixed_ms']:.3f} ms + {c['per_read_us']:.1f} us/read ({c['iops']:,.0f} IOPS at QD "
                f"{c['queue_depth']})")

    cal = {"storage_by_type": files, "memcpy": memcpy_cal, "train": train_cal}
    storage = "storage " + ", ".join(f"{t} {storage_text(c)}" for t, c in files.items())
    log(f"plan: {storage}, memcpy {memcpy_cal['memcpy_gb_per_s']:.1f} GB/s (row gather "
        f"{memcpy_cal['row_gather_gb_per_s']:.1f}), train {train_cal['train_ms']:.1f} ms, sample "
        f"{train_cal['sample_ms']:.1f} ms per iteration")
    return cal, {**cal, "warnings": calibrate.trust_warnings(cal)}


#: a row's per node type breakdown, which a plan of a graph of one node type leaves out (:func:`one_type_view`)
BY_TYPE_KEYS = ("hit_ratio_by_type", "rows_by_type", "bytes_read_by_type", "groups")


def one_type_view(plan: dict) -> dict:
    """``plan`` (:func:`make_plan`'s, per node type on every graph) of a graph of one node type in the form its
    run reports: the dataset's one row format, its one feature file's storage calibration as ``storage``, the rows
    without their per-type breakdown. What ``lsm-gnn plan`` prints and writes for such a graph."""
    ds = plan["dataset"]
    (node_type, layout), = ds["node_types"].items()
    calibration = dict(plan["calibration"])
    reported = {"storage": calibration.pop("storage_by_type")[node_type], "memcpy": calibration.pop("memcpy"),
                "train": calibration.pop("train")}
    calibration.pop("warnings", None)

    def row(r):
        return None if r is None else {k: v for k, v in r.items() if k not in BY_TYPE_KEYS}

    return {**plan, "dataset": {"path": ds["path"], "num_nodes": ds["num_nodes"], "row_bytes": layout["row_bytes"],
                                "row_stride": layout["row_stride"]},
            "calibration": {**reported, "warnings": calibrate.trust_warnings(reported), **calibration},
            "rows": [row(r) for r in plan["rows"]], "recommendation": row(plan["recommendation"])}


def _when(timestamp: float | None) -> str:
    """A calibration's date as a plan prints it (UTC)."""
    if timestamp is None:
        return "at an unknown time"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def _embedding_totals(tables: dict) -> dict:
    """A row's node embedding tables (``embedding``: by node type) and their sums as the run logs them
    (``embedding_hit_ratio`` over every table's rows, ``embedding_bytes_read``, ``embedding_bytes_written``)."""
    rows = sum(t["rows"] for t in tables.values())
    return {"embedding": tables,
            "embedding_hit_ratio": sum(t["hit_ratio"] * t["rows"] for t in tables.values()) / rows if rows else None,
            "embedding_bytes_read": sum(t["bytes_read"] for t in tables.values()),
            "embedding_bytes_written": sum(t["bytes_written"] for t in tables.values())}


def _no_features(iterations: int) -> dict:
    """The replay of a run that reads no features (``model.node_embedding.features=false``): no cache, no read."""
    zero = {"unique": 0, "misses": 0, "bytes_read": 0, "reads": 0}
    return {**zero, "hits": 0, "hit_ratio": None, "cache_s": 0.0, "lines": 0, "capacity_bytes": 0,
            "per_iteration": {**zero, "cache_ms": 0.0, "reads_by_type": {}},
            "each": {"cache_ms": [0.0] * iterations, "reads": [0] * iterations,
                     "reads_by_type": [{}] * iterations}}


def checkpoint_iterations(cfg: Config, epoch_length: int, iterations: int) -> frozenset:
    """The iterations (counted from 1) before ``iterations`` after which ``cfg``'s run writes a checkpoint, which
    writes its node embedding tables' dirty rows: each epoch's end and every ``checkpoint.every``; none without a
    ``checkpoint.dir``."""
    if not cfg.checkpoint.dir:
        return frozenset()
    ends = set(range(max(epoch_length, 1), iterations, max(epoch_length, 1)))
    if cfg.checkpoint.every:
        ends |= set(range(cfg.checkpoint.every, iterations, cfg.checkpoint.every))
    return frozenset(ends)


def _table_rows(c: Config, spec, dataset, traces: dict, iterations: int, epoch_length: int, log
                ) -> tuple[dict, dict | None]:
    """(per node embedding table of ``c``'s run (by node type), the replay of its rows' trace (``traces``: each
    table's, by its type) through its cache as the run builds it (:func:`lsm_gnn.build.embedding_cache_spec`,
    :func:`lsm_gnn.build.cached`); None, or the error row of a grid point where one cannot run)."""
    from lsm_gnn.build import cached, embedding_cache_spec, embedding_tables
    from lsm_gnn.embedding import RowLayout

    checkpoints = checkpoint_iterations(c, epoch_length, iterations)
    sims = {}
    for t, e in embedding_tables(c, dataset).items():
        row_bytes = RowLayout(e.dim, e.dtype, e.optimizer).row_bytes
        size, num_rows = spec.embedding_sizes[t], dataset.num_nodes_of(t)
        try:
            # As the features' replay: every read at its lookup, nothing read ahead.
            table_spec = dataclasses.replace(embedding_cache_spec(spec, t), read_ahead=0)

            def make_cache(table, table_spec=table_spec, t=t):
                return cached(table, table_spec, dataset, torch.device("cpu"), node_type=t,
                              num_threads=c.sampler.num_threads)

            sim = on_loader_thread(simulate_table, traces[t], iterations, TraceTable(num_rows, row_bytes),
                                   table_geometry(num_rows, row_bytes), make_cache, c.cache.window, checkpoints)
        except ValueError as exc:  # a table's cache smaller than a batch: the run stops so
            return {}, _error_row(c, spec, exc, log, f"the node embedding cache of {t}: ", size)
        sims[t] = {"capacity": size.text, "capacity_bytes": sim["capacity_bytes"], "lines": sim["lines"],
                   "row_bytes": row_bytes, "rows": sim["rows"], "hit_ratio": sim["hit_ratio"],
                   "bytes_read": sim["bytes_read"],
                   "bytes_written": sim["bytes_written"],
                   "bytes_read_per_iteration": sim["per_iteration"]["bytes_read"],
                   "bytes_written_per_iteration": sim["per_iteration"]["bytes_written"],
                   "reads_per_iteration": sim["per_iteration"]["reads"],
                   "writes_per_iteration": sim["per_iteration"]["writes"], "sim": sim}
    return sims, None


def _row(c: Config, spec, sim: dict, num_rows: int, cal: dict, cores: int, iterations: int, fill_sample_ms: float,
         epoch_length: int, log, tables: dict | None = None, **extra) -> dict:
    """A grid point's row from its replay ``sim`` (``num_rows``: the rows its caches could hold), its node
    embedding tables' (``tables``, :func:`_table_rows`) and the times the model predicts from them; ``extra``
    keys go in before the times. Without a features' cache (embeddings alone) the row's size is the tables'
    caches'."""
    per = sim["per_iteration"]
    features = c.model.node_embedding.features
    ahead = features and reads_ahead(spec)
    tables = tables or {}
    sims = {t: table.pop("sim") for t, table in tables.items()}
    row = {"policy": spec.policy.name, "pvp": spec.pvp, "capacity": c.cache.capacity,
           "capacity_bytes": sim["capacity_bytes"] if features else sum(t["capacity_bytes"] for t in tables.values()),
           "lines": sim["lines"],
           "share_of_nodes": sim["lines"] / num_rows, "hit_ratio": sim["hit_ratio"],
           "bytes_read": sim["bytes_read"], "bytes_read_per_iteration": per["bytes_read"],
           "misses_per_iteration": per["misses"], "reads_per_iteration": per["reads"],
           "unique_per_iteration": per["unique"],
           "read_ahead": ahead, **extra, **(_embedding_totals(tables) if tables else {}),
           **_modelled_ms(sim, cal, cores, iterations, fill_sample_ms, c.cache.window, epoch_length, ahead,
                          list(sims.values()))}
    # a breakdown of several types (of one, it is the total)
    by_type = "" if len(row.get("hit_ratio_by_type", ())) < 2 else f" ({ratios_text(row['hit_ratio_by_type'])})"
    hit = "no features' cache" if row["hit_ratio"] is None else f"hit {row['hit_ratio']:.3f}{by_type}"
    table_hits = "".join(f", {t} table hit {table['hit_ratio']:.3f}" for t, table in tables.items())
    log(f"plan: {row['policy']}{'+pvp' if row['pvp'] else ''} {row['capacity']}: {hit}{table_hits}, "
        f"{row['ms_per_iteration']:.1f} ms/iteration, bound by {row['bound']}")
    return row


def _plan_rows(grid: list[Config], specs: list, dataset, typed, trace, iterations: int, cal: dict, cores: int,
               fill_sample_ms: float, log) -> list[dict]:
    """One row per grid point: the replayed caches' hits and reads and the modelled times, or why one cannot run.
    Per grid point each feature group's cache of ``typed``, built and sized as the run builds it (its size
    resolved with the run's: ``spec.feature_sizes``), replays the group's ids; the groups' counts are summed, and
    on a typed run each node type's kept beside them (``hit_ratio_by_type``, as the trainer reports it). Each node
    type's node embedding table replays its type's ids."""
    from lsm_gnn.build import cache_label, cache_over, group_scores

    groups = [group.types for group in typed.groups]
    traces = [trace.of_group(typed, g) for g in range(len(groups))]
    storages = [TraceStorage.group(dataset, types) for types in groups]
    geometries = [{t: calibrate.read_geometry(dataset.node_type(t), cal["storage_by_type"][t]["alignment"])
                   for t in types} for types in groups]
    featured_rows = sum(dataset.num_nodes_of(t) for t in dataset.feature_types)
    table_traces = {t: trace.of_type(t) for t in dataset.node_types}  # each table's ids, its window's
    rows = []
    for c, spec in zip(grid, specs):
        if isinstance(spec, ValueError):  # a cache under one set: the run would refuse it the same way
            rows.append(_error_row(c, None, spec, log))
            continue
        sims = []
        for types, group_trace, storage, geometry, size in zip(groups, traces, storages, geometries,
                                                               spec.feature_sizes):
            def make_cache(s, types=types, size=size):
                # The replay counts every read at its lookup: nothing read ahead (the model overlaps the reads).
                return cache_over(s, dataclasses.replace(spec, read_ahead=0), size, group_scores(spec, dataset, types),
                                  torch.device("cpu"), c.sampler.num_threads)

            try:
                sims.append(on_loader_thread(simulate_cache, group_trace, iterations, storage, geometry, make_cache,
                                             c.cache.window))
            except ValueError as exc:  # e.g. a group's cache smaller than one batch: the run would stop the same way
                name = cache_label(dataset, types)
                where = "" if name is None else f"the cache of {name}: "
                rows.append(_error_row(c, spec, exc, log, where))
                break
        else:
            tables, error = _table_rows(c, spec, dataset, table_traces, iterations, trace.epoch_length, log)
            if error is not None:
                rows.append(error)
                continue
            # embeddings alone (model.node_embedding.features=false): no features' cache (spec.feature_sizes empty)
            featured = c.model.node_embedding.features
            sim = _summed(sims, groups, iterations) if featured else _no_features(iterations)
            rows.append(_row(c, spec, sim, featured_rows, cal, cores, iterations, fill_sample_ms,
                             trace.epoch_length, log, tables, **(_by_type(sim, sims, groups) if featured else {})))
    return rows


def _by_type(sim: dict, sims: list[dict], groups: list[list[str]]) -> dict:
    """A typed run's row's breakdown: each node type's hits, rows and bytes read, and each feature group's cache."""
    by_type = sim["by_part"]
    return {"hit_ratio_by_type": {t: n["hits"] / n["unique"] if n["unique"] else None for t, n in by_type.items()},
            "rows_by_type": {t: n["unique"] for t, n in by_type.items()},
            "bytes_read_by_type": {t: n["bytes_read"] for t, n in by_type.items()},
            "groups": [{"types": types, "capacity_bytes": s["capacity_bytes"], "lines": s["lines"],
                        "hit_ratio": s["hit_ratio"], "bytes_read": s["bytes_read"]} for types, s in zip(groups, sims)]}


def _summed(sims: list[dict], groups: list[list[str]], iterations: int) -> dict:
    """The replays of a run's feature groups as one: counts, bytes, reads and cache time summed
    (the loader gathers group after group), reads per node type kept for the read time of each file."""
    n = max(iterations, 1)
    total = {key: sum(s[key] for s in sims) for key in ("hits", "unique", "misses", "bytes_read", "reads",
                                                          "cache_s", "lines", "capacity_bytes")}
    by_type = {t: s["by_part"][t] for types, s in zip(groups, sims) for t in types}
    each_reads = [{t: r for part in parts for t, r in part.items()}
                  for parts in zip(*(s["each"]["reads_by_part"] for s in sims))]
    return {**total, "hit_ratio": total["hits"] / total["unique"] if total["unique"] else 0.0,
            "per_iteration": {"unique": total["unique"] / n, "misses": total["misses"] / n,
                              "bytes_read": total["bytes_read"] / n, "reads": total["reads"] / n,
                              "cache_ms": sum(s["per_iteration"]["cache_ms"] for s in sims),
                              "reads_by_type": {t: counts["reads"] / n for t, counts in by_type.items()}},
            "each": {"cache_ms": [sum(ms) for ms in zip(*(s["each"]["cache_ms"] for s in sims))],
                     "reads": [sum(r) for r in zip(*(s["each"]["reads"] for s in sims))],
                     "reads_by_type": each_reads},
            "by_part": by_type}


def _grid_spec(c: Config, dataset):
    """``c``'s resolved spec, or where a size gives one of its caches less than one set, that refusal (the grid
    point's error row: the others still plan)."""
    from lsm_gnn.build import CacheUnderOneSet, resolve

    try:
        return resolve(c, dataset)
    except CacheUnderOneSet as exc:
        return exc


def _error_row(c: Config, spec, exc: ValueError, log, where: str = "", size=None) -> dict:
    """The row of a grid point whose cache cannot run, saying why (a cache too small in config keys);
    ``where``: which of a heterogeneous run's caches, or a node embedding table's (``size``: that cache's,
    default the features'); ``spec`` None: ``c``'s refused by :func:`_grid_spec` (``exc.bytes``: its size)."""
    from lsm_gnn.cache import CacheTooSmall
    from lsm_gnn.config import policy_config
    from lsm_gnn.sizing import config_fix

    error = str(exc)
    if isinstance(exc, CacheTooSmall):  # in config keys, as the run's own message
        size = size or spec.size
        error = (f"a batch has {exc.distinct:,} distinct nodes, the cache {exc.lines:,} lines; "
                 + config_fix(size.text, exc.lines, exc.distinct, c.cache.ways, size.key))
    error = where + error
    policy, pvp = (policy_config(c.cache), c.cache.pvp) if spec is None else (spec.policy, spec.pvp)
    log(f"plan: {policy.name}{'+pvp' if pvp else ''} {c.cache.capacity}: cannot run ({error})")
    return {"policy": policy.name, "pvp": pvp, "capacity": c.cache.capacity,
            "capacity_bytes": exc.bytes if spec is None else spec.size.bytes, "error": error}


def _modelled_ms(sim: dict, cal: dict, cores: int, iterations: int, fill_sample_ms: float, window: int,
                 epoch_length: int, read_ahead: bool = False, tables: list | None = None) -> dict:
    """A replay's stage times and the run time the model predicts from them, and the stage that bounds it;
    ``tables``: the replays of the run's node embedding tables (:func:`simulate_table`), their time the
    ``embedding`` stage's."""
    train_cal, threads = cal["train"], cal["train"]["torch_threads"]
    per = sim["per_iteration"]
    # each node type's reads at its file's calibration
    storage_cal, reads, reads_each = cal["storage_by_type"], per["reads_by_type"], sim["each"]["reads_by_type"]
    # A table's file is read as a feature file is: at the (first) feature file's calibration.
    table_cal = next(iter(storage_cal.values()))
    tables = tables or []
    embedding = sum(table_ms(table_cal, t["per_iteration"]["cache_ms"], t["per_iteration"]["reads"],
                             t["per_iteration"]["writes"]) for t in tables)
    embedding_each = [sum(table_ms(table_cal, t["each"]["cache_ms"][k], t["each"]["reads"][k], t["each"]["writes"][k])
                          for t in tables) for k in range(len(sim["each"]["cache_ms"]))]
    stages = stage_times(storage_cal, train_cal, per["cache_ms"], reads, read_ahead, embedding)
    each = [stage_times(storage_cal, train_cal, cache_ms, reads, read_ahead, emb_ms)
            for cache_ms, reads, emb_ms in zip(sim["each"]["cache_ms"], reads_each, embedding_each)]
    timing = {"window": window, "epoch_length": epoch_length, "queue": LOADER_QUEUE}
    total = run_ms(each, cores, threads, fill_sample_ms=fill_sample_ms, **timing)
    steady = run_ms(each, cores, threads, fill_sample_ms=0.0, **timing) / iterations
    train_c, loader_c = contended_ms(stages, cores, threads)
    # The run's bound as the trainer reports it (its epoch summary's pipeline_efficiency): the storage's reads
    # or the training step, whichever is larger, over the time per iteration.
    bound_ms = max(stages.read, stages.train)
    return {"stages_ms": stages.as_dict(), "contended_ms": {"train": train_c, "loader": loader_c},
            "steady_ms": steady, "ms_per_iteration": total / iterations, "run_ms": total,
            "bound": bound_stage(stages, cores, threads), "bound_ms": bound_ms,
            "pipeline_efficiency": bound_ms / (total / iterations) if total > 0 else None}


def dataset_text(ds: dict) -> str:
    """A plan's ``dataset`` in words: its nodes and rows; on a heterogeneous graph each type's, and which types
    share a cache."""
    if "node_types" not in ds:
        return f"{ds['num_nodes']:,} nodes, {ds['row_bytes']} B rows"
    kinds = ", ".join(f"{t} {d['num_nodes']:,}" + (f" x {d['row_bytes']} B" if "row_bytes" in d else "")
                      for t, d in ds["node_types"].items())
    return (f"{ds['num_nodes']:,} nodes ({kinds}), {ds['relations']} relations, target {ds['target']}; "
            f"{len(ds['groups'])} cache(s): {', '.join('+'.join(g) for g in ds['groups'])}")


def _hidden_text(run: dict) -> str:
    return "" if run["model"] == "lightgcn" else f" hidden {run['hidden']}"  # LightGCN has no weights


def format_plan(plan: dict) -> str:
    """The plan as a table, the bound stage and the recommendation."""
    from lsm_gnn.utils.units import format_bytes

    run, ds = plan["run"], plan["dataset"]
    lines = [f"plan for {ds['path']}: {dataset_text(ds)}; fanouts {run['fanouts']}, "
             f"batch {run['batch_size']}, {run['model']}{_hidden_text(run)}, window {run['window']}, "
             f"{run['iterations']} iterations on {run['cores']} core(s), {run['backend']} storage",
             f"{'policy':<18}{'size':>9}{'nodes':>7}{'hit':>7}{'read/it':>11}{'sample':>8}{'cache':>8}{'read':>8}"
             f"{'train':>8}{'steady':>8}{'ms/it':>8}{'eff':>6}  bound"]
    for r in plan["rows"]:
        name = r["policy"] + ("+pvp" if r["pvp"] else "")
        if "error" in r:
            lines.append(f"{name:<18}{format_bytes(r['capacity_bytes']):>9}  cannot run: {r['error']}")
            continue
        s = r["stages_ms"]
        hit = "-" if r["hit_ratio"] is None else f"{r['hit_ratio']:.3f}"
        lines.append(f"{name:<18}{format_bytes(r['capacity_bytes']):>9}{r['share_of_nodes']:>7.1%}"
                     f"{hit:>7}{format_bytes(r['bytes_read_per_iteration']):>11}{s['sample']:>8.1f}"
                     f"{s['cache']:>8.1f}{s['read']:>8.1f}{s['train']:>8.1f}{r['steady_ms']:>8.1f}"
                     f"{r['ms_per_iteration']:>8.1f}{r['pipeline_efficiency']:>6.2f}  {r['bound']}")
        if "hit_ratio_by_type" in r:
            caches = ", ".join(f"{'+'.join(g['types'])} {format_bytes(g['capacity_bytes'])}" for g in r["groups"])
            lines.append(f"{'':<18}hit by type: {ratios_text(r['hit_ratio_by_type'])}; caches {caches}")
        tables = r.get("embedding", {})
        for t, table in tables.items():
            lines.append(f"{'':<18}node embeddings of {t}: cache {format_bytes(table['capacity_bytes'])} "
                         f"({table['capacity']}), hit {table['hit_ratio']:.3f}, read "
                         f"{format_bytes(table['bytes_read_per_iteration'])}/it, written "
                         f"{format_bytes(table['bytes_written_per_iteration'])}/it")
        if tables:
            lines.append(f"{'':<18}node embeddings: embedding {s['embedding']:.1f} ms, update {s['update']:.1f} ms "
                         "per iteration")
    if "run_iterations" in run:  # plans before it modelled --iterations (100) alone
        lines.append(modelled_text(run))
    lines.append("(ms per iteration; sample, cache + read (= gather) run on the loader thread overlapped with train; "
                 "ms/it includes filling the window at the start; eff: the pipeline's efficiency, max(read, train) "
                 "over ms/it, as a run's epoch summary reports it)")
    if any("embedding" in r for r in plan["rows"]):
        lines.append("(node embeddings: embedding reads the batch's rows through the table's cache after update, the "
                     "optimizer's step on the rows before: both between two training steps, overlapped with "
                     "nothing; 'hit -': the run reads no features)")
    cal = plan["calibration"]
    measured = [(f"storage of {t}", c) for t, c in cal.get("storage_by_type", {}).items()]
    measured = measured or [("storage", cal["storage"])]
    measured += [(part, cal[part]) for part in ("memcpy", "train")]
    parts = [f"{part} {_when(c.get('measured_at'))} (runs within {c.get('spread', 0):.0%}"
             + ("" if c.get("other_load") is None else f", other load {c['other_load']:.1f} cores")
             + ")" for part, c in measured]
    lines.append("calibration: " + "; ".join(parts))
    lines += [f"warning: {w}" for w in cal.get("warnings", [])]
    best = plan["recommendation"]
    if best is not None:
        lines.append(f"recommended: {best['policy']}{'+pvp' if best['pvp'] else ''} at {best['capacity']} "
                     f"({format_bytes(best['capacity_bytes'])}): {best['ms_per_iteration']:.1f} ms/iteration, the "
                     f"smallest cache within {plan['tolerance']:.0%} of the fastest; bound by {best['bound']}")
    return "\n".join(lines)
