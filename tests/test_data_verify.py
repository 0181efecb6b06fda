"""data.verify: a file damaged on disk after it was written (a flipped byte in a feature row, a neighbor id changed
to another valid id) stops the run with the file named. ``checksums`` re-reads every file whole; ``sampled`` (what
``auto``, the default, picks for a dataset of this size) checks the blocks a sample of each batch's input nodes
were read from, against the block checksums the writers record; ``off`` trains on."""
import json
import os
import shutil
import subprocess
import sys
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lsm_gnn.data import open_dataset
from lsm_gnn.data.format import BLOCK_BYTES, BLOCK_SUMS_FILE, DatasetError

pytest.importorskip("torch_geometric")

from lsm_gnn.cli import main  # noqa: E402
from lsm_gnn.config import ConfigError, load_config  # noqa: E402
from lsm_gnn.data.synthetic import generate_synthetic  # noqa: E402
from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic  # noqa: E402
from lsm_gnn.data.verify import SampledVerify, resolve_mode  # noqa: E402
from lsm_gnn.training.trainer import Trainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAPH = dict(num_nodes=600, avg_degree=5, feature_dim=8, num_classes=3, seed=6)


def args(path, *more):
    return [f"dataset={path}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[2,2]", "sampler.batch_size=60",
            "cache.capacity=60%", "log.progress=false", "train.epochs=2", *more]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def flip_a_feature_byte(path):
    flip_byte(path / "features.bin", 123)


def change_a_neighbor_id(path):
    indices = np.load(path / "indices.npy", mmap_mode="r+")
    indices[7] = (int(indices[7]) + 1) % 600  # still a valid node: only the checksum tells
    indices.flush()


def copy_of(graph, tmp_path):
    copy = tmp_path / "g"
    shutil.copytree(graph, copy)
    return copy


def block_sums(path, name):
    """The CRC-32 of each BLOCK_BYTES block of a file, computed here independently of the writer."""
    data = open(os.path.join(path, name), "rb").read()
    return [zlib.crc32(data[i:i + BLOCK_BYTES]) for i in range(0, len(data), BLOCK_BYTES)]


def recorded_sums(path, name):
    meta = json.load(open(os.path.join(path, "meta.json")))
    first, count = meta["block_checksums"]["files"][name]
    sums = np.fromfile(os.path.join(path, meta["block_checksums"]["file"]), dtype="<u4")
    return [int(v) for v in sums[first:first + count]]


def test_the_writers_record_every_blocks_checksum(tmp_path):
    """Both schemas: each data file's block sums (feature files summed as written, the rest at commit) equal the
    CRC-32s of its blocks, and the block-sum file is itself in the whole-file checksums."""
    one = generate_synthetic(tmp_path / "one", num_nodes=5000, avg_degree=4, feature_dim=40, seed=1, progress=False)
    two = generate_hetero_synthetic(tmp_path / "two", num_papers=1500, feature_dim=48, progress=False)
    for ds in (one, two):
        meta = ds.meta
        files = meta["block_checksums"]["files"]
        assert set(files) == set(meta["checksums"]) - {BLOCK_SUMS_FILE}
        for name in files:
            assert recorded_sums(ds.path, name) == block_sums(ds.path, name), name
        assert max(c for _, c in files.values()) > 1  # files of several blocks were covered
        ds.verify_checksums()  # the whole-file sums still hold, the block-sum file's among them


@pytest.mark.parametrize("edit,problem", [
    (lambda m: m["block_checksums"].update(block_bytes=5000), "multiple of 4096"),
    (lambda m: m["block_checksums"].update(block_bytes=1000), r"outside \[4096, "),
    (lambda m: m["block_checksums"]["files"].update({"features.bin": [0]}), r"\[first, count\]"),
    (lambda m: m["block_checksums"]["files"].update({"features.bin": [10 ** 6, 1]}), "lies beyond"),
    (lambda m: m["block_checksums"].update(file="nope.bin"), "block checksum file .* is missing"),
])
def test_damaged_block_checksum_keys_are_refused_on_open(graph, tmp_path, edit, problem):
    copy = copy_of(graph, tmp_path)
    meta = json.load(open(copy / "meta.json"))
    edit(meta)
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=problem):
        open_dataset(copy)


def test_a_file_whose_size_no_longer_matches_its_blocks_is_refused_on_open(graph, tmp_path):
    copy = copy_of(graph, tmp_path)
    with open(copy / "labels.npy", "ab") as f:
        f.write(bytes(BLOCK_BYTES))
    with pytest.raises(DatasetError, match="labels.npy: the file has .* bytes, which is not the 1 blocks"):
        open_dataset(copy)


