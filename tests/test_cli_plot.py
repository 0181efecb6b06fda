"""lsm-gnn plot: a run's curves, stage times and hit ratio drawn from its metrics log."""
import pytest

from lsm_gnn.cli import main
from lsm_gnn.cli_plot import moving_average, read_log
from lsm_gnn.testing import write_tiny_dataset

pytest.importorskip("matplotlib")
pytest.importorskip("torch_geometric")


def test_a_runs_log_becomes_three_pictures(tmp_path, capsys):
    ds, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=400)
    assert main(["train", f"dataset={ds.path}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[3,2]",
                 "sampler.batch_size=32", "cache.capacity=70%", "train.epochs=2", f"log.dir={tmp_path / 'log'}",
                 "log.progress=false"]) == 0
    log = read_log(str(tmp_path / "log"))
    assert len(log["iterations"]) > 10 and len(log["evaluations"]) == 2
    capsys.readouterr()
    assert main(["plot", str(tmp_path / "log"), "--out", str(tmp_path / "pics"), "--title", "tiny"]) == 0
    out = capsys.readouterr().out
    for name in ("curves.png", "stages.png", "cache.png"):
        data = (tmp_path / "pics" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
        assert f"wrote {tmp_path / 'pics' / name}" in out
    assert main(["plot", str(tmp_path / "nothing")]) == 1
    assert "no metrics log" in capsys.readouterr().err


def test_the_moving_average_skips_missing_values():
    assert moving_average([1.0, None, 3.0, 5.0], width=2) == [1.0, 1.0, 2.0, 4.0]
    assert moving_average([None, 2.0]) == [None, 2.0]
