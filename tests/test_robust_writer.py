"""Robustness of dataset writing: what may be replaced, stale temporaries, a full disk."""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lsm_gnn.cli import main as cli_main
from lsm_gnn.cli.prepare import recompute_scores
from lsm_gnn.data import open_dataset
from lsm_gnn.data import writer as writer_module
from lsm_gnn.data.bipartite import generate_bipartite
from lsm_gnn.data.convert import from_numpy
from lsm_gnn.data.format import feature_file_bytes, row_stride_for
from lsm_gnn.data.synthetic import generate_synthetic
from lsm_gnn.data.writer import (
    CheckedFile, DatasetWriter, DiskFullError, create_npy, remove_stale_temporaries, save_npy,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_small(path, num_nodes=20, dim=3, overwrite=False, value=1.0):
    # No static scores: the tests below add them (recompute_scores) or count the files written.
    with DatasetWriter(path, num_nodes=num_nodes, feature_dim=dim, overwrite=overwrite, scores=()) as w:
        w.write_features(np.full((num_nodes, dim), value, np.float32))
        w.write_edges([(np.arange(num_nodes), (np.arange(num_nodes) + 1) % num_nodes)])
        return w.commit()


def hidden(folder):
    return sorted(p for p in os.listdir(folder) if p.startswith("."))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- every entry point that can overwrite ------------------------------------------------------

def _npy_argv(tmp_path):
    np.save(tmp_path / "f.npy", np.ones((10, 2), np.float32))
    np.save(tmp_path / "e.npy", np.array([[0, 1, 2], [1, 2, 0]]))
    return ["npy", "--features", str(tmp_path / "f.npy"), "--edge-index", str(tmp_path / "e.npy")]


def _folder_argv(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "node_feat.npy", np.ones((10, 2), np.float32))
    np.save(src / "edge_index.npy", np.array([[0, 1, 2], [1, 2, 0]]))
    return ["folder", "--src", str(src)]


PYTHON_ENTRIES = {
    "writer": lambda out, ow: write_small(out, overwrite=ow),
    "synthetic": lambda out, ow: generate_synthetic(out, num_nodes=50, feature_dim=4, scores=(), overwrite=ow,
                                                    progress=False),
    "bipartite": lambda out, ow: generate_bipartite(out, num_users=20, num_items=10, avg_interactions=3,
                                                    feature_dim=4, num_communities=2, scores=(), overwrite=ow,
                                                    progress=False),
    "from_numpy": lambda out, ow: from_numpy(out, features=np.ones((10, 2), np.float32),
                                             edge_index=np.array([[0, 1], [1, 2]]), scores=(), overwrite=ow,
                                             progress=False),
}
CLI_ENTRIES = {
    "synthetic": lambda tmp: ["synthetic", "--num-nodes", "50", "--feature-dim", "4"],
    "bipartite": lambda tmp: ["bipartite", "--num-users", "20", "--num-items", "10", "--feature-dim", "4",
                              "--communities", "2"],
    "npy": _npy_argv,
    "folder": _folder_argv,
}


def make_foreign_dir(path):
    path.mkdir()
    (path / "thesis.tex").write_text("years of work")
    return path


class TestOnlyDatasetsAreReplaced:
    @pytest.mark.parametrize("entry", sorted(PYTHON_ENTRIES))
    def test_python_entries_refuse_a_directory_that_is_not_a_dataset(self, tmp_path, entry):
        target = make_foreign_dir(tmp_path / "out")
        with pytest.raises(FileExistsError) as info:
            PYTHON_ENTRIES[entry](target, True)
        message = str(info.value)
        assert str(target) in message and "not an lsm-gnn dataset" in message
        assert "remove it yourself" in message and "\n" not in message
        assert (target / "thesis.tex").read_text() == "years of work"
        assert hidden(tmp_path) == []

    @pytest.mark.parametrize("entry", sorted(CLI_ENTRIES))
    def test_every_prepare_command_refuses_with_one_line(self, tmp_path, capsys, entry):
        target = make_foreign_dir(tmp_path / "out")
        argv = ["prepare", *CLI_ENTRIES[entry](tmp_path), "--out", str(target), "--overwrite", "--no-progress",
                "--scores", "none"]
        assert cli_main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(target) in err
        assert "choose another output path (--out) or remove it yourself" in err
        assert (target / "thesis.tex").exists() and hidden(tmp_path) == []

    @pytest.mark.parametrize("entry", sorted(PYTHON_ENTRIES))
    def test_an_empty_directory_is_used_without_overwrite(self, tmp_path, entry):
        (tmp_path / "out").mkdir()
        PYTHON_ENTRIES[entry](tmp_path / "out", False)
        assert open_dataset(tmp_path / "out").num_nodes > 0 and hidden(tmp_path) == []

    def test_a_file_a_link_and_a_foreign_meta_json_are_refused(self, tmp_path):
        (tmp_path / "file").write_text("data")
        (tmp_path / "real").mkdir()
        write_small(tmp_path / "real" / "ds")
        os.symlink(tmp_path / "real" / "ds", tmp_path / "link")
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "meta.json").write_text(json.dumps({"format": "someone-elses"}))
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "meta.json").write_text("{not json")
        for name in ("file", "link", "other", "broken"):
            with pytest.raises(FileExistsError, match="not an lsm-gnn dataset"):
                write_small(tmp_path / name, overwrite=True)
        assert (tmp_path / "file").read_text() == "data" and os.path.islink(tmp_path / "link")
        assert open_dataset(tmp_path / "real" / "ds").num_nodes == 20

    @pytest.mark.parametrize("name", ["thesis.tex", "scores/mine.npy"])
    def test_a_dataset_holding_a_file_it_did_not_write_is_not_replaced(self, tmp_path, name):
        target = tmp_path / "ds"
        write_small(target, num_nodes=20)
        (target / name).parent.mkdir(exist_ok=True)
        (target / name).write_text("years of work")
        with pytest.raises(FileExistsError, match=f"holds files it did not write \\({name}\\).*move them out"):
            write_small(target, num_nodes=30, overwrite=True)
        assert (target / name).read_text() == "years of work" and open_dataset(target).num_nodes == 20
        (target / name).unlink()
        write_small(target, num_nodes=30, overwrite=True)  # its own files alone: replaced
        assert open_dataset(target).num_nodes == 30

    def test_a_dataset_is_replaced_only_with_overwrite_and_kept_until_commit(self, tmp_path):
        target = tmp_path / "ds"
        write_small(target, num_nodes=20)
        with pytest.raises(FileExistsError, match="--overwrite"):
            write_small(target, num_nodes=30)
        with DatasetWriter(target, num_nodes=30, feature_dim=3, overwrite=True) as w:
            w.write_features(np.zeros((30, 3), np.float32))
            w.write_csr(np.zeros(31, np.int64), np.zeros(0, np.int64))
            assert open_dataset(target).num_nodes == 20  # the old one until the new one is complete
            w.commit()
        assert open_dataset(target).num_nodes == 30 and hidden(tmp_path) == []

    def test_something_appearing_during_the_write_is_not_replaced(self, tmp_path):
        target = tmp_path / "ds"
        with DatasetWriter(target, num_nodes=4, feature_dim=1, overwrite=True) as w:
            w.write_features(np.zeros((4, 1), np.float32))
            w.write_csr(np.zeros(5, np.int64), np.zeros(0, np.int64))
            make_foreign_dir(target)
            with pytest.raises(FileExistsError, match="not an lsm-gnn dataset"):
                w.commit()
        assert (target / "thesis.tex").exists() and hidden(tmp_path) == []


