"""Writing files safely: a full disk named by file, and temporaries whose writer is known.

Shared by everything that writes (datasets, checkpoints, logs):

- :class:`DiskFullError` (an ``OSError``, errno ENOSPC) names the file, the
  bytes needed and the bytes free; :func:`reporting_disk_full` turns ENOSPC
  and EDQUOT inside a block into one, and :class:`CheckedFile` writes until
  every byte is out, so numpy's nameless "N requested and M written" never
  reaches a user.
- Temporaries of a target ``path`` are named ``.<name>.tmp-<host>-<pid>-<random>``
  (:func:`temp_prefix`), so :func:`remove_stale_temporaries` removes only
  those whose writer, on this host, is gone.
- :func:`atomic_write_bytes` is the one write-temporary, fsync, rename
  sequence for a single file; :func:`fsync_path` makes a file's bytes or a
  directory's renames durable.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import stat
import tempfile

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_TEMPORARY = re.compile(r"/\.([^/]+)\.tmp-[A-Za-z0-9._]+-\d+-[a-z0-9_]+(/|$)")  # see temp_prefix


class DiskFullError(OSError):
    """No space left on the disk (or the quota is used up) while writing ``filename``."""

    def __init__(self, path: str, needed: int | None = None, exact: bool = True):
        from lsm_gnn.utils.units import format_bytes

        need = "" if needed is None else \
            f"it needs {'' if exact else 'at least '}{format_bytes(needed)} ({needed:,} bytes), "
        free = _free_bytes(os.path.dirname(path))
        have = "" if free is None else f"{format_bytes(free)} free; "
        super().__init__(errno.ENOSPC, f"{_target_name(path)}: the disk is full: {need}{have}free some space or "
                                       "write to another disk", path)

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno 28]" prefix
        return self.strerror


def _target_name(path: str) -> str:
    """A temporary file, or a file inside a temporary directory, named as it will be once in place."""
    return _TEMPORARY.sub(r"/\1\2", path)


def _free_bytes(directory: str) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def reporting_disk_full(path: str, needed: int | None = None, exact: bool = True):
    """Turns ENOSPC / EDQUOT raised inside the block into a :class:`DiskFullError` naming ``path``."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno not in _DISK_FULL_ERRNOS:
            raise
        raise DiskFullError(path, needed, exact) from exc


class CheckedFile:
    """A write-only file whose every write completes or raises :class:`DiskFullError`.

    numpy's ``tofile`` / ``np.save`` report a full disk as "N requested and M
    written" with no file name; this writes with ``os.write`` until every
    byte is out, so a short write ends in the ENOSPC of the next attempt (or
    a zero-byte write, reported the same way). ``size`` is the file's final
    size when known, for the message. Also usable as ``np.save``'s file.
    """

    def __init__(self, path: str, size: int | None = None):
        self.path, self.size, self.written = path, size, 0
        with reporting_disk_full(path, size):
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def fileno(self) -> int:
        return self._fd

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        total = view.nbytes
        needed = self.size if self.size is not None else self.written + view.nbytes
        with reporting_disk_full(self.path, needed, exact=self.size is not None):
            while view.nbytes:
                n = os.write(self._fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, "short write")
                view = view[n:]
                self.written += n
        return total

    def close(self, sync: bool = False) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if sync:
                with reporting_disk_full(self.path, self.size):  # delayed allocation can fail only here
                    os.fsync(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> "CheckedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fsync_path(path: str) -> None:
    """fsyncs a file (its bytes) or a directory (the renames inside it) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_temporary(path: str, directory: bool = False) -> str:
    """A temporary beside ``path`` (named by :func:`temp_prefix`) that becomes ``path`` by a rename, with the mode
    a plain ``open``/``mkdir`` of ``path`` would give: ``tempfile`` makes its files 0600 and folders 0700, so
    renamed into place they would hide a dataset, checkpoint or report from the rest of a team that shares it. A
    file replacing another keeps the old one's mode."""
    parent = os.path.dirname(os.path.abspath(path))
    if directory:
        tmp = tempfile.mkdtemp(prefix=temp_prefix(path), dir=parent)
        os.chmod(tmp, 0o777 & ~_umask())
        return tmp
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), dir=parent)
    try:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return tmp


