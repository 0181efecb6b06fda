"""benchmarks/paper: the paper's evaluation in one command; --quick checks the code path on tiny graphs."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _paper(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks.paper", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.slow
def test_quick_writes_each_figure_with_the_papers_numbers_beside_ours(tmp_path):
    pytest.importorskip("matplotlib")
    result = _paper("--quick", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "fig10.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "paper_vs_ours.md").read_text()
    assert result.stdout.endswith(table)  # after the figures' own tables
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert len(rows) == 6 * 3  # the paper's six policies at its three sizes
    # the paper's published hit ratios beside ours: the hybrid's 0.25 / 0.33 / 0.48 at 4 / 8 / 16 GB
    hybrid = [r for r in rows if r[1].startswith("H2 ")]
    assert [(r[2], r[3]) for r in hybrid] == [("4 GB", "0.25"), ("8 GB", "0.33"), ("16 GB", "0.48")]
    assert all(0 <= float(r[4].rstrip(" |")) <= 1 for r in rows)


def test_an_unknown_figure_is_refused_naming_those_done():
    result = _paper("--quick", "--out", "unused", "--figures", "13")
    assert result.returncode == 2 and "--figures: 13; the figures done so far: 10" in result.stderr


def test_an_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("mine")
    result = _paper("--quick", "--out", str(tmp_path / "f"))
    assert result.returncode == 2 and "is a file; give a directory" in result.stderr
    assert (tmp_path / "f").read_text() == "mine"
