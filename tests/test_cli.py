"""lsm-gnn inspect and bench: output, JSON, and one clear line on bad input."""
import json

import pytest

from lsm_gnn.cli import main
from lsm_gnn.testing import write_tiny_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("cli") / "ds", num_nodes=300, dim=8)[0]


def test_inspect_text_and_verify(dataset, capsys):
    assert main(["inspect", dataset.path, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "nodes     300" in out and "dim 8 float32" in out and "checksums ok" in out
    assert "stride 32 B (16 rows per 512 B block)" in out


def test_inspect_json(dataset, capsys):
    assert main(["inspect", dataset.path, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_nodes"] == 300 and summary["features"]["row_stride"] == 32
    assert summary["splits"] == {"train": 180, "val": 60, "test": 60}


def test_bench_storage(dataset, capsys, tmp_path):
    out_json = tmp_path / "bench.json"
    assert main(["bench", "storage", dataset.path, "--backends", "io_uring,pread,memory", "--seconds", "0.05",
                 "--batch-size", "64", "--json", str(out_json)]) == 0
    results = json.loads(out_json.read_text())["results"]
    assert [r["backend"] for r in results] == ["io_uring", "pread", "memory"]
    assert all(r["rows_per_s"] > 0 for r in results)


def test_json_output_makes_its_folder_and_names_one_it_cannot_make(dataset, capsys, tmp_path):
    out_json = tmp_path / "results" / "today" / "bench.json"  # neither folder exists yet
    assert main(["bench", "storage", dataset.path, "--backends", "memory", "--seconds", "0.02",
                 "--json", str(out_json)]) == 0
    assert json.loads(out_json.read_text())["results"][0]["backend"] == "memory"
    (tmp_path / "a-file").write_text("")
    assert main(["bench", "storage", dataset.path, "--backends", "memory", "--seconds", "0.02",
                 "--json", str(tmp_path / "a-file" / "bench.json")]) == 1
    err = capsys.readouterr().err
    assert "cannot make its directory" in err and "Traceback" not in err


def test_errors_are_one_clear_line(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lsm-gnn: error:") and "no such dataset directory" in err and "Traceback" not in err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "prepare" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["train", "missing.yaml", "--grid", "train.epochs=2"],
                                  ["plan", "missing.yaml", "--sizes", "1%", "model.kind=sage"]])
def test_overrides_after_an_option_are_overrides(argv, capsys):
    """The documented `train configs/ablation.yaml --grid dataset=...` and `plan data/g --sizes ... key=value`."""
    assert main(argv) == 1  # past argument parsing: the config file is what is missing
    assert "config file missing.yaml does not exist" in capsys.readouterr().err


def test_an_unknown_option_after_overrides_is_still_refused(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "missing.yaml", "model.kind=sage", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