def atomic_write_bytes(data: bytes | memoryview, path: str, sync_directory: bool = True) -> None:
    """Writes ``path`` so that readers see the old file or the whole new one, never a torn one.

    A full disk raises :class:`DiskFullError` naming ``path``; the old file stays. With
    ``sync_directory=False`` the caller fsyncs the directory itself (to keep a failure of that
    step apart from a failure before the rename).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = make_temporary(path)
    try:
        with CheckedFile(tmp, size=len(data)) as fh:
            fh.write(data)
            fh.close(sync=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync_directory:
        fsync_path(directory)  # the rename itself survives a crash


def _host_prefix(path: str) -> str:
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())
    return f".{os.path.basename(path)}.tmp-{host}-"


def temp_prefix(path: str) -> str:
    """Temporaries of ``path`` start with ``.<name>.tmp-<host>-<pid>-``, so a later writer knows whose they are."""
    return f"{_host_prefix(path)}{os.getpid()}-"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temporaries(path: str, kind: str = "directory") -> list[str]:
    """Removes the temporaries of ``path`` left by writers that are gone; returns them.

    Only names made by :func:`temp_prefix` on this host, of ``kind``
    ("directory" for datasets, "file" for checkpoints; never a link), are
    candidates, and only those whose pid no longer runs are removed: a
    writer on another host sharing the folder, or one still running here,
    keeps its temporary.
    """
    if kind not in ("directory", "file"):
        raise ValueError(f"kind must be 'directory' or 'file', got {kind!r}")
    parent = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(_host_prefix(path)) + r"(\d+)-[a-z0-9_]+")
    removed = []
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return removed
    for name in names:
        match = pattern.fullmatch(name)
        if not match or int(match.group(1)) == os.getpid() or pid_alive(int(match.group(1))):
            continue
        full = os.path.join(parent, name)
        if os.path.islink(full):
            continue
        if kind == "directory" and os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True)
        elif kind == "file" and os.path.isfile(full):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)
        else:
            continue
        removed.append(full)
    return removed


#: the key a JSON output of the command line carries, naming what wrote it: a later run replaces only such a file
WRITTEN_BY = "written_by"


class NotOurFileError(ValueError):
    """An output path names an existing file that lsm-gnn did not write: it is left as it is."""


def _written_by(path: str) -> str | None:
    """The writer a JSON output at ``path`` names (``WRITTEN_BY``), or None when it is no such file."""
    import json

    try:
        with open(path, "rb") as fh:
            head = fh.read(64 << 20)
        document = json.loads(head)
    except (OSError, ValueError):
        return None
    writer = document.get(WRITTEN_BY) if isinstance(document, dict) else None
    return writer if isinstance(writer, str) and writer.startswith("lsm-gnn") else None


def check_output_file(path: str, option: str, ours=None) -> None:
    """Refuses, before any work, an output ``path`` that cannot be written or that would replace a file lsm-gnn
    did not write (a dataset's ``meta.json``, a config, anything else). Its directory is made if missing, as
    ``mkdir -p`` would. ``ours(path) -> bool`` tells a file of the output's own kind that lsm-gnn wrote (default:
    a JSON output marked ``WRITTEN_BY``; an HTML page or a PNG carries its own mark)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{option} {path} is a directory; give a file name")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot make its directory {directory} ({exc.strerror}); give a path "
                         "in a directory you can write") from None
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise ValueError(f"{option} {path}: directory {directory} is not writable")
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isfile(path):
            kind = "a symbolic link" if os.path.islink(path) else "not a regular file"
            raise NotOurFileError(f"{option} {path} is {kind}; lsm-gnn writes only a file of its own there: give "
                                  "another path")
        if not (ours(path) if ours is not None else _written_by(path) is not None):
            raise NotOurFileError(f"{option} {path} exists and was not written by lsm-gnn, so it is left as it is: "
                                  "give a new path, or delete that file first if it is yours to lose")


def write_json_output(path: str, document: dict, writer: str, option: str) -> None:
    """Writes a command's JSON output atomically, marked ``WRITTEN_BY: writer``, after
    :func:`check_output_file` (a file that appeared meanwhile is refused the same way)."""
    import json

    check_output_file(path, option)
    text = json.dumps({WRITTEN_BY: writer, **document}, indent=2, default=str)
    atomic_write_bytes(text.encode(), path)


