"""Bad input met by the last fault probe, each now one line naming the key or the file and the fix (they were
internal errors, an out-of-memory kill, or silently accepted)."""
import json

import pytest

from lsm_gnn.cli import main

pytest.importorskip("torch_geometric")

GRAPH = dict(num_nodes=300, avg_degree=4, feature_dim=8, num_classes=3, seed=4)


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic

    path = tmp_path_factory.mktemp("hetero") / "h"
    generate_hetero_synthetic(path, num_papers=200, feature_dim=8, progress=False)
    return str(path)


def interactions(tmp_path, *extra_lines, name="i.csv") -> str:
    lines = ["user,item,ts"] + [f"{u},{(u * 7 + k) % 30},{u * 100 + k}" for u in range(40) for k in range(6)]
    path = tmp_path / name
    path.write_text("\n".join(lines + list(extra_lines)) + "\n")
    return str(path)


def prepare(tmp_path, source, *options) -> int:
    return main(["prepare", "interactions", "--out", str(tmp_path / "out"), "--interactions", source, "--no-progress",
                 *options])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("lsm-gnn: error:") and "internal error" not in err and err.count("\n") == 1, err
    return err


def test_ids_beyond_int64_are_kept_as_text(tmp_path, capsys):
    huge = 2 ** 70
    assert prepare(tmp_path, interactions(tmp_path, f"{huge},3,5")) == 0
    from lsm_gnn.data import open_dataset
    from lsm_gnn.data.interactions import id_maps

    users, _ = id_maps(open_dataset(str(tmp_path / "out")))
    assert str(huge) in users.astype(str).tolist()


def test_a_field_over_the_csv_limit_is_named_with_its_line(tmp_path, capsys):
    assert prepare(tmp_path, interactions(tmp_path, "7," + "x" * 200_000 + ",5")) == 1
    err = one_line_error(capsys)
    assert "i.csv line 242" in err and "field larger than field limit" in err and "quoting" in err


def test_a_delimiter_of_several_characters_is_refused(tmp_path, capsys):
    assert prepare(tmp_path, interactions(tmp_path), "--delimiter", ";;") == 1
    assert "--delimiter" in one_line_error(capsys)


def test_numbers_and_dates_in_one_timestamp_column_are_refused(tmp_path, capsys):
    assert prepare(tmp_path, interactions(tmp_path, "3,4,2024-05-01"), "--time-col", "ts") == 1
    err = one_line_error(capsys)
    assert "line 242: timestamps mix numbers and dates" in err  # was read as the years 0..3905


def test_link_prediction_on_a_heterogeneous_dataset_names_the_key(hetero, capsys):
    assert main(["train", f"dataset={hetero}", "train.task=link", "log.progress=false"]) == 1
    err = one_line_error(capsys)
    assert "train.task=link" in err and "train.task=node" in err


def test_bench_storage_measures_each_node_types_feature_file(hetero, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "storage", hetero, "--backends", "pread", "--seconds", "0.02", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["node_type"] for r in results] == ["paper", "author", "institute", "fos"]
    assert all(r["rows_per_s"] > 0 for r in results)


@pytest.mark.parametrize("seed", ["-1", str(10 ** 23)])
def test_a_seed_out_of_range_names_the_key(graph, seed, capsys):
    assert main(["train", f"dataset={graph}", f"train.seed={seed}", "log.progress=false"]) == 1
    assert "train.seed must be an integer from 0 to 2^63 - 1" in one_line_error(capsys)


def test_a_model_larger_than_memory_is_refused_before_it_is_allocated(graph, capsys):
    assert main(["train", f"dataset={graph}", "model.hidden=100000", "cache.capacity=60%", "log.progress=false"]) == 1
    err = one_line_error(capsys)
    assert "model.hidden=100000" in err and "lower model.hidden" in err
