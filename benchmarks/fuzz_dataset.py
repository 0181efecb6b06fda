"""Fuzzes open_dataset, the native sampler and PageRank with corrupted datasets.

Each case copies a small valid dataset, corrupts it (array values, dtypes,
byte order, lengths, truncated or flipped bytes in any file, meta.json keys
set to wrong JSON types or out-of-range values) and requires one of:

* a DatasetError (a ValueError) with a one-line message naming a file, or
* the exact right answer: the sampler equals a pure-Python reference
  (same random stream, same numbering), PageRank sums to 1, every loaded
  label, split id and score is in range.

Anything else (another exception type, a crash, a hang) is a finding.
tests/test_fuzz_dataset.py runs a few derandomized cases in CI; run longer
with

    python benchmarks/fuzz_dataset.py --seconds 300

which fuzzes in a child process, so a segfault or hang is reported with the
case that caused it, and prints how many cases ran.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lsm_gnn import DatasetError, DatasetWriter, open_dataset
from lsm_gnn.data.format import META_FILE
from lsm_gnn.data.scores import compute_scores
from lsm_gnn.sampling import OneTypeSampler

NUM_NODES = 40
FANOUTS = ([3, 2], [-1, 1], [0, 5])
MASK64 = (1 << 64) - 1

# -- a pure-Python reference of the native sampler (csrc/sampler) -----------------


def _mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class _Stream:
    def __init__(self, state: int):
        self.state = state

    def bounded(self, n: int) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        return (_mix64(self.state) * n) >> 64


def _floyd(rng: _Stream, degree: int, k: int) -> list[int]:
    out: list[int] = []
    for j in range(degree - k, degree):
        r = rng.bounded(j + 1)
        out.append(j if r in out else r)
    return out


class CorruptCSR(Exception):
    """The reference found a fault the native sampler must report."""


def reference_sample(indptr, indices, seeds, fanouts, seed: int, iteration: int):
    """[(nodes, num_dst, src_local, dst_local)] per hop, as lists; raises CorruptCSR where the native code must fail."""
    num_nodes, num_edges = len(indptr) - 1, len(indices)
    frontier = [int(s) for s in seeds]
    local = {v: i for i, v in enumerate(frontier)}
    base = _mix64((seed & MASK64) ^ _mix64(iteration & MASK64))
    hops = []
    for h, k in enumerate(fanouts):
        key = _mix64((base + h) & MASK64)
        for v in frontier:
            if not 0 <= int(indptr[v]) <= int(indptr[v + 1]) <= num_edges:
                raise CorruptCSR(f"row of node {v}")
        src, dst = [], []
        for i, v in enumerate(list(frontier)):
            begin, degree = int(indptr[v]), int(indptr[v + 1]) - int(indptr[v])
            got = degree if k < 0 or degree <= k else k
            positions = range(degree) if got == degree else _floyd(_Stream(key ^ _mix64(v & MASK64)), degree, k)
            for p in positions:
                u = int(indices[begin + p])
                if not 0 <= u < num_nodes:
                    raise CorruptCSR(f"neighbor {u} of node {v}")
                src.append(u)
                dst.append(i)
        num_dst = len(frontier)
        for j, u in enumerate(src):
            if u not in local:
                local[u] = len(frontier)
                frontier.append(u)
            src[j] = local[u]
        hops.append((list(frontier), num_dst, src, dst))
    return hops


# -- the dataset and its corruptions ------------------------------------------------


def make_base(path: str, seed: int = 0, index_dtype: str = "int32") -> str:
    """A small valid dataset with every optional array: labels, splits, scores, held-out pairs."""
    rng = np.random.default_rng(seed)
    with DatasetWriter(path, num_nodes=NUM_NODES, feature_dim=3, overwrite=True) as w:
        w.write_features(rng.standard_normal((NUM_NODES, 3)).astype(np.float32))
        edges = rng.integers(0, NUM_NODES, (2, NUM_NODES * 4))
        w.write_edges([(edges[0], edges[1])])
        w.write_labels(np.where(rng.random(NUM_NODES) < 0.2, -1, rng.integers(0, 3, NUM_NODES)), 3)
        order = rng.permutation(NUM_NODES)
        for name, ids in zip(("train", "val", "test"), np.split(order, [24, 32])):
            w.write_split(name, ids)
        w.write_score("degree", rng.random(NUM_NODES).astype(np.float32))
        for name in ("val", "test"):
            w.write_edge_split(name, rng.integers(0, NUM_NODES, (5, 2)))
        w.commit()
    if index_dtype != "int32":
        _resave(path, "indices.npy", lambda a: a.astype(index_dtype))
    return path


ARRAYS = ("indptr.npy", "indices.npy", "labels.npy", "train_idx.npy", "val_idx.npy", "test_idx.npy",
          "scores/degree.npy", "val_edges.npy", "test_edges.npy")
META_KEYS = ("version", "num_nodes", "num_edges", "name", "labels", "num_classes", "splits", "scores", "edge_splits",
             "checksums", "generator", "num_users", "num_items", "features", "graph", "features.file",
             "features.dtype", "features.dim", "features.row_bytes", "features.row_stride", "features.page_size",
             "features.file_bytes", "graph.indptr", "graph.indices", "splits.train", "scores.degree",
             "edge_splits.test")
INTERESTING_INTS = (-(1 << 63), -(1 << 31) - 1, -2, -1, 0, 1, 2, 3, NUM_NODES - 1, NUM_NODES, NUM_NODES + 1,
                    (1 << 31) - 1, 1 << 31, (1 << 32) + 1, (1 << 62), (1 << 63) - 1)

ints = st.one_of(st.sampled_from(INTERESTING_INTS), st.integers(-(1 << 63), (1 << 63) - 1))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True), st.integers(1 << 63, 1 << 70),
              st.sampled_from(["", "x", "../meta.json", "/etc/passwd", "indices.npy", "labels.npy", "float32",
                               "crc32:00000000", "scores/../../x.npy", "a\u0000b"]), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=5)

array_mutation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(ARRAYS), st.integers(0, 10 ** 6), ints),
    st.tuples(st.just("set_float"), st.sampled_from(ARRAYS), st.integers(0, 10 ** 6),
              st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -1.5])),
    st.tuples(st.just("swap"), st.sampled_from(ARRAYS), st.integers(0, 10 ** 6), st.integers(0, 10 ** 6)),
    st.tuples(st.just("dtype"), st.sampled_from(ARRAYS),
              st.sampled_from(["int8", "int16", "int32", "int64", "uint32", "uint64", "float32", "float64", "bool",
                               ">i8", ">i4", ">f4"])),
    st.tuples(st.just("resize"), st.sampled_from(ARRAYS), st.integers(-3, 3)),
    st.tuples(st.just("reshape2d"), st.sampled_from(ARRAYS)),
    st.tuples(st.just("truncate"), st.sampled_from(ARRAYS + ("features.bin", META_FILE)), st.integers(0, 10 ** 6)),
    st.tuples(st.just("flip"), st.sampled_from(ARRAYS + ("features.bin", META_FILE)), st.integers(0, 10 ** 6),
              st.integers(1, 255)),
    st.tuples(st.just("grow"), st.sampled_from(ARRAYS + ("features.bin",)), st.integers(1, 8192)),
)
meta_mutation = st.one_of(
    st.tuples(st.just("meta"), st.sampled_from(META_KEYS), json_values),
    st.tuples(st.just("meta_del"), st.sampled_from(META_KEYS)),
)
mutations = st.lists(st.one_of(array_mutation, meta_mutation), min_size=1, max_size=3)


def _resave(path: str, name: str, change) -> None:
    file = os.path.join(path, name)
    np.save(file, change(np.load(file)))


def _with(array: np.ndarray, position: int, value) -> np.ndarray:
    flat = array.reshape(-1).copy()
    if flat.size:
        try:
            flat[position % flat.size] = value
        except OverflowError:  # a value this dtype cannot hold: the file could not contain it either
            pass
    return flat.reshape(array.shape)


def apply(path: str, mutation: tuple) -> None:
    """Applies one corruption to the dataset at ``path`` (missing targets are skipped)."""
    op, target, *args = mutation
    if op in ("meta", "meta_del"):
        meta_path = os.path.join(path, META_FILE)
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except ValueError:
            return  # an earlier mutation broke the JSON
        *parents, key = target.split(".")
        node = meta
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return
        if op == "meta":
            node[key] = args[0]
        else:
            node.pop(key, None)
        with open(meta_path, "w") as f:
            json.dump(meta, f)
        return
    file = os.path.join(path, target)
    if not os.path.isfile(file):
        return
    if op in ("truncate", "flip", "grow"):
        size = os.path.getsize(file)
        if op == "truncate":
            os.truncate(file, args[0] % (size + 1))
        elif op == "grow":
            os.truncate(file, size + args[0])
        elif size:
            with open(file, "r+b") as f:
                f.seek(args[0] % size)
                byte = f.read(1)[0]
                f.seek(args[0] % size)
                f.write(bytes([byte ^ args[1]]))
        return
    try:
        array = np.load(file)
    except Exception:  # an earlier mutation broke the file
        return
    if op == "set":
        array = _with(array, args[0], args[1])
    elif op == "set_float":
        array = _with(array.astype(np.float64), args[0], args[1])
    elif op == "swap" and array.size:
        flat = array.reshape(-1).copy()
        i, j = args[0] % flat.size, args[1] % flat.size
        flat[i], flat[j] = flat[j], flat[i]
        array = flat.reshape(array.shape)
    elif op == "dtype":
        with np.errstate(all="ignore"):
            array = array.astype(args[0])
    elif op == "resize":
        flat = array.reshape(-1)
        array = flat[:max(flat.size + args[0], 0)] if args[0] < 0 else np.concatenate([flat, flat[:args[0]]])
    elif op == "reshape2d":
        array = array.reshape(-1, 1)
    np.save(file, array)


# -- one case: an error with a clear message, or the right answer ------------------


def _check_error(exc: Exception, path: str) -> None:
    message = str(exc)
    assert isinstance(exc, ValueError), f"{type(exc).__name__} is not a ValueError: {message}"
    assert "\n" not in message and message.strip(), f"not one line: {message!r}"
    assert path in message, f"the message names no file of the dataset: {message}"


def _check_answer(ds) -> None:
    """The dataset opened: everything the library reads from it must be in range or fail clearly."""
    indptr, indices, n = np.asarray(ds.indptr), np.asarray(ds.indices), ds.num_nodes
    assert indptr.shape == (n + 1,) and indptr[0] == 0 and indptr[-1] == indices.shape[0]
    assert np.all(np.diff(indptr) >= 0)
    if ds.labels() is not None:
        labels = np.asarray(ds.labels())
        assert labels.shape == (n,) and labels.min() >= -1 and labels.max() < ds.num_classes()
    for split in ds.meta.get("splits") or {}:
        ids = np.asarray(ds.split(split))
        assert ids.size == 0 or (ids.min() >= 0 and ids.max() < n)
    for name in ds.score_names():
        assert np.all(np.isfinite(ds.score(name)))
    for name in ds.edge_split_names:
        pairs = np.asarray(ds.edge_split(name))
        assert pairs.size == 0 or (pairs.min() >= 0 and pairs.max() < n)
    assert ds.read_features_direct(np.arange(min(n, 4))).shape == (min(n, 4), ds.feature_dim)

    corrupt_ids = bool(indices.size) and (int(indices.min()) < 0 or int(indices.max()) >= n)
    rng = np.random.default_rng(len(indices))
    for case, fanouts in enumerate(FANOUTS):
        seeds = rng.choice(n, min(n, 6), replace=False)
        try:
            expected = reference_sample(indptr, indices, seeds, fanouts, seed=case, iteration=case + 1)
        except CorruptCSR:
            expected = None
        try:
            hops = OneTypeSampler(ds, fanouts, seed=case).sample(seeds, case + 1)
        except DatasetError as exc:
            assert expected is None, f"the sampler refused a valid graph: {exc}"
            _check_error(exc, ds.path)
            assert "indices.npy" in str(exc)
            continue
        assert expected is not None, "the sampler read an out-of-range neighbor id without an error"
        got = [(h.nodes.tolist(), h.num_dst, h.edge_index[0].tolist(), h.edge_index[1].tolist()) for h in hops]
        assert got == expected, "the sampler differs from the reference"
    try:
        scores = compute_scores(ds.indptr, ds.indices)
    except DatasetError as exc:
        assert corrupt_ids, f"scores refused a valid graph: {exc}"
        _check_error(exc, ds.path)
    else:
        assert not corrupt_ids, "PageRank accepted out-of-range neighbor ids"
        assert abs(float(scores["reverse_pagerank"].sum()) - 1) < 1e-3
    try:
        open_dataset(ds.path, check="full")
    except DatasetError as exc:
        assert corrupt_ids, f"check='full' refused what check='fast' and the reference accept: {exc}"
    else:
        assert not corrupt_ids, "check='full' missed out-of-range neighbor ids"


def run_case(base: str, work: str, case: list) -> str:
    """Corrupts a copy of ``base`` with ``case``; returns "rejected" or "accepted", raises AssertionError on a finding."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    for mutation in case:
        apply(work, mutation)
    try:
        ds = open_dataset(work, check="fast")
    except ValueError as exc:
        _check_error(exc, work)
        return "rejected"
    _check_answer(ds)
    return "accepted"


