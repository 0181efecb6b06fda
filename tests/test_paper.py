"""benchmarks/paper: the paper's evaluation in one command; --quick checks the code path on tiny graphs."""
import json
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
    everything = [line.split(" | ") for line in table.splitlines()[2:]]
    rows = [r for r in everything if r[0] == "| 10"]
    assert len(rows) == 6 * 3  # the paper's six policies at its three sizes
    # the paper's published hit ratios beside ours: the hybrid's 0.25 / 0.33 / 0.48 at 4 / 8 / 16 GB
    hybrid = [r for r in rows if r[1].startswith("H2 ")]
    assert [(r[2], r[3]) for r in hybrid] == [("4 GB", "0.25"), ("8 GB", "0.33"), ("16 GB", "0.48")]
    assert all(0 <= float(r[4].rstrip(" |")) <= 1 for r in rows)
    # Fig. 12: DistDGL at one shaped link beside both our modes, the paper's best speedups beside ours
    assert (tmp_path / "fig12.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig12 = [r for r in everything if r[0] == "| 12"]
    assert [(r[1], r[3]) for r in fig12] == [("speedup over DistDGL (LSM-GNN)", "3.75"),
                                             ("speedup over DistDGL (M-GIDS)", "-"),
                                             ("speedup over M-GIDS (isolated caches)", "1.54")]
    result = json.loads((tmp_path / "fig12.json").read_text())
    (dd,) = result["distdgl"]
    assert dd["rate_mbit"] > 0 and dd["link_mbit_s"] < 1.25 * dd["rate_mbit"]  # tc shaped the link
    # the same seeds in batches of the same size on every side: as many iterations per rank
    assert {dd["iterations"], *(result["ours"][m]["iterations"] for m in ("shared", "isolated"))} == {8}
    assert 0 < dd["test_accuracy"] <= 1 and result["ours"]["shared"]["hit_ratio"] > 0


def test_an_unknown_figure_is_refused_naming_those_done():
    result = _paper("--quick", "--out", "unused", "--figures", "13")
    assert result.returncode == 2 and "--figures: 13; the figures done so far: 10, 12" in result.stderr


def test_an_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("mine")
    result = _paper("--quick", "--out", str(tmp_path / "f"))
    assert result.returncode == 2 and "is a file; give a directory" in result.stderr
    assert (tmp_path / "f").read_text() == "mine"


@pytest.mark.parametrize("missing, reason", [
    ("namespaces", "network namespaces need root"),
    ("dgl", "dgl 2.0.0 is installed; the baseline is dgl==1.1.3: pip install --no-deps dgl==1.1.3"),
])
def test_fig12_refuses_with_the_reason_where_it_cannot_run(monkeypatch, tmp_path, missing, reason):
    from benchmarks.paper import fig12
    from lsm_gnn.testing import virtual_hosts

    monkeypatch.setattr(virtual_hosts, "unavailable", lambda: reason if missing == "namespaces" else None)
    if missing == "dgl":
        monkeypatch.setitem(sys.modules, "dgl", type(sys)("dgl"))
        sys.modules["dgl"].__version__ = "2.0.0"
    monkeypatch.setattr(fig12.shutil, "which", lambda name: "/usr/sbin/" + name)
    with pytest.raises(RuntimeError, match="Fig. 12 cannot run here: " + reason.replace(".", r"\.")):
        fig12.run(str(tmp_path), quick=True)
    assert not list(tmp_path.iterdir())  # refused before any work


def test_fig12_rows_are_distdgl_time_over_ours_at_each_link():
    from benchmarks.paper import fig12

    result = {"ours": {"shared": {"epoch_s": 10.0}, "isolated": {"epoch_s": 15.0}},
              "distdgl": [{"epoch_s": 30.0, "link_over_ssd": 0.5}, {"epoch_s": 12.0, "link_over_ssd": 8.0}]}
    got = [(r["what"], r["size"], r["paper"], r["ours"]) for r in fig12.rows(result)]
    assert got == [("speedup over DistDGL (LSM-GNN)", "link/SSD 0.50", 3.75, 3.0),
                   ("speedup over DistDGL (M-GIDS)", "link/SSD 0.50", None, 2.0),
                   ("speedup over DistDGL (LSM-GNN)", "link/SSD 8.00", 3.75, 1.2),
                   ("speedup over DistDGL (M-GIDS)", "link/SSD 8.00", None, 0.8),
                   ("speedup over M-GIDS (isolated caches)", "one host", 1.54, 1.5)]


def test_fig12_medians_pair_each_setting_over_repeats():
    from benchmarks.paper import fig12

    def repeat(shared, dd):
        return {"ours": {"shared": {"epoch_s": shared}},
                "distdgl": [{"epoch_s": e, "link_over_ssd": x, "iterations": 5} for e, x in dd],
                "ratios_run": [None, 1.0], "skipped_ratios": [4.0]}

    got = fig12.medians([repeat(10.0, [(50.0, 3.9), (29.0, 0.9)]), repeat(12.0, [(30.0, 3.7), (31.0, 1.1)]),
                         repeat(11.0, [(40.0, 3.8), (33.0, 1.0)])])
    assert got["ours"]["shared"]["epoch_s"] == 11.0 and got["ours"]["shared"]["epoch_s_each"] == [10.0, 12.0, 11.0]
    assert [(d["epoch_s"], d["link_over_ssd"], d["iterations"]) for d in got["distdgl"]] == [(40.0, 3.8, 5),
                                                                                           (31.0, 1.0, 5)]
    assert got["skipped_ratios"] == [4.0] and got["ratios_run"] == [None, 1.0]