@pytest.mark.parametrize("damage,name", [(flip_a_feature_byte, "features.bin"),
                                         (change_a_neighbor_id, "indices.npy")])
def test_a_damaged_file_stops_the_run_naming_it(graph, tmp_path, damage, name):
    copy = copy_of(graph, tmp_path)
    damage(copy)
    Trainer(load_config(None, args(copy, "data.verify=off"))).fit()  # off: nothing reads the checksums
    trainer = Trainer(load_config(None, args(copy, "data.verify=checksums")))
    with pytest.raises(DatasetError, match=f"{name}: checksum .* does not match .*data.verify=checksums"):
        trainer.fit()


@pytest.mark.parametrize("damage,name", [(flip_a_feature_byte, "features.bin"),
                                         (change_a_neighbor_id, "indices.npy")])
def test_by_default_a_damaged_block_stops_the_cli_run_naming_file_and_offset(graph, tmp_path, damage, name):
    """A real run of the command: auto picks sampled for this dataset, and the block every row and neighbor
    list lies in (the files are one block each) is read and found damaged."""
    copy = copy_of(graph, tmp_path)
    damage(copy)
    run = subprocess.run([sys.executable, "-m", "lsm_gnn", "train", *args(copy)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 1, run.stderr
    assert f"{name}: bytes 0..{os.path.getsize(copy / name)} (block 0 of {BLOCK_BYTES} bytes) have checksum" \
        in run.stderr
    assert "data.verify=sampled, while training" in run.stderr


def test_an_intact_dataset_is_checked_whole_and_trains(graph):
    trainer = Trainer(load_config(None, args(graph, "data.verify=checksums")))
    trainer.fit()
    verify = trainer.resources.verify
    assert verify.done and set(verify.checked) == set(trainer.dataset.meta["checksums"])
    with pytest.raises(ConfigError):
        load_config(None, args(graph, "data.verify=yes"))


def test_sampled_checks_blocks_the_run_reads_and_trains(graph, capsys):
    trainer = Trainer(load_config(None, args(graph)))
    assert trainer.resources.verify_mode == "sampled"
    result = trainer.fit()
    assert "data.verify=sampled: checking the blocks read" in capsys.readouterr().out
    verify = trainer.resources.verify
    assert verify.done and verify.blocks_checked == 2  # features.bin and indices.npy, once each
    assert result["data_verify"] == {"mode": "sampled", "bytes_read": verify.bytes_read, "blocks_checked": 2,
                                     "batches_dropped": 0}


def test_a_dataset_without_block_checksums_is_not_sampled(graph, tmp_path, capsys):
    """Written by an earlier version: auto turns the check off, sampled names the fix."""
    copy = copy_of(graph, tmp_path)
    meta = json.load(open(copy / "meta.json"))
    del meta["block_checksums"]
    (copy / "meta.json").write_text(json.dumps(meta))
    ds = open_dataset(copy)
    assert resolve_mode(ds, "auto") == "off"
    Trainer(load_config(None, args(copy, "train.epochs=1"))).fit()
    assert "data.verify=auto: off for this dataset" in capsys.readouterr().out
    assert main(["train", *args(copy, "data.verify=sampled")]) == 1
    assert "data.verify=sampled needs block checksums" in capsys.readouterr().err


def fake_batch(ids):
    return SimpleNamespace(input_nodes=ids)


def test_sampled_names_the_damaged_block_of_a_multi_block_file(tmp_path):
    """Only the block the offered node lies in is read: damage elsewhere is not reported, damage there is, with
    its byte offsets."""
    ds = generate_synthetic(tmp_path / "g", num_nodes=3000, avg_degree=4, feature_dim=64, seed=2, progress=False)
    stride = ds.features.row_stride
    node = 2500
    block = node * stride // BLOCK_BYTES
    flip_byte(ds.feature_path, 10)  # block 0, which no offered node lies in
    verify = SampledVerify(ds, nodes_per_batch=4)
    verify.offer(fake_batch(torch.tensor([node])))
    verify.finish()
    assert verify.blocks_checked >= 1 and verify.bytes_read < 4 * BLOCK_BYTES + sum(
        os.path.getsize(ds.file_path(n)) for n, _ in verify._whole)
    flip_byte(ds.feature_path, node * stride)
    verify = SampledVerify(ds, nodes_per_batch=4)
    verify.offer(fake_batch(torch.tensor([node])))
    with pytest.raises(DatasetError, match=f"features.bin: bytes {block * BLOCK_BYTES}..{(block + 1) * BLOCK_BYTES} "
                                           f"\\(block {block} of"):
        verify.finish()


def test_sampled_checks_each_node_types_features_and_relations(tmp_path):
    ds = generate_hetero_synthetic(tmp_path / "h", num_papers=400, feature_dim=8, progress=False)
    verify = SampledVerify(ds)
    verify.offer(fake_batch({t: torch.arange(3) for t in ds.node_types}))
    verify.finish()
    assert verify.blocks_checked >= len(ds.feature_types)
    author = ds.node_type("author")
    flip_byte(author.feature_path, 0)
    verify = SampledVerify(ds)
    verify.offer(fake_batch({"paper": torch.arange(3)}))  # reads no author row
    verify.finish()
    verify = SampledVerify(ds)
    verify.offer(fake_batch({"author": torch.arange(3)}))
    with pytest.raises(DatasetError, match="nodes/author/features.bin: bytes 0.."):
        verify.finish()


def test_a_damaged_block_sum_file_is_found_before_any_block(graph, tmp_path):
    copy = copy_of(graph, tmp_path)
    flip_byte(copy / BLOCK_SUMS_FILE, 0)
    verify = SampledVerify(open_dataset(copy))
    verify.offer(fake_batch(torch.arange(5)))
    with pytest.raises(DatasetError, match=f"{BLOCK_SUMS_FILE}: checksum .* does not match"):
        verify.finish()


def test_a_file_changed_on_purpose_is_recorded_again_by_the_test_helper(graph, tmp_path):
    from lsm_gnn.testing import rewrite_checksums

    copy = copy_of(graph, tmp_path)
    np.save(copy / "labels.npy", np.zeros(600, dtype=np.int64))
    np.save(copy / "train_idx.npy", np.arange(600).repeat(20))  # another size: 2 blocks where there was 1
    rewrite_checksums(copy, "labels.npy", "train_idx.npy")
    ds = open_dataset(copy)
    ds.verify_checksums()
    for name in ("labels.npy", "train_idx.npy"):
        assert recorded_sums(copy, name) == block_sums(copy, name)


def test_sampled_reads_buffered_where_o_direct_is_refused(graph, tmp_path, monkeypatch):
    """Some file systems refuse O_DIRECT (EINVAL): the blocks are read buffered instead, and damage is still
    found."""
    import errno

    copy = copy_of(graph, tmp_path)
    flip_byte(copy / "features.bin", 5)
    real_open = os.open

    def refusing_open(path, flags, *rest):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "O_DIRECT refused")
        return real_open(path, flags, *rest)

    monkeypatch.setattr(os, "open", refusing_open)
    verify = SampledVerify(open_dataset(copy))
    verify.offer(fake_batch(torch.arange(3)))
    with pytest.raises(DatasetError, match="features.bin: bytes 0.."):
        verify.finish()
    assert not verify._direct


def test_auto_leaves_a_dataset_over_the_size_limit_unchecked(graph, monkeypatch):
    from lsm_gnn.data import verify as verify_module

    ds = open_dataset(graph)
    assert resolve_mode(ds, "auto") == "sampled"
    monkeypatch.setattr(verify_module, "AUTO_SAMPLED_LIMIT", verify_module.dataset_bytes(ds) - 1)
    assert resolve_mode(ds, "auto") == "off"
    assert resolve_mode(ds, "sampled") == "sampled"  # asked for, it still checks


def test_an_intended_edit_is_recorded_by_prepare_checksums_which_the_refusal_names(graph, tmp_path, capsys):
    """labels.npy changed on purpose: opening with checksums refuses it and names the command; after the command
    the dataset opens, verifies whole and by block, and its block sums are the file's own."""
    copy = copy_of(graph, tmp_path)
    labels = np.load(copy / "labels.npy")
    np.save(copy / "labels.npy", (labels + 1) % 3)
    with pytest.raises(DatasetError, match=f"lsm-gnn prepare checksums {copy}"):
        open_dataset(copy).verify_checksums()
    assert main(["prepare", "checksums", str(copy)]) == 0
    assert "changed: labels.npy" in capsys.readouterr().out
    ds = open_dataset(copy)
    ds.verify_checksums()
    names = os.listdir(copy)
    assert BLOCK_SUMS_FILE not in names and len([n for n in names if n.startswith(BLOCK_SUMS_FILE)]) == 1
    for name in ds.meta["block_checksums"]["files"]:
        assert recorded_sums(copy, name) == block_sums(copy, name), name