# -- the time-bounded driver ---------------------------------------------------------


def _fuzz(seconds: float, last_case_file: str | None) -> int:
    counts = {"rejected": 0, "accepted": 0}
    tmp = tempfile.mkdtemp(prefix="lsm-fuzz-")
    bases = [make_base(os.path.join(tmp, f"base-{d}"), index_dtype=d) for d in ("int32", "int64")]
    deadline = time.monotonic() + seconds

    # Rounds of 50 random examples until the deadline; a failing example is shrunk and re-raised.
    @settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(bases), mutations)
    def fuzz(base, case):
        if time.monotonic() > deadline:
            return
        if last_case_file:
            with open(last_case_file, "w") as f:
                f.write(repr(case))
        counts[run_case(base, os.path.join(tmp, "work"), case)] += 1

    try:
        while time.monotonic() < deadline:
            fuzz()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"{sum(counts.values())} cases: {counts['rejected']} rejected with a clear DatasetError, "
              f"{counts['accepted']} accepted with the right answer", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz")
    parser.add_argument("--in-process", action="store_true", help="fuzz here, not in a child process")
    parser.add_argument("--last-case", help=argparse.SUPPRESS)  # set by the parent for the child
    args = parser.parse_args(argv)
    if args.in_process:
        return _fuzz(args.seconds, args.last_case)
    # A child process fuzzes, so a crash or hang is reported with the case that caused it.
    with tempfile.NamedTemporaryFile("r", suffix=".case") as last:
        cmd = [sys.executable, os.path.abspath(__file__), "--in-process", "--seconds", str(args.seconds),
               "--last-case", last.name]
        try:
            rc = subprocess.run(cmd, timeout=args.seconds + 600).returncode
        except subprocess.TimeoutExpired:
            print(f"FINDING: hang; last case: {open(last.name).read()}")
            return 1
        if rc < 0:
            print(f"FINDING: crashed with signal {-rc}; last case: {open(last.name).read()}")
        elif rc:
            print("FINDING: see the falsifying example above")
        else:
            print("no findings")
        return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
