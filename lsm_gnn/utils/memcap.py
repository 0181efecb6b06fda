"""Run a command under a memory cap that counts the page cache: the out-of-core regime, for real.

A feature file smaller than RAM is served by the page cache whatever the
storage path does, so speed figures taken that way hide the SSD. A memory
cgroup counts the page cache its processes fill against its limit: under a
cap a fraction of the file, reads must come from the device.
:class:`MemoryCap` creates such a cgroup (v1 ``memory.limit_in_bytes`` where
the memory controller is mounted as v1, v2 ``memory.max`` otherwise), runs
commands in it, reports their peak and whether the kernel killed one for
memory, and removes it. Creating cgroups needs root (or a delegated subtree);
where neither version is writable it says so and how to fix it.
"""
from __future__ import annotations

import os
import subprocess
import threading
import uuid
from dataclasses import dataclass

V1_ROOT = "/sys/fs/cgroup/memory"
V2_ROOT = "/sys/fs/cgroup"


class MemoryCapError(RuntimeError):
    """No memory cgroup can be created here."""


@dataclass
class CappedRun:
    """One command's run under the cap."""

    returncode: int | None   # None: killed at the timeout
    stdout: str
    stderr: str
    peak_bytes: int          # the cgroup's peak usage (page cache included) while the command ran
    limit_bytes: int
    oom_killed: bool         # the kernel killed a process of the cgroup for memory
    timed_out: bool = False  # ran past ``timeout`` and was killed (returncode None)

    @property
    def within_cap(self) -> bool:
        return not self.oom_killed and self.peak_bytes <= self.limit_bytes


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _text(output) -> str:
    """What a timed-out subprocess had written (bytes even with text=True on some Pythons, or None)."""
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def _oom_kills(path: str, key: str) -> int:
    """The kill counter in a cgroup's memory.oom_control (v1) or memory.events (v2); 0 where absent."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except OSError:
        pass
    return 0


class MemoryCap:
    """A memory cgroup limited to ``limit_bytes`` (page cache included, swap excluded where the kernel
    accounts it). Use as a context manager; :meth:`run` starts commands inside it."""

    def __init__(self, limit_bytes: int, name: str | None = None):
        if limit_bytes < 1 << 20:
            raise ValueError(f"a memory cap below 1 MiB cannot run a process, got {limit_bytes} bytes")
        self.limit_bytes = int(limit_bytes)
        self.name = name or f"lsm-gnn-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.version = self._version()
        root = V1_ROOT if self.version == 1 else V2_ROOT
        self.path = os.path.join(root, self.name)
        try:
            os.mkdir(self.path)
        except OSError as exc:
            raise MemoryCapError(f"cannot create the memory cgroup {self.path} ({exc.strerror}); run as root or "
                                 "in a container with a writable (delegated) cgroup tree") from None
        try:
            if self.version == 1:
                _write(os.path.join(self.path, "memory.limit_in_bytes"), self.limit_bytes)
                memsw = os.path.join(self.path, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):  # no escape into swap: the cap is on memory + swap
                    _write(memsw, self.limit_bytes)
            else:
                _write(os.path.join(self.path, "memory.max"), self.limit_bytes)
                if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                    _write(os.path.join(self.path, "memory.swap.max"), 0)
        except OSError:
            self.close()
            raise

    @staticmethod
    def _version() -> int:
        if os.access(V1_ROOT, os.W_OK) and os.path.exists(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
            return 1
        controllers = os.path.join(V2_ROOT, "cgroup.controllers")
        if os.path.exists(controllers) and os.access(V2_ROOT, os.W_OK):
            with open(controllers) as f:
                if "memory" in f.read().split():
                    return 2
        raise MemoryCapError("no writable memory cgroup: neither cgroup v1 (/sys/fs/cgroup/memory) nor v2 with the "
                             "memory controller (/sys/fs/cgroup/cgroup.controllers) can be used here; run as root on "
                             "Linux, or give this container a delegated cgroup tree")

    def usage_bytes(self) -> int:
        return _read_int(os.path.join(self.path, "memory.usage_in_bytes" if self.version == 1 else "memory.current"))

    def _peak_bytes(self) -> int:
        if self.version == 1:
            return _read_int(os.path.join(self.path, "memory.max_usage_in_bytes"))
        peak = os.path.join(self.path, "memory.peak")  # Linux 5.19+
        return _read_int(peak) if os.path.exists(peak) else self.usage_bytes()

    def _reset_peak(self) -> None:
        if self.version == 1:
            _write(os.path.join(self.path, "memory.max_usage_in_bytes"), 0)

    def _kills(self) -> int:
        if self.version == 1:
            return _oom_kills(os.path.join(self.path, "memory.oom_control"), "oom_kill")
        return _oom_kills(os.path.join(self.path, "memory.events"), "oom_kill")

    def run(self, args: list[str], *, timeout: float | None = None, env: dict | None = None,
            cwd: str | None = None) -> CappedRun:
        """Runs ``args`` inside the cgroup (it joins before it executes, so every byte it maps counts). Past
        ``timeout`` seconds the command is killed and the run returned with ``timed_out`` set."""
        self._reset_peak()
        kills = self._kills()
        procs = os.path.join(self.path, "cgroup.procs")

        def join() -> None:  # runs in the child between fork and exec
            _write(procs, os.getpid())

        try:
            result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                                    preexec_fn=join)
        except subprocess.TimeoutExpired as exc:  # subprocess.run has killed and reaped the command
            return CappedRun(None, _text(exc.stdout), _text(exc.stderr), self._peak_bytes(), self.limit_bytes,
                             self._kills() > kills, timed_out=True)
        return CappedRun(result.returncode, result.stdout, result.stderr, self._peak_bytes(), self.limit_bytes,
                         self._kills() > kills)

    def close(self) -> None:
        """Removes the cgroup (its processes have exited; a cgroup with none left is removable)."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> MemoryCap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- what a process inside the cap reads about itself -----------------------------------------------------------

