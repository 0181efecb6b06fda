"""Random-row read throughput of the storage engine, beside its physical limit and its peers.

For each row size and queue depth this runs, interleaved in one process and
one run (the machines are shared and noisy, so only ratios taken side by side
mean anything):

* ``fio`` on the same feature file, same block size (= row size) and queue
  depth, ``--direct=1 --rw=randread``, io_uring and libaio engines: the
  physical limit;
* our backends (io_uring, pread, mmap) reading batches of distinct uniform
  random ids, a fresh seed per batch, with the counters of ``stats()``
  (requests, amplification) so coalescing is visible;
* ``np.memmap`` fancy-indexing gather of batches drawn the same way, with the
  file evicted from the page cache before every batch: what a plain
  out-of-core PyG user does on a graph much larger than RAM, with the
  kernel's default read-around (``np_memmap``) and with ``MADV_RANDOM``
  (``np_memmap_random``). Queue depth has no meaning for them: one
  measurement per row size.

Every method's bytes and requests as the block device saw them come from
``/proc/diskstats`` deltas, so read-ahead and coalescing show up.

``--layouts packed,unpacked`` also writes each row size in the layout before
packing (every row padded to 512 B) and measures our backends on both, side
by side in the same repeat: amplification (``bytes_read / bytes_useful`` from
the reader's counters) and rows/s, with the paired ratio packed / unpacked.
Rows of 512 B and more have one layout only.

    python benchmarks/storage_bench.py                 # 3 repeats, ~11 min (+1 min to write 12 GiB once)
    python benchmarks/storage_bench.py --repeats 5     # the run in docs/benchmarks/storage.md, ~18 min
    python benchmarks/storage_bench.py --quick         # a tiny run, ~20 s
    python benchmarks/storage_bench.py --layouts packed,unpacked --row-sizes 4,64,128,256,384 --num-rows 1000000 \
        --backends io_uring --queue-depths 64 --fio-engines '' --no-memmap   # docs/benchmarks/storage.md: packed rows

Prints a table last and writes JSON (default bench-results/storage_bench.json).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import lsm_gnn
except ImportError:  # run from a source checkout that is not installed
    sys.path.insert(0, REPO_ROOT)
    import lsm_gnn
from lsm_gnn.testing.benchmarking import reusable_dataset, write_json
from lsm_gnn import DatasetWriter, _C, open_storage
from lsm_gnn.data.format import ROW_ALIGNMENT, row_stride_for
from lsm_gnn.storage.probe import evict_page_cache

DEFAULT_JSON = os.path.join(REPO_ROOT, "bench-results", "storage_bench.json")
FIO_METHOD = "fio_{}"           # fio_io_uring, fio_libaio
# np.memmap peers: name -> madvise advice before the first batch (None: the kernel's default read-around)
MEMMAPS = {"np_memmap": None, "np_memmap_random": "random"}
PATTERN_MASK = (1 << 24) - 1    # every pattern value is an integer exact in float32
ROW_MIX = 40503                 # odd, so rows differ for up to 2**24 rows
# Feature file layouts: name -> DatasetWriter row_alignment (None packs rows under 512 B several per block).
LAYOUTS = {"packed": None, "unpacked": ROW_ALIGNMENT}


# -- the dataset: rows whose values prove which row they are -----------------

def pattern_rows(first: int, count: int, dim: int) -> np.ndarray:
    """Rows ``first .. first+count-1``: ``value[r, j] = (r * 40503 + 7 j) mod 2**24`` as float32."""
    rows = np.arange(first, first + count, dtype=np.uint32) * np.uint32(ROW_MIX)
    cols = np.arange(dim, dtype=np.uint32) * np.uint32(7)
    return ((rows[:, None] + cols[None, :]) & np.uint32(PATTERN_MASK)).astype(np.float32)


def expected_rows(ids: np.ndarray, dim: int) -> np.ndarray:
    rows = np.asarray(ids, dtype=np.uint32) * np.uint32(ROW_MIX)
    cols = np.arange(dim, dtype=np.uint32) * np.uint32(7)
    return ((rows[:, None] + cols[None, :]) & np.uint32(PATTERN_MASK)).astype(np.float32)


def ensure_dataset(data_dir: str, row_bytes: int, file_bytes: int, log, num_rows: int | None = None,
                   layout: str = "packed") -> lsm_gnn.Dataset:
    """A float32 dataset of ``num_rows`` rows (default ``file_bytes // row_bytes``) in ``layout`` (a key of
    LAYOUTS); reused when one of that shape and row stride exists."""
    dim = row_bytes // 4
    num_rows = num_rows or max(1, file_bytes // row_bytes)
    stride = row_stride_for(row_bytes, LAYOUTS[layout])
    suffix = "" if stride == row_stride_for(row_bytes) else f"-{layout}"
    path = os.path.join(data_dir, f"rows-{row_bytes}B-{num_rows}{suffix}")
    ds = reusable_dataset(path, num_nodes=num_rows, feature_dim=dim, feature_dtype="float32", log=log)
    if ds is not None and ds.features.row_stride == stride:  # written before packing: a 512 B stride
        return ds
    log(f"  writing {path} ({num_rows} rows x {row_bytes} B at stride {stride} = "
        f"{num_rows * stride / 2**30:.2f} GiB) ...")
    start = time.perf_counter()
    chunk = max(1, (64 << 20) // stride)
    with DatasetWriter(path, num_nodes=num_rows, feature_dim=dim, overwrite=True,
                       row_alignment=LAYOUTS[layout]) as writer:
        for first in range(0, num_rows, chunk):
            writer.write_features(pattern_rows(first, min(chunk, num_rows - first), dim))
        writer.write_csr(np.zeros(num_rows + 1, dtype=np.int64), np.empty(0, dtype=np.int64))
        ds = writer.commit()
    log(f"  ... written in {time.perf_counter() - start:.1f} s")
    return ds


# -- page cache and device counters -------------------------------------------

def resident_fraction(path: str) -> float:
    """Fraction of the file's pages in the page cache (mincore)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        pages = np.frombuffer(m, dtype=np.uint8)
        num_pages = (size + page - 1) // page
        vec = ctypes.create_string_buffer(num_pages)
        rc = libc.mincore(ctypes.c_void_p(pages.ctypes.data), size, vec)
        del pages  # release the export before the mapping closes
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
    return float((np.frombuffer(vec.raw[:num_pages], dtype=np.uint8) & 1).mean())


