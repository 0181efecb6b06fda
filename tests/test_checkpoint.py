"""Checkpoints run no code from the file and refuse any damaged byte."""
import hashlib
import io
import os
import random

import pytest
import torch

from lsm_gnn.cli import main as cli
from lsm_gnn.training.checkpoint_files import (CHECKPOINT_FORMAT, CheckpointError, atomic_torch_save, load_checkpoint)

MARKER_ENV = "LSM_GNN_TEST_MARKER"


class RunsCode:
    """Unpickling this creates a file: proof that code from the checkpoint ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def state():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    return {"config": {"dataset": "d", "model": {"kind": "sage", "hidden": 4}, "sampler": {"fanouts": [2],
                       "batch_size": 8}, "train": {"task": "node"}},
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "loader": {"epoch": 1, "position": 0, "iteration": 3}, "iterations_done": 3,
            "history": [{"epoch": 0, "loss": 1.25, "complete": True, "val": {"accuracy": 0.5}}],
            "epoch_state": None, "rng": {"torch": torch.get_rng_state()}, "world_size": 1}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_round_trip(tmp_path):
    path = str(tmp_path / "last.pt")
    atomic_torch_save(state(), path)
    assert same(load_checkpoint(path), state())


def envelope(payload: bytes, **fields) -> dict:
    return {"format": CHECKPOINT_FORMAT, "version": 2, "sha256": hashlib.sha256(payload).hexdigest(),
            "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8), **fields}


@pytest.mark.parametrize("where", ["top level", "inside a valid envelope", "old version-1 file"])
def test_a_crafted_checkpoint_runs_no_code(tmp_path, where):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    evil = {"format": CHECKPOINT_FORMAT, "version": 1, "config": RunsCode(str(marker))}
    if where == "top level":
        torch.save({**evil, "version": 2}, path)
    elif where == "inside a valid envelope":  # the digest matches: only weights_only stops it
        buffer = io.BytesIO()
        torch.save({"config": RunsCode(str(marker))}, buffer)
        torch.save(envelope(buffer.getvalue()), path)
    else:
        torch.save(evil, path)
    with pytest.raises(CheckpointError, match="not a readable lsm-gnn checkpoint"):
        load_checkpoint(str(path))
    assert cli(["inspect", str(path)]) == 1
    assert not marker.exists()


def test_every_flipped_byte_is_refused_or_harmless(tmp_path):
    """A flipped byte either makes the load fail with CheckpointError or changes nothing loaded (zip padding,
    unused header fields); it never changes a weight silently."""
    path = tmp_path / "last.pt"
    atomic_torch_save(state(), str(path))
    original = path.read_bytes()
    expected = state()
    rng = random.Random(0)
    positions = sorted(set(range(0, 200)) | set(range(len(original) - 200, len(original)))
                       | set(rng.sample(range(len(original)), 300)))
    refused = 0
    for position in positions:
        damaged = bytearray(original)
        damaged[position] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        try:
            loaded = load_checkpoint(str(path))
        except CheckpointError:
            refused += 1
            continue
        assert same(loaded, expected), f"a flip at byte {position} changed the loaded state silently"
    assert refused > len(positions) // 2


def test_payload_flips_are_caught_by_the_checksum(tmp_path):
    payload = io.BytesIO()
    torch.save(state(), payload)
    data = bytearray(payload.getvalue())
    good = envelope(bytes(data))
    weights = bytes(data).find(state()["model"]["weight"].numpy().tobytes()[:16])
    assert weights > 0
    data[weights] ^= 0x40  # a weight changes, the payload still unpickles
    torch.save({**good, "payload": torch.frombuffer(data, dtype=torch.uint8)}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="SHA-256 does not match"):
        load_checkpoint(str(tmp_path / "c.pt"))


@pytest.mark.parametrize("cut", [0, 1, 100, -1, -22, -200])
def test_a_truncated_checkpoint_is_refused(tmp_path, cut):
    path = tmp_path / "last.pt"
    atomic_torch_save(state(), str(path))
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut > 0 else data[:len(data) + cut] if cut else b"")
    with pytest.raises(CheckpointError):
        load_checkpoint(str(path))


def test_a_version_1_checkpoint_still_loads_safely_with_a_warning(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, **state()}, path)
    with pytest.warns(UserWarning, match="without a checksum"):
        assert load_checkpoint(str(path))["iterations_done"] == 3


@pytest.mark.parametrize("bad", [
    {"format": CHECKPOINT_FORMAT, "version": 3},
    {"format": CHECKPOINT_FORMAT, "version": 2, "sha256": "0" * 64},
    {"format": CHECKPOINT_FORMAT, "version": 2, "payload": torch.zeros(3, dtype=torch.uint8)},
    {"format": "other"},
    [1, 2, 3],
])
def test_malformed_envelopes_get_one_clear_error(tmp_path, bad, capsys):
    path = tmp_path / "x.pt"
    torch.save(bad, path)
    with pytest.raises(CheckpointError):
        load_checkpoint(str(path))
    assert cli(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lsm-gnn: error:") and err.count("\n") == 1


def test_a_verified_checkpoint_without_trainer_state_gets_one_line_from_inspect(tmp_path, capsys):
    path = tmp_path / "x.pt"
    atomic_torch_save({"something": 1}, str(path))
    assert cli(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert "without a trainer state" in err and err.count("\n") == 1


def test_a_full_disk_names_the_checkpoint_and_keeps_the_old_one(tmp_path, monkeypatch):
    import errno

    from lsm_gnn.utils import fileio

    path = str(tmp_path / "last.pt")
    atomic_torch_save(state(), path)

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "write", full)
    with pytest.raises(OSError, match=r"last.pt: the disk is full: it needs"):
        atomic_torch_save({"other": 1}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["last.pt"] and same(load_checkpoint(path), state())


def test_a_real_full_disk_names_the_checkpoint(tmpfs):
    disk = tmpfs("small", "size=64k")
    big = {"weights": torch.zeros(64 * 1024)}  # 256 KiB of payload
    with pytest.raises(OSError, match=r"small/last\.pt: the disk is full") as info:
        atomic_torch_save(big, str(disk / "last.pt"))
    assert info.value.errno == 28 and os.listdir(disk) == []
