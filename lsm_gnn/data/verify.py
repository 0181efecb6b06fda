"""Checksums checked beside training (``data.verify``).

Opening a dataset checks shapes, sizes and what is cheap; only ``lsm-gnn inspect --verify`` re-reads whole files
against the CRC-32s in meta.json. A flipped byte in a feature row, or a neighbor id changed to another valid id,
would otherwise train on silently. Two modes check on a thread while the run trains (zlib and file reads release
the GIL), and the trainer asks at every iteration whether a mismatch was found: the run then stops with the file
(and, for a block, the byte offsets) named.

- ``checksums`` (:class:`WholeFileVerify`): every file of the dataset, re-read whole. At the end of training the
  run waits for the check to finish, so a run that ends normally read only files that matched.
- ``sampled`` (:class:`SampledVerify`): the blocks of the feature files and neighbor lists that the run reads,
  for a sample of each batch's input nodes, each block at most once, against the per-block CRC-32s in
  ``block_crc32.bin``; the small files (index pointers, labels, splits, scores) are checked whole first. Its
  reads are bounded by a few blocks per batch and by the dataset's size over the run.
- ``auto`` (the default): ``sampled`` for a dataset with block checksums whose files total at most
  :data:`AUTO_SAMPLED_LIMIT`, else ``off``.
"""
from __future__ import annotations

import abc
import mmap
import os
import queue
import threading
import time
import zlib

import numpy as np
import torch

from lsm_gnn.data.format import BLOCK_SUMS_FILE, HETERO_SCHEMA_VERSION, META_FILE, DatasetError, crc32_file

VERIFY_MODES = ("auto", "off", "sampled", "checksums")
#: ``auto`` samples datasets up to this size (the trainer's message says 64 GiB): over a run the check may re-read
#: up to the whole dataset once, and the files it checks whole first grow with it
AUTO_SAMPLED_LIMIT = 64 << 30
#: input nodes per batch whose feature block and neighbor-list block are checked
NODES_PER_BATCH = 8
_QUEUE_BATCHES = 64  # batches offered ahead of the checker before further offers are dropped (it is a sample)

_RESTORE = ("the file changed on disk after it was written, so this run may have trained on damaged bytes; "
            "restore or re-create the dataset, then resume from a checkpoint written before the damage (if you "
            "changed the file on purpose, record its new checksums with 'lsm-gnn prepare checksums DATASET')")


def dataset_bytes(dataset) -> int:
    """Total size of the files meta.json checksums."""
    return sum(os.path.getsize(dataset.file_path(name)) for name in dataset.meta.get("checksums", {}))


def resolve_mode(dataset, mode: str) -> str:
    """The mode ``mode`` means for ``dataset`` (``auto`` resolved); raises for ``sampled`` on a dataset written
    before block checksums."""
    if mode not in VERIFY_MODES:
        raise ValueError(f"data.verify must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    has_blocks = "block_checksums" in dataset.meta
    if mode == "auto":
        return "sampled" if has_blocks and dataset_bytes(dataset) <= AUTO_SAMPLED_LIMIT else "off"
    if mode == "sampled" and not has_blocks:
        raise DatasetError(f"{dataset.path}: data.verify=sampled needs block checksums, which this dataset was "
                           "written without (an earlier lsm-gnn wrote it); re-create it with 'lsm-gnn prepare', or set "
                           "data.verify=checksums (re-reads whole files) or off")
    return mode


def start_verify(dataset, mode: str):
    """The checker for ``mode`` (already resolved), started; None for ``off``."""
    if mode == "checksums":
        return WholeFileVerify(dataset)
    if mode == "sampled":
        return SampledVerify(dataset)
    return None


class _Checker(abc.ABC):
    """A daemon thread that checks files and keeps the first mismatch for :meth:`check` to raise; a subclass's
    :meth:`_run` says what it checks."""

    mode = ""

    def __init__(self, dataset):
        self.path = dataset.path
        self.dataset = dataset
        self.bytes_read = 0
        self._error: DatasetError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._guarded_run, name="lsm-gnn-verify", daemon=True)

    def _guarded_run(self) -> None:
        try:
            self._run()
        except OSError as exc:
            self._error = DatasetError(f"{self.path}: data.verify={self.mode} could not read a file ({exc}); check "
                                       "the disk, or set data.verify=off")

    @abc.abstractmethod
    def _run(self) -> None:
        """The checks, on the thread; returns when done, stopped, or at the first mismatch."""

    def _count(self, nbytes: int) -> bool:
        self.bytes_read += nbytes
        return not self._stop.is_set()

    def _check_whole(self, name: str, expected: str) -> bool:
        """Re-reads one file against its meta.json checksum; False when stopped or damaged."""
        path = os.path.join(self.path, name)
        actual = crc32_file(path, on_chunk=self._count)
        if actual is None:
            return False
        if actual != expected:
            self._error = DatasetError(
                f"{path}: checksum {actual} does not match {expected} recorded in {META_FILE} "
                f"(data.verify={self.mode}, while training): {_RESTORE}")
            return False
        return True

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def summary(self) -> dict:
        """What was checked, for the run's result."""
        return {"mode": self.mode, "bytes_read": self.bytes_read}

    def offer(self, batch) -> None:
        """Hands over what ``batch`` read (only :class:`SampledVerify` uses it)."""

    def check(self) -> None:
        """Raises the mismatch found so far, if any."""
        if self._error is not None:
            raise self._error

    def _drained(self) -> None:
        """Lets the thread end once it has checked what it was given."""

    def finish(self, timeout: float | None = None) -> float:
        """Waits for everything given so far to be checked, then :meth:`check`; returns the seconds waited."""
        start = time.perf_counter()
        self._drained()
        self._thread.join(timeout)
        self.check()
        return time.perf_counter() - start

    def close(self) -> None:
        """Stops the check where it is (a run that ends in an error does not wait for it)."""
        self._stop.set()
        self._drained()
        self._thread.join()


