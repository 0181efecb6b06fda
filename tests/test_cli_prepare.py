"""``prepare`` sub-commands, driven through argparse as the main program does."""
import argparse
import os

import numpy as np
import pytest

from lsm_gnn.cli.prepare import add_prepare_parser, parse_count, recompute_scores
from lsm_gnn.data import open_dataset


def _run(argv):
    parser = argparse.ArgumentParser(prog="lsm-gnn")
    add_prepare_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_prepare_synthetic_writes_a_dataset_and_prints_one_line(tmp_path, capsys):
    out = tmp_path / "syn"
    assert _run(["prepare", "synthetic", "--out", str(out), "--num-nodes", "1.5e3", "--avg-degree", "8",
                 "--feature-dim", "16", "--dtype", "float16", "--classes", "4", "--seed", "3", "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "1,500 nodes" in lines[0] and "16 x float16" in lines[0] and "4 classes" in lines[0]
    ds = open_dataset(out)
    assert (ds.num_nodes, ds.feature_dim, ds.num_classes(), ds.meta["generator"]["seed"]) == (1500, 16, 4, 3)
    with pytest.raises(FileExistsError, match="--overwrite"):
        _run(["prepare", "synthetic", "--out", str(out), "--num-nodes", "100", "--no-progress"])
    _run(["prepare", "synthetic", "--out", str(out), "--num-nodes", "100", "--no-progress", "--overwrite",
          "--scores", "none"])
    assert open_dataset(out).num_nodes == 100 and open_dataset(out).score_names() == []


def test_prepare_npy_converts_files(tmp_path, capsys):
    rng = np.random.default_rng(0)
    arrays = {"features": rng.standard_normal((50, 6)).astype(np.float32),
              "edge-index": rng.integers(0, 50, size=(120, 2)),  # (E, 2) is accepted from files
              "labels": rng.integers(0, 3, size=50), "train-idx": np.arange(30), "test-idx": np.arange(40, 50)}
    argv = ["prepare", "npy", "--out", str(tmp_path / "ds"), "--undirected", "--no-progress"]
    for flag, array in arrays.items():
        np.save(tmp_path / f"{flag}.npy", array)
        argv += [f"--{flag}", str(tmp_path / f"{flag}.npy")]
    assert _run(argv) == 0
    assert "50 nodes" in capsys.readouterr().out
    ds = open_dataset(tmp_path / "ds")
    np.testing.assert_array_equal(ds.read_features_direct(np.arange(50)), arrays["features"])
    assert ds.meta["converted"]["undirected"] is True
    assert sorted(ds.meta["splits"]) == ["test", "train"]
    argv[argv.index(str(tmp_path / "ds"))] = str(tmp_path / "ds2")
    assert _run(argv + ["--keep-duplicates", "--drop-self-loops"]) == 0
    kept = open_dataset(tmp_path / "ds2")
    assert kept.meta["converted"]["dedup"] is False and kept.meta["converted"]["self_loops"] is False
    edges = arrays["edge-index"]
    edges = edges[edges[:, 0] != edges[:, 1]]
    assert kept.num_edges == 2 * len(edges) > ds.num_edges  # both directions, repeats kept, loops gone


def test_prepare_folder_with_a_random_split(tmp_path, capsys):
    src = tmp_path / "igb" / "processed" / "paper"
    src.mkdir(parents=True)
    np.save(src / "node_feat.npy", np.ones((40, 3), np.float32))
    np.save(src / "edge_index.npy", np.stack([np.arange(40), (np.arange(40) + 1) % 40], axis=1))
    np.save(src / "node_label_19.npy", np.arange(40, dtype=np.float32) % 19)
    _run(["prepare", "folder", "--src", str(tmp_path / "igb"), "--out", str(tmp_path / "ds"), "--undirected",
          "--random-split", "0.5,0.25,0.25", "--no-progress"])
    ds = open_dataset(tmp_path / "ds")
    assert ds.num_classes() == 19 and len(ds.split("train")) == 20 and ds.num_edges == 80


def test_prepare_scores_replaces_them_atomically(tmp_path, capsys):
    out = tmp_path / "syn"
    _run(["prepare", "synthetic", "--out", str(out), "--num-nodes", "300", "--feature-dim", "4", "--no-progress",
          "--scores", "degree"])
    before = open_dataset(out)
    assert before.score_names() == ["degree"]
    old_file, old_degree = before.meta["scores"]["degree"], np.array(before.score("degree"))
    _run(["prepare", "scores", str(out)])
    after = open_dataset(out)
    assert after.score_names() == ["degree", "reverse_pagerank"]
    after.verify_checksums()
    np.testing.assert_array_equal(after.score("degree"), old_degree)
    assert not os.path.exists(os.path.join(out, old_file))  # the replaced file is gone
    assert sorted(os.listdir(out / "scores")) == sorted(os.path.basename(f) for f in after.meta["scores"].values())
    assert not [f for f in os.listdir(out) if ".tmp" in f]  # neither the old ".tmp" suffix nor ".tmp-<host>-"
    pagerank = np.array(after.score("reverse_pagerank"))
    again = recompute_scores(out, ["reverse_pagerank"])
    np.testing.assert_array_equal(again.score("reverse_pagerank"), pagerank)


@pytest.mark.parametrize("text, value", [("1000", 1000), ("1e6", 10**6), ("1_000", 1000), ("2.5e3", 2500)])
def test_counts_accept_ints_and_powers_of_ten(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["1.5", "ten", "-3"])
def test_bad_counts_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_count(text)


@pytest.mark.parametrize("command", [
    ["synthetic", "--num-nodes", "0"], ["synthetic", "--num-nodes", "100", "--feature-dim", "0"],
    ["synthetic", "--num-nodes", "100", "--classes", "0"], ["bipartite", "--num-users", "0", "--num-items", "5"],
    ["bipartite", "--num-users", "9", "--num-items", "5", "--communities", "0"],
    ["hetero", "synthetic", "--num-papers", "0"],
])
def test_a_zero_size_names_the_flag(tmp_path, capsys, command):
    """Not the generator's parameter name (num_nodes, feature_dim): the flag the user typed."""
    flag = next(a for a, b in zip(command, command[1:]) if b == "0")
    with pytest.raises(SystemExit):
        _run(["prepare", *command, "--out", str(tmp_path / "d")])
    assert f"argument {flag}: must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_prepare_needs_a_sub_command(capsys):
    with pytest.raises(SystemExit):
        _run(["prepare"])
    assert "synthetic" in capsys.readouterr().err
