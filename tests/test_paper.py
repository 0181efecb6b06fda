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
    fig10 = [r for r in rows if r[0] == "| 10"]
    assert len(fig10) == 6 * 3  # the paper's six policies at its three sizes
    # the paper's published hit ratios beside ours: the hybrid's 0.25 / 0.33 / 0.48 at 4 / 8 / 16 GB
    hybrid = [r for r in fig10 if r[1].startswith("H2 ")]
    assert [(r[2], r[3]) for r in hybrid] == [("4 GB", "0.25"), ("8 GB", "0.33"), ("16 GB", "0.48")]
    assert all(0 <= float(r[4].rstrip(" |")) <= 1 for r in fig10)
    # Fig. 11: PVP's hit ratios and its speedup with 2 SSDs beside ours, and our two comparisons
    assert (tmp_path / "fig11.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig11 = {(r[1], r[2]): (r[3], float(r[4].rstrip(" |"))) for r in rows if r[0] == "| 11"}
    assert len(fig11) == 7 * 3
    assert fig11[("hybrid+PVP hit ratio", "16 GB")][0] == "0.69"
    assert fig11[("hybrid+PVP speedup, same cache (paper: 2 SSDs)", "4 GB")][0] == "1.54"
    assert all(v > 0 for _, v in fig11.values())


def test_an_unknown_figure_is_refused_naming_those_done():
    result = _paper("--quick", "--out", "unused", "--figures", "13")
    assert result.returncode == 2 and "--figures: 13; the figures done so far: 10, 11" in result.stderr


def test_an_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("mine")
    result = _paper("--quick", "--out", str(tmp_path / "f"))
    assert result.returncode == 2 and "is a file; give a directory" in result.stderr
    assert (tmp_path / "f").read_text() == "mine"


def test_fig11_reads_every_miss_from_disk_and_pvp_only_turns_reads_into_hits(tmp_path):
    """Fig. 11's measurement: the caches' misses are real reads of 4 KiB rows (the file's bytes, each miss once),
    and PVP with reinstall leaves the cache's own hits as they are, serving some of its misses from the queues."""
    import numpy as np
    import torch

    from benchmarks import pvp
    from benchmarks.paper.fig11 import rows_on_disk

    num_nodes, window = 2000, 8
    from lsm_gnn.storage import open_storage

    storage = open_storage(rows_on_disk(str(tmp_path / "rows.bin"), num_nodes, pvp.FEATURE_ROW_BYTES), "auto")
    ids = torch.tensor([5, 1999, 0, 5])
    assert torch.equal(storage.read(ids), ids[:, None].float().expand(4, 1024))  # row i holds i
    rng = np.random.default_rng(0)
    trace = [torch.from_numpy(np.unique(rng.zipf(1.3, 60) % num_nodes)) for _ in range(40 + window)]
    static = np.zeros(num_nodes)
    plain, with_pvp = (pvp.run(trace, num_nodes, "farthest", mode, 1, window, 4, 4, static, 8, storage=storage)
                       for mode in ("off", "reinstall"))
    for r in (plain, with_pvp):
        assert r["disk_bytes_read"] == r["rows_read"] * pvp.FEATURE_ROW_BYTES > 0
        assert 0 < r["read_seconds"] < r["measured_seconds"]
    assert with_pvp["cache_hit_ratio"] == plain["cache_hit_ratio"] and with_pvp["pvp_hits"] > 0
    assert with_pvp["rows_read"] == plain["rows_read"] - with_pvp["pvp_hits"]
    storage.close()
