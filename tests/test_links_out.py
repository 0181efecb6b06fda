"""A dataset's, a table's, a log's or a checkpoint directory's files are its own: a symbolic link out of the
directory is refused with the path named, and the file it points to is neither read as data nor written."""
import os
import shutil

import numpy as np
import pytest

from lsm_gnn.config import ConfigError, load_config
from lsm_gnn.data import open_dataset
from lsm_gnn.data.format import DatasetError
from lsm_gnn.storage import EmbeddingTable, TableError
from lsm_gnn.testing import write_tiny_dataset
from lsm_gnn.training.checkpoint_files import CheckpointError
from lsm_gnn.utils.fileio import escape_from

pytest.importorskip("torch_geometric")

GRAPH = dict(num_nodes=300, avg_degree=4, feature_dim=8, num_classes=3, seed=2)


def move_out(directory, name, outside):
    """Moves ``directory/name`` to ``outside`` and leaves a symbolic link to it in its place."""
    shutil.move(os.path.join(directory, name), outside)
    os.symlink(outside, os.path.join(directory, name))


def test_which_names_stay_inside(tmp_path):
    (tmp_path / "a").write_text("")
    os.symlink("a", tmp_path / "inside")  # a link within the directory is its own file
    os.symlink("/etc/hostname", tmp_path / "out")
    os.mkdir(tmp_path / "sub")
    os.symlink(tmp_path.parent, tmp_path / "sub" / "up")
    assert escape_from(str(tmp_path), "a") is None and escape_from(str(tmp_path), "inside") is None
    assert "symbolic link to /etc/hostname" in escape_from(str(tmp_path), "out")
    assert "leads outside" in escape_from(str(tmp_path), "sub/up/x")  # a link on the way
    assert "names a file outside" in escape_from(str(tmp_path), "../x")
    assert "names a file outside" in escape_from(str(tmp_path), "/etc/hostname")


@pytest.mark.parametrize("name", ["features.bin", "indices.npy", "labels.npy"])
def test_a_dataset_file_linked_out_is_refused(tmp_path, name):
    ds, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=100)
    move_out(ds.path, name, str(tmp_path / f"elsewhere-{name}"))
    with pytest.raises(DatasetError, match=f"{name} leads outside .*ds.*symbolic link to .*elsewhere-{name}"):
        open_dataset(ds.path)


def test_a_table_file_linked_out_is_refused_and_never_written(tmp_path):
    rows = lambda start, stop: np.zeros((stop - start, 16), dtype=np.uint8)  # noqa: E731
    for name in ("table.bin", "table.json", "undo.0.log"):
        path = tmp_path / name.replace(".", "_")
        EmbeddingTable.create(path, 64, 16, rows, layout={}).close()
        outside = tmp_path / f"outside-{name}"
        move_out(str(path), name, str(outside))
        before = outside.read_bytes()
        with pytest.raises(TableError, match=f"{name} leads outside .*symbolic link"):
            EmbeddingTable.open(path)
        assert outside.read_bytes() == before


def test_a_log_or_checkpoint_linked_out_is_refused(graph, tmp_path):
    from lsm_gnn.training.trainer import Trainer

    ckpt = tmp_path / "ckpt"
    args = [f"dataset={graph}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[2,2]", "sampler.batch_size=64",
            "cache.capacity=60%", "log.progress=false", "train.epochs=1", f"checkpoint.dir={ckpt}", f"log.dir={ckpt}"]
    trainer = Trainer(load_config(None, args))
    trainer.fit()
    trainer.close()
    outside = tmp_path / "outside.jsonl"
    outside.write_text("mine\n")
    os.replace(ckpt / "metrics.jsonl", tmp_path / "old.jsonl")
    os.symlink(outside, ckpt / "metrics.jsonl")
    with pytest.raises(ConfigError, match="metrics.jsonl leads outside"):
        Trainer(load_config(None, args))
    assert outside.read_text() == "mine\n"
    os.unlink(ckpt / "metrics.jsonl")
    move_out(str(ckpt), "last.pt", str(tmp_path / "elsewhere.pt"))
    with pytest.raises(CheckpointError, match="last.pt leads outside"):
        Trainer(load_config(None, args))
