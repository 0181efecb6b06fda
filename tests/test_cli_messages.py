"""Bad values of command-line options and input files: each refused with the option or file named and what to give
instead, before any work (issue 46's older unclear messages)."""
import numpy as np
import pytest

from lsm_gnn.cli import main


def latin1_csv(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_bytes("user,item\nJos\u00e9,a\nAnn,b\n".encode("latin-1"))
    return ["prepare", "interactions", "--interactions", str(path), "--out", str(tmp_path / "ds"), "--no-progress"]


def object_array_features(tmp_path):
    np.save(tmp_path / "x.npy", np.array([[1.0, "a"]], dtype=object))
    return ["prepare", "npy", "--features", str(tmp_path / "x.npy"), "--out", str(tmp_path / "ds")]


def binary_config(tmp_path):
    (tmp_path / "run.yaml").write_bytes(b"model:\n  kind: s\xecge\n")
    return ["train", str(tmp_path / "run.yaml")]


def binary_manifest(tmp_path):
    (tmp_path / "m.yaml").write_bytes(b"node_types: {\xff}")
    return ["prepare", "hetero", "arrays", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "ds")]


def text_as_checkpoint(tmp_path):
    (tmp_path / "c.pt").write_text("not a checkpoint")
    return ["evaluate", str(tmp_path / "c.pt")]


def directory_as_features(tmp_path):
    return ["prepare", "npy", "--features", str(tmp_path), "--out", str(tmp_path / "ds")]


@pytest.mark.parametrize("argv, message", [
    (["plan", "ds", "--tolerance", "nan"], r"argument --tolerance: must be a finite number at least 0, got 'nan'"),
    (["export", "c.pt", "--out", "x", "--top-k", "-3"], r"argument --top-k: a count cannot be negative, got '-3'"),
    (["prepare", "synthetic", "--out", "x", "--num-nodes", "9", "--avg-degree", "nan"], r"argument --avg-degree"),
    (["prepare", "synthetic", "--out", "x", "--num-nodes", "9", "--homophily", "2"],
     r"argument --homophily: must be a finite number at least 0 and at most 1, got '2'"),
    (["prepare", "bipartite", "--out", "x", "--num-users", "9", "--num-items", "9", "--test-fraction", "inf"],
     r"argument --test-fraction: must be a finite number"),
    (["prepare", "embedding", "ds", "--out", "t", "--dim", "0"], r"argument --dim: must be at least 1, got 0"),
    (["prepare", "embedding", "ds", "--out", "t", "--dim", "4", "--init-std", "-1"], r"argument --init-std"),
    (["prepare", "synthetic", "--out", "x", "--num-nodes", "9", "--split", "0.5,nan,0.2"],
     r"argument --split: expected train,val,test fractions summing to at most 1, got '0.5,nan,0.2'"),
    (["bench", "storage", "ds", "--seconds", "inf"], r"argument --seconds: must be a finite number above 0"),
    (["bench", "storage", "ds", "--queue-depth", "0"], r"argument --queue-depth: must be at least 1"),
    (latin1_csv, r"ratings.csv is not UTF-8 text: byte 0xe9 .*iconv -f latin1 -t utf-8"),
    (object_array_features, r"features: .*x.npy holds Python objects \(dtype object\).*np.float32"),
    (binary_config, r"run.yaml is not valid YAML: unacceptable character #x00ec.*position 16"),
    (binary_manifest, r"m.yaml is not YAML or JSON: unacceptable character"),
    (text_as_checkpoint, r"c.pt is not a readable lsm-gnn checkpoint; it is damaged, was not written by lsm-gnn"),
    (directory_as_features, r"features: .* is a directory; give the .npy file in it"),
])
def test_a_bad_option_or_file_is_refused_naming_it_and_the_fix(tmp_path, monkeypatch, capsys, argv, message):
    import re

    monkeypatch.chdir(tmp_path)
    if callable(argv):
        argv = argv(tmp_path)
        assert main(argv) == 1
    else:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "ds").exists() and not (tmp_path / "x").exists()