def block_device_of(path: str) -> str | None:
    """The /proc/diskstats name of the whole disk holding ``path`` (vda for /dev/vda1)."""
    dev = os.stat(path).st_dev
    sys_dir = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    try:
        real = os.path.realpath(sys_dir)
    except OSError:
        return None
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    return os.path.basename(real)


def disk_counters(disk: str | None) -> tuple[int, int]:
    """(read requests completed, bytes read) of ``disk`` so far, from /proc/diskstats; zeros if unknown."""
    if disk is None:
        return 0, 0
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if fields[2] == disk:
                return int(fields[3]), int(fields[5]) * 512
    return 0, 0


class Meter:
    """Wall time, process CPU time and block-device reads over the timed sections only."""

    def __init__(self, disk: str | None):
        self.disk = disk
        self.seconds = self.cpu_seconds = 0.0
        self.disk_requests = self.disk_bytes = 0

    @contextlib.contextmanager
    def timed(self):
        ios0, bytes0 = disk_counters(self.disk)
        cpu0, t0 = time.process_time(), time.perf_counter()
        yield
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - cpu0
        ios1, bytes1 = disk_counters(self.disk)
        self.disk_requests += ios1 - ios0
        self.disk_bytes += bytes1 - bytes0


def batch_ids(num_rows: int, batch_rows: int, seed: int) -> np.ndarray:
    """``batch_rows`` distinct ids drawn uniformly (no replacement), in random order."""
    return np.random.default_rng(seed).choice(num_rows, size=min(batch_rows, num_rows), replace=False)


def record(method, row_bytes, qd, repeat, rows, meter, **extra) -> dict:
    seconds = max(meter.seconds, 1e-9)
    return {"method": method, "row_bytes": row_bytes, "queue_depth": qd, "repeat": repeat, "rows": rows,
            "seconds": meter.seconds, "rows_per_s": rows / seconds, "gb_per_s": rows * row_bytes / seconds / 1e9,
            "cpu_util": meter.cpu_seconds / seconds, "disk_requests": meter.disk_requests,
            "disk_bytes": meter.disk_bytes,
            "disk_amplification": meter.disk_bytes / (rows * row_bytes) if rows else 0.0, **extra}