def _recorded_files(record: str) -> dict:
    """The ``files`` a record of :func:`write_output_record` lists (name -> size and mtime), empty when none."""
    import json

    try:
        with open(record, "rb") as fh:
            files = json.loads(fh.read(16 << 20)).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def check_output_directory(directory: str, names, option: str, record: str) -> None:
    """Refuses, before any work, an output ``directory`` that is not one, or where one of the files ``names`` to be
    written exists and is not the very file lsm-gnn wrote there: a file the directory's ``record`` (a JSON file of
    :func:`write_output_record`) lists with the same size and modification time. numpy arrays carry no mark of
    their writer, so the record is the mark; a file edited or put there since is someone else's. The directory is
    made if missing."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise ValueError(f"{option} {directory} is a file, not a directory; give a directory for the files "
                         "(made if missing)")
    record_path = os.path.join(directory, record)
    check_output_file(record_path, option)  # makes the directory; refuses a record lsm-gnn did not write
    listed = _recorded_files(record_path)
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.lexists(path):
            continue
        st = os.lstat(path)
        mark = listed.get(name)
        if not (os.path.isfile(path) and not os.path.islink(path) and isinstance(mark, dict)
                and mark.get("size") == st.st_size and mark.get("mtime_ns") == st.st_mtime_ns):
            raise NotOurFileError(f"{option} {directory}: {path} exists and is not a file lsm-gnn wrote there "
                                  f"(not listed, as written, in {record_path}), so it is left as it is: give another "
                                  "directory, or delete that file first if it is yours to lose")


def write_output_record(directory: str, names, writer: str, option: str, record: str) -> None:
    """Lists the files ``names`` just written into ``directory`` (size, modification time) in its ``record``, so
    that :func:`check_output_directory` lets a later run replace them, and only them. Files an earlier run listed
    stay listed while they are as it wrote them."""
    def mark(name: str) -> dict | None:
        try:
            st = os.lstat(os.path.join(directory, name))
        except FileNotFoundError:
            return None
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}

    files = {name: old for name, old in _recorded_files(os.path.join(directory, record)).items()
             if name not in names and old == mark(name)}
    files.update({name: mark(name) for name in names})
    write_json_output(os.path.join(directory, record), {"files": files}, writer, option)


#: the lock file :class:`RunLock` keeps in a directory a run writes (a checkpoint, a log, an embedding table)
LOCK_FILE = ".lsm-gnn.lock"
_held_locks: dict[str, list] = {}  # realpath of a lock file -> [fd, holders in this process]


class DirectoryLocked(RuntimeError):
    """Another process holds the directory's :class:`RunLock`; ``holder`` names it (pid, host, since when)."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder


class RunLock:
    """An exclusive ``flock`` on ``<directory>/.lsm-gnn.lock`` for as long as a run writes the directory.

    A second process asking for it is refused at once with :class:`DirectoryLocked`, naming the holder's pid,
    host and start time (written into the lock file). The kernel drops the lock when its holder exits in any
    way (a crash or SIGKILL included), so a lock file left behind locks nothing. Within one process the lock
    is counted, not exclusive: a trainer made again in a notebook after an error is not refused by its own
    earlier self. ``what`` names the directory's role in the message (``"checkpoint.dir"``).
    """

    def __init__(self, directory: str, what: str):
        import fcntl
        import json
        import time

        self.path = os.path.join(os.path.realpath(directory), LOCK_FILE)  # the file itself is never followed
        self._released = False
        held = _held_locks.get(self.path)
        if held is not None:
            held[1] += 1
            return
        try:
            # O_NONBLOCK: a FIFO or device put there must not hang the open; it is refused just below
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise OSError(exc.errno, f"{what} {directory}: cannot open its lock file {self.path} ({exc.strerror}); "
                                     "check that the directory is writable and that the lock file is not a link",
                          self.path) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{what} {directory}: its lock file {self.path} is not a regular file (a "
                                        "FIFO, socket or device); remove it (rm) and run again: lsm-gnn makes it "
                                        "anew as a regular file", self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            os.close(fd)
            since = holder.get("since")
            when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) \
                else ""
            who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}{when}"
            raise DirectoryLocked(
                f"{what} {directory} is in use by another run ({who}); two runs writing it would corrupt each other: "
                f"wait for that run to end, stop it, or give this run another {what}", who) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode(),
                  0)
        _held_locks[self.path] = [fd, 1]

    def release(self) -> None:
        """Gives the lock up (once; later calls do nothing)."""
        if self._released:
            return
        self._released = True
        held = _held_locks.get(self.path)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del _held_locks[self.path]
            os.close(held[0])  # closing the descriptor drops the flock

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def escape_from(directory: str, name: str) -> str | None:
    """Why file ``name`` of ``directory`` lies outside it (an absolute name, ``..``, or a symbolic link,
    anywhere on the way, that resolves out of the directory), or None when it stays inside. A run reads and
    writes a dataset's, a table's or a checkpoint directory's own files only: a link to elsewhere would make it
    train on, or write into, a file nobody meant."""
    path = os.path.join(directory, name)
    root = os.path.realpath(directory)
    resolved = os.path.realpath(path)
    if os.path.commonpath([root, resolved]) == root and resolved != root:
        return None
    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        return f"{path} names a file outside {directory}"
    return f"{path} leads outside {directory} (a symbolic link to {resolved})"


def contained_path(directory: str, name: str, error=ValueError, fix: str = "") -> str:
    """``directory/name``, or ``error`` naming the path when it leads outside the directory (:func:`escape_from`)."""
    problem = escape_from(directory, name)
    if problem is not None:
        raise error(f"{problem}; lsm-gnn reads and writes only the directory's own files: "
                    f"{fix or 'put the file itself there (a copy, or a hard link on the same file system)'}")
    return os.path.join(directory, name)
