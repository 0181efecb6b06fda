"""data.verify=checksums: a file damaged on disk after it was written (a flipped byte in a feature row, a
neighbor id changed to another valid id) stops the run with the file named; off (the default), it trains on."""
import shutil

import numpy as np
import pytest

pytest.importorskip("torch_geometric")

from lsm_gnn.cli import main  # noqa: E402
from lsm_gnn.config import ConfigError, load_config  # noqa: E402
from lsm_gnn.data.format import DatasetError  # noqa: E402
from lsm_gnn.trainer import Trainer  # noqa: E402

GRAPH = dict(num_nodes=600, avg_degree=5, feature_dim=8, num_classes=3, seed=6)


def args(path, *more):
    return [f"dataset={path}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[2,2]", "sampler.batch_size=60",
            "cache.capacity=60%", "log.progress=false", "train.epochs=2", *more]


def flip_a_feature_byte(path):
    with open(path / "features.bin", "r+b") as f:
        f.seek(123)
        byte = f.read(1)
        f.seek(123)
        f.write(bytes([byte[0] ^ 0x01]))


def change_a_neighbor_id(path):
    indices = np.load(path / "indices.npy", mmap_mode="r+")
    indices[7] = (int(indices[7]) + 1) % 600  # still a valid node: only the checksum tells
    indices.flush()


@pytest.mark.parametrize("damage,name", [(flip_a_feature_byte, "features.bin"),
                                         (change_a_neighbor_id, "indices.npy")])
def test_a_damaged_file_stops_the_run_naming_it(graph, tmp_path, damage, name):
    copy = tmp_path / "g"
    shutil.copytree(graph, copy)
    damage(copy)
    Trainer(load_config(None, args(copy))).fit()  # off: nothing reads the checksums, it trains on
    trainer = Trainer(load_config(None, args(copy, "data.verify=checksums")))
    with pytest.raises(DatasetError, match=f"{name}: checksum .* does not match .*data.verify=checksums"):
        trainer.fit()


def test_an_intact_dataset_is_checked_whole_and_trains(graph, capsys):
    trainer = Trainer(load_config(None, args(graph, "data.verify=checksums")))
    trainer.fit()
    assert trainer.verify.done and set(trainer.verify.checked) == set(trainer.dataset.meta["checksums"])
    assert main(["train", *args(graph, "data.verify=sampled")]) == 1
    assert "data.verify='sampled' is not valid; choose one of: off, checksums" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        load_config(None, args(graph, "data.verify=yes"))