# -- the methods ----------------------------------------------------------------

def run_ours(ds, backend: str, qd: int, seconds: float, batch_rows: int, seed: int, disk) -> tuple[int, Meter, dict]:
    """Reads batches until ``seconds`` of read time have passed (at least two batches)."""
    meter = Meter(disk)
    out = torch.empty((min(batch_rows, ds.num_nodes), ds.feature_dim), dtype=torch.float32)
    reopen = backend == "mmap"  # a mapping pins its pages: close it so eviction takes them
    storage = None
    rows = batches = 0
    totals = {"requests": 0, "bytes_read": 0, "bytes_useful": 0, "unique_rows": 0}
    try:
        while batches < 2 or meter.seconds < seconds:
            ids = torch.from_numpy(batch_ids(ds.num_nodes, batch_rows, seed + batches))
            if storage is None or reopen:
                if storage is not None:
                    _add_stats(totals, storage)
                    storage.close()
                evict_page_cache(ds.feature_path)
                storage = open_storage(ds, backend, queue_depth=qd)
            with meter.timed():
                storage.read(ids, out=out)
            rows += ids.numel()
            batches += 1
        _add_stats(totals, storage)
    finally:
        if storage is not None:
            storage.close()
    totals["amplification"] = totals["bytes_read"] / totals["bytes_useful"] if totals["bytes_useful"] else 0.0
    totals["requests_per_row"] = totals["requests"] / rows if rows else 0.0
    totals["batches"] = batches
    return rows, meter, totals


def _add_stats(totals: dict, storage) -> None:
    s = storage.stats()
    for key in ("requests", "bytes_read", "bytes_useful", "unique_rows"):
        totals[key] += getattr(s, key)


def run_memmap(ds, advice: str | None, seconds: float, batch_rows: int, seed: int, disk) -> tuple[int, Meter, dict]:
    """``np.memmap`` fancy-index gather; the file is evicted before every batch (outside the timing).

    One mapping serves the whole measurement, as in a user's loader. ``advice``
    None keeps the kernel's default read-around on faults; "random" first
    calls ``madvise(MADV_RANDOM)``, what a careful user would add.
    """
    meter = Meter(disk)
    layout = ds.features
    num_rows, stride, row_bytes = ds.num_nodes, layout.row_stride, layout.row_bytes
    mm = np.memmap(ds.feature_path, dtype=np.uint8, mode="r", shape=(num_rows, stride))
    if advice == "random":
        mm._mmap.madvise(mmap.MADV_RANDOM)
    rows = batches = 0
    resident = None
    while batches < 2 or meter.seconds < seconds:
        ids = batch_ids(num_rows, batch_rows, seed + batches)
        mm._mmap.madvise(mmap.MADV_DONTNEED)  # unmap our pages, else the eviction keeps them
        evict_page_cache(ds.feature_path)
        if resident is None:
            resident = resident_fraction(ds.feature_path)
        with meter.timed():
            gathered = mm[ids]
            if stride != row_bytes:
                gathered = np.ascontiguousarray(gathered[:, :row_bytes])
            torch.from_numpy(gathered.view(np.float32))
        rows += ids.size
        batches += 1
    del mm  # unmapped when the last reference goes
    return rows, meter, {"batches": batches, "resident_after_evict": resident}