# -- temporaries left by killed writers ---------------------------------------------------------

KILLED_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from lsm_gnn.data.writer import DatasetWriter
    w = DatasetWriter(sys.argv[1], num_nodes=1000, feature_dim=4)
    w.write_features(np.ones((500, 4), np.float32))
    print(w.tmp, flush=True)
    time.sleep(60)
""")


class TestStaleTemporaries:
    def test_a_sigkilled_writers_directory_is_removed_by_the_next_write(self, tmp_path):
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "ds")], stdout=subprocess.PIPE,
                                env=env, text=True)
        try:
            left = proc.stdout.readline().strip()
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        assert os.path.isdir(left) and os.path.basename(left).startswith(".ds.tmp-")
        assert f"-{proc.pid}-" in os.path.basename(left)
        write_small(tmp_path / "ds")
        assert not os.path.exists(left) and hidden(tmp_path) == []

    def test_a_running_writers_directory_is_kept(self, tmp_path):
        first = DatasetWriter(tmp_path / "ds", num_nodes=5, feature_dim=1)  # this process: alive
        other = tmp_path / (os.path.basename(first.tmp).replace(f"-{os.getpid()}-", f"-{os.getppid()}-"))
        other.mkdir()
        assert remove_stale_temporaries(tmp_path / "ds") == []
        assert os.path.isdir(first.tmp) and other.is_dir()
        first.abort()

    def test_only_our_own_temporaries_of_this_target_and_host_are_candidates(self, tmp_path):
        pid = dead_pid()
        probe = DatasetWriter(tmp_path / "ds", num_nodes=5, feature_dim=1)
        prefix = os.path.basename(probe.tmp).rsplit("-", 2)[0]  # .ds.tmp-<host>
        probe.abort()
        stale = tmp_path / f"{prefix}-{pid}-abc123_x"
        keep = [tmp_path / f".ds.tmp-otherhost-{pid}-abc123", tmp_path / f"{prefix.replace('.ds.', '.ds2.')}-{pid}-ab",
                tmp_path / f"{prefix}-{pid}-abc.bak", tmp_path / ".ds.tmp-abc123", tmp_path / "ds.tmp-x"]
        for d in [stale, *keep]:
            d.mkdir()
            (d / "features.bin").write_bytes(b"x")
        as_file = tmp_path / f"{prefix}-{pid}-file"
        as_file.write_text("not a directory")
        os.symlink(tmp_path / "ds.tmp-x", tmp_path / f"{prefix}-{pid}-link")
        assert remove_stale_temporaries(tmp_path / "ds") == [str(stale)]
        assert all(d.is_dir() for d in keep) and as_file.exists()
        assert (tmp_path / "ds.tmp-x" / "features.bin").exists()


# -- a full disk ----------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmpfs):
    """A 2 MiB tmpfs (needs root); skipped where it cannot be mounted."""
    return tmpfs("disk", "size=2M")


class TestDiskFull:
    def test_features_larger_than_the_disk_name_the_file(self, small_disk):
        with pytest.raises(DiskFullError) as info:
            with DatasetWriter(small_disk / "ds", num_nodes=4000, feature_dim=256) as w:
                w.write_features(np.ones((4000, 256), np.float32))
        message = str(info.value)
        assert message.startswith(f"{small_disk / 'ds' / 'features.bin'}: the disk is full")
        assert f"{feature_file_bytes(4000, row_stride_for(256 * 4)):,} bytes" in message
        assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
        assert os.listdir(small_disk) == []

    def test_edges_filling_the_disk_mid_write_name_their_file(self, small_disk):
        n = 1000
        edges = np.random.default_rng(0).integers(0, n, size=(2, 400_000))
        with pytest.raises(DiskFullError, match=r"/ds/edges\.\d+\.spill: the disk is full: it needs at least"):
            from_numpy(small_disk / "ds", features=np.ones((n, 4), np.float32), edge_index=edges, scores=(),
                       progress=False)
        assert os.listdir(small_disk) == []

    def test_replacing_a_dataset_on_a_full_disk_keeps_the_old_one(self, small_disk):
        write_small(small_disk / "ds", value=7.0)
        with pytest.raises(DiskFullError):
            write_small(small_disk / "ds", num_nodes=10_000, dim=64, overwrite=True)
        assert open_dataset(small_disk / "ds").read_features_direct(np.arange(3))[0, 0] == 7.0
        assert hidden(small_disk) == []

    def test_the_cli_says_so_in_one_line(self, small_disk, capsys):
        out = small_disk / "syn"
        assert cli_main(["prepare", "synthetic", "--out", str(out), "--num-nodes", "20000", "--feature-dim", "64",
                         "--no-progress", "--scores", "none"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "disk is full" in err[0] and str(out) in err[0]
        assert os.listdir(small_disk) == []

    def test_a_short_write_is_reported_as_a_full_disk(self, tmp_path, monkeypatch):
        real_write = os.write
        calls = []

        def short(fd, data):
            calls.append(len(data))
            return real_write(fd, memoryview(data)[:len(data) // 2]) if len(calls) == 1 else 0

        monkeypatch.setattr(writer_module.os, "write", short)
        f = CheckedFile(str(tmp_path / "x.bin"), size=1000)
        with pytest.raises(DiskFullError, match=r"x\.bin: the disk is full: it needs 1000 B \(1,000 bytes\)"):
            f.write(bytes(100))
        f.close()
        assert calls == [100, 50]

    @pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
    def test_enospc_and_edquot_from_the_kernel_name_the_file(self, tmp_path, monkeypatch, code):
        def fail(fd, data):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(writer_module.os, "write", fail)
        with pytest.raises(DiskFullError, match=r"labels\.npy: the disk is full") as info:
            save_npy(str(tmp_path / "labels.npy"), np.arange(10))
        assert info.value.filename == str(tmp_path / "labels.npy")
        assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == code

    def test_other_errors_pass_through_unchanged(self, tmp_path, monkeypatch):
        def fail(fd, data):
            raise OSError(errno.EIO, "I/O error")

        monkeypatch.setattr(writer_module.os, "write", fail)
        with pytest.raises(OSError) as info:
            save_npy(str(tmp_path / "a.npy"), np.arange(10))
        assert info.value.errno == errno.EIO and not isinstance(info.value, DiskFullError)

    def test_memory_maps_are_allocated_before_use(self, tmp_path, monkeypatch):
        def full(fd, offset, size):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(writer_module.os, "posix_fallocate", full)
        with pytest.raises(DiskFullError, match=r"indices\.npy: the disk is full: it needs"):
            create_npy(str(tmp_path / "indices.npy"), np.int32, (1000,))
        monkeypatch.setattr(writer_module.os, "posix_fallocate",
                            lambda fd, offset, size: (_ for _ in ()).throw(OSError(errno.EOPNOTSUPP, "no")))
        array = create_npy(str(tmp_path / "ok.npy"), np.int32, (10,))  # unsupported: fall back to plain writes
        array[:] = 5
        array.flush()
        del array
        assert np.load(tmp_path / "ok.npy").tolist() == [5] * 10

    def test_meta_json_on_a_full_disk_leaves_no_dataset(self, tmp_path, monkeypatch):
        real = CheckedFile.write

        def write(self, data):
            if self.path.endswith("meta.json"):
                raise DiskFullError(self.path, len(data))
            return real(self, data)

        monkeypatch.setattr(CheckedFile, "write", write)
        with pytest.raises(DiskFullError, match=r"meta\.json: the disk is full"):
            write_small(tmp_path / "ds")
        assert os.listdir(tmp_path) == []

    def test_saved_arrays_read_back_as_numpy_wrote_them(self, tmp_path):
        array = np.random.default_rng(0).standard_normal((1000, 7)).astype(np.float16)
        save_npy(str(tmp_path / "a.npy"), array)
        np.save(tmp_path / "b.npy", array)
        assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()

    def test_recomputing_scores_on_a_full_disk_changes_nothing(self, tmp_path, monkeypatch):
        ds = write_small(tmp_path / "ds")
        (tmp_path / "ds" / "scores").mkdir()
        before = sorted(os.listdir(ds.path)), (tmp_path / "ds" / "meta.json").read_bytes()
        real = CheckedFile.write

        def write(self, data):
            if "reverse_pagerank" in self.path:
                raise DiskFullError(self.path)
            return real(self, data)

        monkeypatch.setattr(CheckedFile, "write", write)
        with pytest.raises(DiskFullError, match="reverse_pagerank"):
            recompute_scores(ds.path, ("degree", "reverse_pagerank"))
        assert (sorted(os.listdir(ds.path)), (tmp_path / "ds" / "meta.json").read_bytes()) == before
        assert os.listdir(tmp_path / "ds" / "scores") == []


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["022", "077"])
def test_what_is_written_through_a_temporary_has_the_mode_a_plain_write_would(tmp_path, umask):
    """A dataset, a table and an atomically written file are readable by whom the umask lets read them (tempfile's
    0700 folders and 0600 files would hide a shared dataset from the team), and a replaced file keeps its mode."""
    from lsm_gnn.storage.table import EmbeddingTable
    from lsm_gnn.utils.fileio import atomic_write_bytes

    old = os.umask(umask)
    try:
        write_small(tmp_path / "ds")
        EmbeddingTable.create(str(tmp_path / "table"), 4, 16, lambda a, b: np.zeros((b - a, 16), np.uint8),
                              layout={}).close()
        atomic_write_bytes(b"page", str(tmp_path / "report.html"))
        (tmp_path / "kept.json").write_text("{}")
        os.chmod(tmp_path / "kept.json", 0o604)
        atomic_write_bytes(b"{}", str(tmp_path / "kept.json"))
    finally:
        os.umask(old)
    mode = lambda p: os.stat(p).st_mode & 0o777  # noqa: E731
    assert mode(tmp_path / "ds") == 0o777 & ~umask
    assert mode(tmp_path / "ds" / "meta.json") == 0o666 & ~umask
    assert mode(tmp_path / "table") == 0o777 & ~umask
    assert mode(tmp_path / "report.html") == 0o666 & ~umask
    assert mode(tmp_path / "kept.json") == 0o604