def own_cgroup_stat() -> dict[str, int] | None:
    """The ``memory.stat`` of the memory cgroup this process is in (v1: ``rss``, ``cache``, ``mapped_file``, ...;
    v2: ``anon``, ``file``, ``file_mapped``, ...), or None where it cannot be read."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            stat = os.path.join(V1_ROOT, path.lstrip("/"), "memory.stat")
            break
    else:  # v2: the one unified hierarchy, "0::/path"
        stat = next((os.path.join(V2_ROOT, path.lstrip("/"), "memory.stat") for num, _, path in lines if num == "0"),
                    None)
    try:
        with open(stat) as f:
            return {name: int(value) for name, value in (line.split() for line in f)}
    except (OSError, TypeError, ValueError):
        return None


def available_memory() -> int | None:
    """Bytes this process could still allocate: the system's MemAvailable, or less under a memory cgroup's limit;
    None where /proc cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.rstrip("\n").split(":", 2)[2] for line in f
                        if "memory" in line.split(":", 2)[1].split(","))
        with open(os.path.join(V1_ROOT, path.lstrip("/"), "memory.limit_in_bytes")) as f:
            limit = int(f.read())
        with open(os.path.join(V1_ROOT, path.lstrip("/"), "memory.usage_in_bytes")) as f:
            free = min(free, limit - int(f.read()))
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    return free


def process_memory() -> dict[str, int]:
    """This process's resident memory in bytes, from /proc/self/status: ``rss_anon`` (heap, tensors: what the
    kernel cannot drop), ``rss_file`` (mapped file pages, which it can), ``rss_hwm`` (peak of their sum)."""
    keys = {"RssAnon:": "rss_anon", "RssFile:": "rss_file", "RssShmem:": "rss_shmem", "VmHWM:": "rss_hwm"}
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition("\t") if "\t" in line else line.partition(" ")
            if name in keys:
                out[keys[name]] = int(value.split()[0]) * 1024
    return out


class PeakMemory:
    """Samples :func:`process_memory` every ``interval`` seconds on a thread and keeps the peak of each figure
    (the kernel keeps no peak of anonymous memory alone). Use as a context manager."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lsm-gnn-peak-memory", daemon=True)

    def sample(self) -> None:
        for key, value in process_memory().items():
            self.peak[key] = max(self.peak.get(key, 0), value)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
