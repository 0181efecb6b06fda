"""The memory cap counts the page cache: reading a file several times the cap completes under it, allocating
past it is killed and reported. Skipped, with the reason, where no memory cgroup can be created."""
import os
import sys

import pytest

from lsm_gnn.utils.memcap import MemoryCap

CAP = 48 << 20


@pytest.fixture
def cap(memory_cap):
    return memory_cap(CAP)


def uncached_file(path, size):
    """A file whose pages are not in the page cache, so reading it charges the reader's cgroup."""
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


READ_ALL = "import sys\nwith open(sys.argv[1], 'rb') as f:\n    while f.read(1 << 20):\n        pass\nprint('read')"
GROW = "chunks = []\nfor _ in range(400):\n    chunks.append(bytearray(1 << 20))\nprint('grew')"


def test_reading_a_file_four_times_the_cap_stays_under_it(cap, tmp_path):
    path = tmp_path / "big.bin"
    uncached_file(path, 4 * CAP)
    run = cap.run([sys.executable, "-c", READ_ALL, str(path)], timeout=120)
    assert run.returncode == 0 and "read" in run.stdout, run.stderr[-2000:]
    assert run.within_cap and not run.oom_killed
    assert run.peak_bytes > CAP // 4, "the page cache filled by the read counts against the cap"


def test_allocating_past_the_cap_is_killed_and_reported(cap):
    run = cap.run([sys.executable, "-c", GROW], timeout=120)
    assert run.returncode != 0 and "grew" not in run.stdout
    assert run.oom_killed and not run.within_cap


def test_a_cap_too_small_to_run_anything_is_refused():
    with pytest.raises(ValueError, match="below 1 MiB"):
        MemoryCap(1000)


def test_a_command_past_its_timeout_is_killed_and_reported(cap):
    run = cap.run([sys.executable, "-c", "import time\nprint('started', flush=True)\ntime.sleep(60)"], timeout=3)
    assert run.timed_out and run.returncode is None and not run.oom_killed
    assert "started" in run.stdout
