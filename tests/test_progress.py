"""Progress bars show on a terminal only: a log file or pipe gets the run's own lines, not a bar's redraws."""
import io
import subprocess
import sys

from lsm_gnn.utils.progress import progress_bar, shows_bars


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_draws_on_a_terminal_and_not_into_a_file(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    with progress_bar(True, total=3) as bar:
        assert not bar.disable
        bar.update(3)
    assert "3/3" in sys.stderr.getvalue()
    with progress_bar(False, total=3) as bar:  # asked off: off on a terminal too
        assert bar.disable
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress_bar(True, total=3) as bar:
        assert bar.disable
        bar.update(3)
    assert sys.stderr.getvalue() == ""
    with progress_bar(True, total=3000, desc="edges", unit="edge"):  # one line says which step runs
        pass
    with progress_bar(False, total=3, desc="hidden"):
        pass
    assert sys.stderr.getvalue() == "edges: 3,000 edges\n"
    closed = io.StringIO()
    closed.close()
    assert not shows_bars(closed)


def test_a_generator_run_into_a_pipe_prints_no_bar(tmp_path):
    run = subprocess.run([sys.executable, "-m", "lsm_gnn", "prepare", "synthetic", "--out", str(tmp_path / "g"),
                          "--num-nodes", "3000", "--feature-dim", "4"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "\r" not in run.stderr and "it/s" not in run.stderr and "node/s" not in run.stderr, run.stderr[-2000:]
    assert "features: 3,000 nodes" in run.stderr  # the step, once
