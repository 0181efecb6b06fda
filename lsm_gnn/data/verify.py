"""Checksums checked beside training (``data.verify=checksums``).

Opening a dataset checks shapes, sizes and what is cheap; only ``lsm-gnn inspect --verify`` re-reads the
files against the CRC-32s in meta.json. A flipped byte in a feature row, or a neighbor id changed to another
valid id, would otherwise train on silently. :class:`BackgroundVerify` re-reads every file of the dataset on a
thread while the run trains (zlib and file reads release the GIL), and the trainer asks it at every iteration
whether it found a mismatch: the run then stops with the file named. At the end of training the run waits for
the check to finish, so a run that ends normally read only files that matched.
"""
from __future__ import annotations

import os
import threading
import time
import zlib

from lsm_gnn.data.format import CHECKSUM_CHUNK, META_FILE, DatasetError

VERIFY_MODES = ("off", "checksums")


class BackgroundVerify:
    """Re-reads each file of ``dataset`` named in its meta.json ``checksums`` and compares its CRC-32, on a
    daemon thread started at once. :meth:`check` raises the first mismatch (a :class:`DatasetError` naming the
    file); :meth:`finish` waits for the rest and then checks."""

    def __init__(self, dataset):
        self.path = dataset.path
        self.files = dict(dataset.meta.get("checksums", {}))
        self.checked: list[str] = []
        self.bytes_read = 0
        self._error: DatasetError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lsm-gnn-verify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for name, expected in self.files.items():
                actual = self._crc32(os.path.join(self.path, name))
                if actual is None:  # stopped
                    return
                if actual != expected:
                    self._error = DatasetError(
                        f"{os.path.join(self.path, name)}: checksum {actual} does not match {expected} recorded in "
                        f"{META_FILE} (data.verify=checksums, while training): the file changed on disk after it "
                        "was written, so this run may have trained on damaged bytes; restore or re-create the "
                        "dataset, then resume from a checkpoint written before the damage")
                    return
                self.checked.append(name)
        except OSError as exc:
            self._error = DatasetError(f"{self.path}: data.verify=checksums could not read a file ({exc}); check "
                                       "the disk, or set data.verify=off")

    def _crc32(self, path: str) -> str | None:
        crc = 0
        with open(path, "rb") as f:
            while block := f.read(CHECKSUM_CHUNK):
                if self._stop.is_set():
                    return None
                crc = zlib.crc32(block, crc)
                self.bytes_read += len(block)
        return f"crc32:{crc:08x}"

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def check(self) -> None:
        """Raises the mismatch found so far, if any."""
        if self._error is not None:
            raise self._error

    def finish(self, timeout: float | None = None) -> float:
        """Waits for every file to be checked, then :meth:`check`; returns the seconds waited."""
        start = time.perf_counter()
        self._thread.join(timeout)
        self.check()
        return time.perf_counter() - start

    def close(self) -> None:
        """Stops the check where it is (a run that ends in an error does not wait for it)."""
        self._stop.set()
        self._thread.join()