class WholeFileVerify(_Checker):
    """``data.verify=checksums``: re-reads each file named in meta.json ``checksums`` and compares its CRC-32."""

    mode = "checksums"

    def __init__(self, dataset):
        super().__init__(dataset)
        self.files = dict(dataset.meta.get("checksums", {}))
        self.checked: list[str] = []
        self._thread.start()

    def _run(self) -> None:
        for name, expected in self.files.items():
            if not self._check_whole(name, expected):
                return
            self.checked.append(name)


class _Region:
    """What a run reads of one node type: its feature rows and its rows of each CSR whose rows are that type."""

    def __init__(self, features: dict | None, csrs: list[tuple[str, str]]):
        self.features = features  # meta.json's feature layout entry, or None
        self.csrs = csrs          # (indptr file, indices file) pairs


class SampledVerify(_Checker):
    """``data.verify=sampled``: checks the blocks that a sample of each batch's input nodes were read from (their
    feature rows, and their neighbor lists in every CSR whose rows are their type), each at most once, against
    the dataset's block checksums; the files not read by block are checked whole first."""

    mode = "sampled"

    def __init__(self, dataset, nodes_per_batch: int = NODES_PER_BATCH, seed: int = 0):
        super().__init__(dataset)
        meta = dataset.meta
        blocks = meta["block_checksums"]
        self.block_bytes = int(blocks["block_bytes"])
        self._spans = {name: (int(first), int(count)) for name, (first, count) in blocks["files"].items()}
        self._sums = np.memmap(dataset.file_path(blocks["file"]), dtype="<u4", mode="r")
        self._regions = self._regions_of(meta)
        self.nodes_per_batch = nodes_per_batch
        self._rng = np.random.default_rng(seed)
        self._arrays: dict[str, np.ndarray] = {}
        read_by_block = {r.features["file"] for r in self._regions.values() if r.features is not None}
        read_by_block |= {indices for r in self._regions.values() for _, indices in r.csrs}
        # The block sums' own file first: every block check trusts it.
        names = sorted(meta.get("checksums", {}), key=lambda n: n != BLOCK_SUMS_FILE)
        self._whole = [(n, meta["checksums"][n]) for n in names if n not in read_by_block]
        self._seen = {name: np.zeros(count, dtype=bool) for name, (_, count) in self._spans.items()
                      if name in read_by_block}
        self._queue: queue.Queue = queue.Queue(maxsize=_QUEUE_BATCHES)
        self.blocks_checked = 0
        self.batches_dropped = 0
        self._direct = hasattr(os, "O_DIRECT")
        self._buffer = mmap.mmap(-1, self.block_bytes)  # page-aligned, as O_DIRECT needs
        self._thread.start()

    def summary(self) -> dict:
        return {**super().summary(), "blocks_checked": self.blocks_checked, "batches_dropped": self.batches_dropped}

    @staticmethod
    def _regions_of(meta: dict) -> dict:
        if meta.get("version") == HETERO_SCHEMA_VERSION:
            return {entry["name"]: _Region(entry.get("features"),
                                           [(r["indptr"], r["indices"]) for r in meta["relations"]
                                            if r["dst"] == entry["name"]])
                    for entry in meta["node_types"]}
        graph = meta["graph"]
        return {None: _Region(meta["features"], [(graph["indptr"], graph["indices"])])}

    def _array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = np.load(self.dataset.file_path(name), mmap_mode="r")
        return self._arrays[name]

    def offer(self, batch) -> None:
        nodes = batch.input_nodes
        by_type = nodes if isinstance(nodes, dict) else {None: nodes}
        wanted: list[tuple[str, np.ndarray]] = []
        for node_type, ids in by_type.items():
            region = self._regions.get(node_type)
            if region is None or ids.numel() == 0:
                continue
            draw = torch.from_numpy(self._rng.integers(0, ids.numel(), self.nodes_per_batch)).to(ids.device)
            pick = ids[draw].cpu().numpy()
            if region.features is not None:
                offsets = pick.astype(np.int64) * int(region.features["row_stride"])
                wanted.append((region.features["file"], offsets // self.block_bytes))
            for indptr_name, indices_name in region.csrs:
                indptr, indices = self._array(indptr_name), self._array(indices_name)
                starts, ends = indptr[pick], indptr[pick + 1]
                has = ends > starts  # a node with no neighbors read nothing here
                offsets = indices.offset + starts[has].astype(np.int64) * indices.dtype.itemsize
                wanted.append((indices_name, offsets // self.block_bytes))
        try:
            self._queue.put_nowait(wanted)
        except queue.Full:  # the checker is behind: this batch is left out of the sample
            self.batches_dropped += 1

    def _run(self) -> None:
        for name, expected in self._whole:
            if not self._check_whole(name, expected):
                return
        while (item := self._queue.get()) is not None:
            for name, block_ids in item:
                seen = self._seen.get(name)
                if seen is None:
                    continue
                for block in np.unique(block_ids):
                    if self._stop.is_set() or not self._check_block(name, int(block)):
                        return
                    seen[block] = True

    def _check_block(self, name: str, block: int) -> bool:
        """True when block ``block`` of file ``name`` matches its sum (or was checked before)."""
        if self._seen[name][block]:
            return True
        first, count = self._spans[name]
        start = block * self.block_bytes
        path = os.path.join(self.path, name)
        data = self._read(path, start)
        self.bytes_read += len(data)
        self.blocks_checked += 1
        where = f"{path}: bytes {start}..{start + len(data)} (block {block} of {self.block_bytes} bytes)"
        if block >= count:
            self._error = DatasetError(f"{where} lie past the {count} blocks {META_FILE} records (data.verify="
                                       f"sampled, while training): {_RESTORE}")
            return False
        actual, expected = zlib.crc32(data), int(self._sums[first + block])
        if actual != expected:
            self._error = DatasetError(
                f"{where} have checksum {actual:08x}, but {BLOCK_SUMS_FILE} records {expected:08x} "
                f"(data.verify=sampled, while training): {_RESTORE}")
            return False
        return True

    def _read(self, path: str, start: int) -> bytes:
        """One block, read past the page cache where the file system allows (O_DIRECT): the run's cached pages
        stay, and these bytes, read once, take no room from them."""
        if self._direct:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError:  # tmpfs and some others refuse O_DIRECT: buffered reads from here on
                self._direct = False
            else:
                try:
                    got = os.preadv(fd, [self._buffer], start)
                finally:
                    os.close(fd)
                return bytes(self._buffer[:got])
        with open(path, "rb", buffering=0) as f:
            return os.pread(f.fileno(), self.block_bytes, start)

    def _drained(self) -> None:
        while True:
            try:
                self._queue.put(None, timeout=0.1)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    return




def record_checksums(path: str) -> list[str]:
    """Re-records the checksums of every file a dataset's meta.json names (whole and per block), after an edit
    made on purpose; returns the files whose checksum changed. Atomic as ``prepare scores``: the new block sums
    go to a fresh file, then meta.json is replaced by rename (a reader sees the old record or the new one), and
    only then is the old block-sums file removed."""
    import json
    import secrets

    from lsm_gnn.data import open_dataset
    from lsm_gnn.data.format import BLOCK_BYTES, block_sums_of_file
    from lsm_gnn.utils.fileio import CheckedFile, atomic_write_bytes, fsync_path

    ds = open_dataset(path, check="shape")  # the structure must hold; only the bytes' record is redone
    with open(ds.file_path(META_FILE), "rb") as fh:
        meta = json.loads(fh.read())
    blocks = meta.get("block_checksums")
    old_sums_file = blocks["file"] if blocks else None
    changed, spans, parts, first = [], {}, [], 0
    for name in sorted(meta.get("checksums", {})):
        if name == old_sums_file:
            continue
        whole, sums = block_sums_of_file(ds.file_path(name))
        if whole != meta["checksums"][name]:
            changed.append(name)
        meta["checksums"][name] = whole
        if blocks is not None and name in blocks["files"]:
            spans[name], first = [first, int(sums.size)], first + int(sums.size)
            parts.append(sums.astype("<u4", copy=False).tobytes())
    new_sums_file = None
    if blocks is not None:
        new_sums_file = f"{BLOCK_SUMS_FILE}.{secrets.token_hex(4)}"
        with CheckedFile(ds.file_path(new_sums_file)) as out:
            out.write(b"".join(parts))
            out.close(sync=True)
        meta["checksums"].pop(old_sums_file, None)
        meta["checksums"][new_sums_file] = crc32_file(ds.file_path(new_sums_file))
        meta["block_checksums"] = {"file": new_sums_file, "block_bytes": BLOCK_BYTES, "files": spans}
    atomic_write_bytes(json.dumps(meta, indent=2, sort_keys=True).encode(), ds.file_path(META_FILE))
    if new_sums_file is not None and old_sums_file != new_sums_file:
        os.remove(ds.file_path(old_sums_file))
        fsync_path(ds.path)
    return changed


__all__ = ["AUTO_SAMPLED_LIMIT", "SampledVerify", "VERIFY_MODES", "WholeFileVerify", "record_checksums",
           "resolve_mode", "start_verify"]