def run_fio(path: str, engine: str, row_bytes: int, qd: int, seconds: float, disk) -> tuple[int, Meter, dict]:
    """fio random reads of ``row_bytes`` rounded up to 512 B (the smallest O_DIRECT read): one read per row."""
    block = -(-row_bytes // ROW_ALIGNMENT) * ROW_ALIGNMENT
    cmd = ["fio", "--name=storage_bench", f"--filename={path}", "--readonly", "--direct=1", "--rw=randread",
           f"--bs={block}", f"--ioengine={engine}", f"--iodepth={qd}", "--numjobs=1", "--time_based",
           f"--runtime={max(100, round(seconds * 1000))}ms", "--randrepeat=0", "--output-format=json"]
    if engine == "io_uring":
        cmd += ["--fixedbufs=1", "--registerfiles=1"]  # as our engine does
    meter = Meter(disk)
    with meter.timed():
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fio failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}")
    job = json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"][0]
    read = job["read"]
    runtime = read["runtime"] / 1000.0
    rows = int(read["total_ios"]) if "total_ios" in read else int(read["io_bytes"] // block)
    # fio's own clock, not the process lifetime: start-up and cache invalidation are not I/O.
    meter.seconds = runtime
    meter.cpu_seconds = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * runtime
    lat = read.get("clat_ns", {})
    return rows, meter, {"fio_iops": read["iops"], "fio_bw_bytes": read["bw_bytes"],
                         "clat_mean_us": lat.get("mean", 0.0) / 1000.0, "command": " ".join(cmd)}


# -- correctness ----------------------------------------------------------------

def check_correctness(ds, backends: list[str], seed: int) -> dict:
    """Each backend and np.memmap return the pattern for a few ids (first, last, random)."""
    rng = np.random.default_rng(seed)
    ids = np.unique(np.concatenate([[0, ds.num_nodes - 1], rng.integers(0, ds.num_nodes, 64)]))
    rng.shuffle(ids)
    expected = expected_rows(ids, ds.feature_dim)
    got = {}
    for backend in backends:
        with open_storage(ds, backend, queue_depth=8) as storage:
            got[backend] = storage.read(torch.from_numpy(ids)).numpy()
    mm = np.memmap(ds.feature_path, dtype=np.uint8, mode="r", shape=(ds.num_nodes, ds.features.row_stride))
    got["np_memmap"] = np.ascontiguousarray(mm[ids][:, :ds.features.row_bytes]).view(np.float32)
    del mm
    for method, rows in got.items():
        if not np.array_equal(rows, expected):
            bad = int(np.flatnonzero(~(rows == expected).all(axis=1))[0])
            raise AssertionError(f"{method} returned wrong data for row {ids[bad]} of {ds.feature_path}")
    return {"ids_checked": int(ids.size), "methods": sorted(got)}


# -- the read plan alone: which layout makes the engine read fewer bytes ----------

# Strides to compare by plan: the two layouts, and rows back to back (no dataset layout: a row may straddle blocks).
PLAN_STRIDES = {"packed": lambda rb: row_stride_for(rb), "unpacked": lambda rb: row_stride_for(rb, ROW_ALIGNMENT),
                "back_to_back": lambda rb: rb}


def plan_amplification(row_sizes, num_rows: int, batch_rows: int, batches: int, seed: int,
                       alignment: int = ROW_ALIGNMENT) -> list[dict]:
    """bytes_read / bytes_useful of the engine's read plan (``_C.plan_reads``, no I/O) for batches of distinct
    random rows, per row size and stride: exactly the bytes an O_DIRECT reader of that alignment asks for."""
    out = []
    for rb in row_sizes:
        entry = {"row_bytes": rb}
        for name, stride_of in PLAN_STRIDES.items():
            stride = stride_of(rb)
            file_bytes = -(-num_rows * stride // 4096) * 4096
            read = useful = 0
            for b in range(batches):
                ids = torch.from_numpy(batch_ids(num_rows, batch_rows, seed + b))
                plan = _C.plan_reads(ids, num_rows, rb, stride, file_bytes, alignment, 128 << 10)
                read += plan["bytes_read"]
                useful += plan["unique_rows"] * rb
            entry[name] = {"stride": stride, "amplification": read / useful}
        out.append(entry)
    return out


def format_plan_table(rows: list[dict]) -> str:
    names = list(PLAN_STRIDES)
    lines = ["row_bytes  " + "  ".join(f"{n} stride / amp".rjust(24) for n in names)]
    for r in rows:
        lines.append(f"{r['row_bytes']:>9}  " + "  ".join(
            f"{r[n]['stride']:>12} / {r[n]['amplification']:9.2f}" for n in names))
    return "\n".join(lines)


# -- summary and table ------------------------------------------------------------

def summarize(measurements: list[dict], row_sizes, queue_depths, methods, fio_ref: str | None) -> list[dict]:
    """Medians over repeats, per row size and queue depth.

    ``ratio_to[ref]`` is the median over repeats of (this method / ref) taken
    within the same repeat, so slow drifts of the shared machine cancel.
    The np.memmap peers have no queue depth: every row repeats their numbers.
    """
    index = {(m["method"], m["row_bytes"], m["queue_depth"], m["repeat"]): m for m in measurements}
    repeats = sorted({m["repeat"] for m in measurements})

    def runs_of(method, rb, qd):
        return [index.get((method, rb, None if method in MEMMAPS else qd, r)) for r in repeats]

    summary = []
    for rb in row_sizes:
        for qd in queue_depths:
            row = {"row_bytes": rb, "queue_depth": qd, "methods": {}}
            for method in methods:
                runs = [r for r in runs_of(method, rb, qd) if r]
                if not runs:
                    continue
                entry = {key: statistics.median(r[key] for r in runs)
                         for key in ("rows_per_s", "gb_per_s", "cpu_util", "disk_amplification")}
                entry["disk_requests_per_row"] = statistics.median(r["disk_requests"] / max(r["rows"], 1) for r in runs)
                entry["repeats"] = len(runs)
                if "requests_per_row" in runs[0]:
                    entry["requests_per_row"] = statistics.median(r["requests_per_row"] for r in runs)
                    entry["amplification"] = statistics.median(r["amplification"] for r in runs)
                refs = [] if method in MEMMAPS else [fio_ref] if method.startswith("fio_") else [fio_ref, *MEMMAPS]
                refs += [other for other in methods if other.startswith(method + "/")]  # the same backend, unpacked
                entry["ratio_to"] = {ref: _paired_ratio(runs_of(method, rb, qd), runs_of(ref, rb, qd))
                                     for ref in refs if ref and ref != method and ref in methods}
                row["methods"][method] = entry
            summary.append(row)
    return summary


def _paired_ratio(runs, ref_runs):
    pairs = [a["rows_per_s"] / b["rows_per_s"] for a, b in zip(runs, ref_runs) if a and b and b["rows_per_s"] > 0]
    return statistics.median(pairs) if pairs else None


def format_table(summary: list[dict], backends: list[str], fio_engines: list[str]) -> str:
    """One line per row size and queue depth: rows/s, and ratios to fio and to np.memmap."""
    fio_ref = FIO_METHOD.format(fio_engines[0]) if fio_engines else None
    cols = [("row", lambda r, m: _size(r["row_bytes"])), ("QD", lambda r, m: str(r["queue_depth"]))]
    if fio_ref:
        cols += [(f"{fio_ref} rows/s", lambda r, m: _num(m, fio_ref, "rows_per_s")),
                 ("GB/s", lambda r, m: _fix(m.get(fio_ref, {}).get("gb_per_s"), 3))]
        for e in fio_engines[1:]:
            f = FIO_METHOD.format(e)
            cols.append((f"{f} x", lambda r, m, f=f: _ratio(m, f, fio_ref, 2)))
    for b in backends:
        cols.append((f"{b} rows/s", lambda r, m, b=b: _num(m, b, "rows_per_s")))
        if fio_ref:
            cols.append(("x fio", lambda r, m, b=b: _ratio(m, b, fio_ref, 2)))
    for mm in MEMMAPS:
        cols.append((f"{mm} rows/s", lambda r, m, mm=mm: _num(m, mm, "rows_per_s")))
    for mm in MEMMAPS:
        if "io_uring" in backends:
            cols.append((f"io_uring x {mm}", lambda r, m, mm=mm: _ratio(m, "io_uring", mm, 1)))
    return _render(cols, summary)


def _render(cols, summary: list[dict]) -> str:
    """A right-aligned text table: one column per (name, cell function), one line per summary row."""
    cells = [[fn(row, row["methods"]) for _, fn in cols] for row in summary]
    widths = [max([len(name)] + [len(line[i]) for line in cells]) for i, (name, _) in enumerate(cols)]
    lines = ["  ".join(name.rjust(w) for (name, _), w in zip(cols, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def layout_method(backend: str, layout: str) -> str:
    """Our backend's method name on a layout: the plain name on packed rows (the default), ``io_uring/unpacked``."""
    return backend if layout == "packed" else f"{backend}/{layout}"


def format_layout_table(summary: list[dict], backends: list[str], layouts: list[str]) -> str:
    """Packed against unpacked rows: rows/s, useful MB/s and amplification per layout, and the paired ratio."""
    cols = [("row", lambda r, m: _size(r["row_bytes"])), ("QD", lambda r, m: str(r["queue_depth"]))]
    for b in backends:
        for layout in layouts:
            name = layout_method(b, layout)
            cols += [(f"{name} rows/s", lambda r, m, n=name: _num(m, n, "rows_per_s")),
                     ("MB/s", lambda r, m, n=name: _fix(m[n]["gb_per_s"] * 1e3 if n in m else None, 1)),
                     ("amp", lambda r, m, n=name: _fix(m.get(n, {}).get("amplification"), 2))]
        for layout in layouts[1:]:
            cols.append((f"{layouts[0]} / {layout}",
                         lambda r, m, b=b, lo=layout: _ratio(m, layout_method(b, layouts[0]), layout_method(b, lo), 2)))
    return _render(cols, summary)


def _size(b):
    return f"{b // 1024}K" if b % 1024 == 0 else f"{b}B"


def _num(methods, method, key):
    x = methods.get(method, {}).get(key)
    return "-" if x is None else f"{x:,.0f}"


def _ratio(methods, method, ref, digits):
    return _fix(methods.get(method, {}).get("ratio_to", {}).get(ref), digits)


def _fix(x, digits):
    return "-" if x is None else f"{x:.{digits}f}"


def targets(summary: list[dict], fio_ref: str | None) -> dict:
    """The issue's goals for io_uring at 4 KiB rows, QD 64: >= 0.9x fio and >= 3x a cold np.memmap gather
    (checked against both memmap peers; the plain one is the issue's, the MADV_RANDOM one is stricter)."""
    goals = {fio_ref: 0.9, **{mm: 3.0 for mm in MEMMAPS}}
    out = {}
    for row in summary:
        m = row["methods"].get("io_uring")
        if row["row_bytes"] != 4096 or row["queue_depth"] != 64 or m is None:
            continue
        for ref, goal in goals.items():
            value = m["ratio_to"].get(ref)
            if ref and value is not None:
                out[f"io_uring / {ref} at 4K QD64"] = {"value": value, "goal": goal, "met": value >= goal}
    return out


# -- driver ------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--row-sizes", default="1024,4096,16384", help="row sizes in bytes (float32 rows), comma separated")
    p.add_argument("--queue-depths", default="1,8,32,64,128", help="reads in flight (pread and mmap: threads)")
    p.add_argument("--backends", default="io_uring,pread,mmap", help="our backends to measure")
    p.add_argument("--fio-engines", default="io_uring,libaio",
                   help="fio engines ('' to skip fio); the first is the reference of every ratio")
    p.add_argument("--no-memmap", action="store_true", help="skip the np.memmap peers")
    p.add_argument("--file-gib", type=float, default=4.0, help="feature file size per row size, GiB")
    p.add_argument("--num-rows", type=int, default=None,
                   help="rows per feature file, the same for every row size (instead of --file-gib)")
    p.add_argument("--plan-row-sizes", default="",
                   help="with several --layouts: row sizes (any bytes) whose read-plan amplification is computed "
                        "for packed, unpacked and back-to-back strides, without I/O (default: --row-sizes)")
    p.add_argument("--plan-alignment", type=int, default=ROW_ALIGNMENT,
                   help="O_DIRECT alignment of the plan-only table (4096: a device with 4 KiB logical blocks)")
    p.add_argument("--layouts", default="packed",
                   help=f"feature file layouts our backends read, comma separated: {', '.join(LAYOUTS)}; the "
                        "first is the reference of the packed / unpacked ratio and the file fio and np.memmap read")
    p.add_argument("--repeats", type=int, default=3, help="repeats of every measurement; medians are reported")
    p.add_argument("--seconds", type=float, default=2.0, help="read time per measurement (at least two batches)")
    p.add_argument("--batch-rows", type=int, default=4096, help="distinct ids per read() batch")
    p.add_argument("--data-dir", default="/work/bench-data", help="where datasets are created and reused")
    p.add_argument("--json", default=DEFAULT_JSON, help="where to write the results ('' for nowhere)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="a tiny run: 64 MiB files, 1 repeat, 0.3 s, QD 1,64, batches of 1024 (explicit flags win)")
    p.add_argument("--quiet", action="store_true", help="print only the final table")
    args = p.parse_args(argv)
    if args.quick:
        given = {a.split("=")[0] for a in (sys.argv[1:] if argv is None else argv)}
        for flag, value in (("--file-gib", 1 / 16), ("--repeats", 1), ("--seconds", 0.3),
                            ("--queue-depths", "1,64"), ("--batch-rows", 1024)):
            if flag not in given:
                setattr(args, flag[2:].replace("-", "_"), value)
    if args.plan_alignment < 1 or args.plan_alignment & (args.plan_alignment - 1):
        p.error(f"--plan-alignment must be a power of two, got {args.plan_alignment}")
    if args.repeats < 1 or args.seconds <= 0 or args.batch_rows < 1 or args.file_gib <= 0 \
            or (args.num_rows is not None and args.num_rows < 1):
        p.error("--repeats, --seconds, --batch-rows, --file-gib and --num-rows must be positive")
    unknown = set(_csv(args.layouts)) - set(LAYOUTS)
    if unknown or not _csv(args.layouts):
        p.error(f"--layouts: {', '.join(sorted(unknown)) or 'none given'}; choose from {', '.join(LAYOUTS)}")
    return args


def _csv(text, cast=str):
    return [cast(x.strip()) for x in str(text).split(",") if x.strip()]


def machine_info(disk: str | None) -> dict:
    info = {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__, "lsm_gnn": lsm_gnn.__version__,
            "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "block_device": disk}
    if disk:
        for key in ("scheduler", "read_ahead_kb", "logical_block_size", "physical_block_size", "nr_requests",
                    "rotational"):
            with contextlib.suppress(OSError):
                with open(f"/sys/block/{disk}/queue/{key}") as f:
                    info[key] = f.read().strip()
    if shutil.which("fio"):
        info["fio"] = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    return info


def main(argv=None) -> dict:
    """Runs the benchmark; returns (and writes as JSON) the measurements, medians and targets."""
    args = parse_args(argv)
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    row_sizes = _csv(args.row_sizes, int)
    queue_depths = _csv(args.queue_depths, int)
    backends = _csv(args.backends)
    fio_engines = _csv(args.fio_engines)
    for rb in row_sizes:
        if rb <= 0 or rb % 4:
            raise SystemExit(f"--row-sizes: {rb} is not a positive multiple of 4 bytes (float32 rows)")
    if fio_engines and shutil.which("fio") is None:
        log("fio is not installed: skipping the physical-limit baseline (apt-get install fio)")
        fio_engines = []
    if not _C.io_uring_available() and ("io_uring" in backends or "io_uring" in fio_engines):
        log("io_uring is disabled on this kernel: skipping the io_uring backend and fio engine")
        backends = [b for b in backends if b != "io_uring"]
        fio_engines = [e for e in fio_engines if e != "io_uring"]
    memmaps = {} if args.no_memmap else MEMMAPS
    file_bytes = int(args.file_gib * 2**30)
    layouts = _csv(args.layouts)

    os.makedirs(args.data_dir, exist_ok=True)
    log(f"datasets in {args.data_dir}:")
    # Per row size, the layouts that differ (rows of 512 B and more have one), the first one first.
    layouts_of = {rb: [lo for i, lo in enumerate(layouts)
                       if row_stride_for(rb, LAYOUTS[lo]) not in [row_stride_for(rb, LAYOUTS[x]) for x in layouts[:i]]]
                  for rb in row_sizes}
    all_data = {(rb, lo): ensure_dataset(args.data_dir, rb, file_bytes, log, num_rows=args.num_rows, layout=lo)
                for rb in row_sizes for lo in layouts_of[rb]}
    datasets = {rb: all_data[rb, layouts_of[rb][0]] for rb in row_sizes}  # the file fio and np.memmap read
    disk = block_device_of(datasets[row_sizes[0]].feature_path)
    with open_storage(datasets[row_sizes[0]], "pread", queue_depth=1) as probe:
        if fio_engines and not probe.direct:
            log(f"{args.data_dir} refuses O_DIRECT (tmpfs?): skipping fio, which needs --direct=1")
            fio_engines = []
    fio_ref = FIO_METHOD.format(fio_engines[0]) if fio_engines else None
    correctness = {f"{rb}" + ("" if lo == layouts_of[rb][0] else f"/{lo}"): check_correctness(ds, backends, args.seed)
                   for (rb, lo), ds in all_data.items()}
    log("correctness: " + ", ".join(f"{key}: {c['ids_checked']} rows x {len(c['methods'])} methods equal"
                                    for key, c in correctness.items()))

    ours = [layout_method(b, lo) for lo in layouts for b in backends]
    methods = [FIO_METHOD.format(e) for e in fio_engines] + ours + list(memmaps)
    measurements = []

    def add(method, rb, qd, repeat, result):
        rows, meter, extra = result
        m = record(method, rb, qd, repeat, rows, meter, **extra)
        measurements.append(m)
        ours = f"  req/row {m['requests_per_row']:.3f} amp {m['amplification']:.2f}" if "requests_per_row" in m else ""
        log(f"[{repeat}] {_size(rb):>4} QD{'-' if qd is None else qd:<4} {method:<17} {m['rows_per_s']:>10,.0f} rows/s "
            f"{m['gb_per_s']:6.3f} GB/s  cpu {m['cpu_util']:.2f}  disk x{m['disk_amplification']:.2f}{ours}")

    start = time.perf_counter()
    for repeat in range(args.repeats):
        for rb in row_sizes:
            ds = datasets[rb]
            evict_page_cache(ds.feature_path)
            seed = (args.seed * 1_000_003 + repeat * 100_003 + rb) * 1_000  # fresh ids per repeat, method, batch
            for i, (name, advice) in enumerate(memmaps.items()):
                add(name, rb, None, repeat,
                    run_memmap(ds, advice, args.seconds, args.batch_rows, seed + 900_000 + 10_000 * i, disk))
            for qd in queue_depths:
                order = [("fio", e, None) for e in fio_engines] + [("ours", b, lo) for b in backends
                                                                   for lo in layouts_of[rb]]
                if repeat % 2:
                    order.reverse()  # no method always runs first
                for kind, name, lo in order:
                    if kind == "fio":
                        add(FIO_METHOD.format(name), rb, qd, repeat,
                            run_fio(ds.feature_path, name, rb, qd, args.seconds, disk))
                    else:  # both layouts read the same ids: their ratio is paired
                        add(layout_method(name, lo), rb, qd, repeat,
                            run_ours(all_data[rb, lo], name, qd, args.seconds, args.batch_rows,
                                     seed + 1_000 * qd + 100 * backends.index(name), disk))
    elapsed = time.perf_counter() - start
    plan = []
    if len(layouts) > 1:
        plan = plan_amplification(_csv(args.plan_row_sizes, int) or row_sizes,
                                  args.num_rows or max(1, file_bytes // min(row_sizes)), args.batch_rows, 20,
                                  args.seed, args.plan_alignment)

    summary = summarize(measurements, row_sizes, queue_depths, methods, fio_ref)
    results = {
        "benchmark": "storage_bench",
        "command": "python benchmarks/storage_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": {"row_sizes": row_sizes, "queue_depths": queue_depths, "backends": backends,
                   "fio_engines": fio_engines, "memmaps": list(memmaps), "file_bytes": file_bytes,
                   "num_rows": args.num_rows, "layouts": layouts, "plan_alignment": args.plan_alignment,
                   "repeats": args.repeats, "seconds": args.seconds, "batch_rows": args.batch_rows,
                   "seed": args.seed, "reference": fio_ref},
        "machine": machine_info(disk),
        "datasets": {f"{rb}/{lo}": {"path": ds.path, "num_rows": ds.num_nodes, "row_stride": ds.features.row_stride,
                                    "file_bytes": os.path.getsize(ds.feature_path)}
                     for (rb, lo), ds in all_data.items()},
        "correctness": correctness,
        "elapsed_seconds": elapsed,
        "measurements": measurements,
        "summary": summary,
        "plan_amplification": plan,
        "targets": targets(summary, fio_ref),
    }
    if args.json:
        write_json(args.json, results, indent=1)
    print(f"\nrandom-row reads, medians of {args.repeats} repeat(s); ratios are per-repeat medians, "
          f"ratio = ours / reference")
    print(format_table(summary, [layout_method(b, layouts[0]) for b in backends], fio_engines))
    if len(layouts) > 1:
        print(f"\nlayouts: rows/s, useful MB/s and amplification (bytes_read / bytes_useful) of our backends; "
              f"{layouts[0]} / other: paired rows/s ratio")
        print(format_layout_table(summary, backends, layouts))
        print(f"\nread plan alone (no I/O): bytes_read / bytes_useful for batches of {args.batch_rows} distinct "
              f"random rows, O_DIRECT alignment {args.plan_alignment} B")
        print(format_plan_table(plan))
    for name, t in results["targets"].items():
        print(f"target: {name} = {t['value']:.2f} (goal >= {t['goal']}): {'met' if t['met'] else 'MISSED'}")
    if args.json:
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
