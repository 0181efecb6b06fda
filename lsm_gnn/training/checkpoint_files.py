"""Checkpoint files: written atomically, loaded without running code, checked by SHA-256.

A checkpoint is a ``torch.save`` file holding a small envelope::

    {"format": "lsm-gnn-checkpoint", "version": 2, "sha256": <hex>, "payload": <uint8 tensor>}

where ``payload`` is the ``torch.save`` bytes of the trainer's state and
``sha256`` their digest. Both levels are read with ``weights_only=True``, so
a crafted file cannot run code (the state holds only tensors, numbers,
strings, lists and dicts), and a flipped byte anywhere is refused: in the
payload the digest no longer matches, in the envelope the zip or pickle no
longer parses or a field no longer reads as written.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import os
import time
import warnings

import torch

from lsm_gnn.utils.fileio import atomic_write_bytes, remove_stale_temporaries

CHECKPOINT_FORMAT = "lsm-gnn-checkpoint"
CHECKPOINT_VERSION = 2


class CheckpointError(ValueError):
    """A checkpoint file is missing, damaged, crafted or from an incompatible version."""


def _serialize(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def atomic_torch_save(state: dict, path: str) -> None:
    """Saves ``state`` as a checksummed checkpoint, atomically (see the module docstring)."""
    payload = _serialize(state)
    envelope = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                "sha256": hashlib.sha256(payload).hexdigest(),
                "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8)}
    atomic_write_bytes(_serialize(envelope), path)


def _safe_load(source, what: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about untyped storages of old files
            return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # torch's own line would advise loading with weights_only=False, which runs whatever the file holds
        detail = "" if "weights_only" in first_line else f" ({first_line})"
        raise CheckpointError(f"{what} is not a readable lsm-gnn checkpoint{detail}; it is damaged, "
                              "was not written by lsm-gnn, or holds objects other than tensors and plain "
                              "values - use another checkpoint or start fresh with checkpoint.resume=false") from None


def load_checkpoint(path: str) -> dict:
    """The trainer state saved in ``path``, verified; raises :class:`CheckpointError` on any problem."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    envelope = _safe_load(path, path)
    if not isinstance(envelope, dict) or envelope.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not an lsm-gnn checkpoint (no '{CHECKPOINT_FORMAT}' format field)")
    version = envelope.get("version")
    if version == 1:  # written before checksums: readable, but nothing guards its bytes
        warnings.warn(f"{path} is a version-1 checkpoint without a checksum; a damaged byte would go unnoticed. "
                      "The next checkpoint is written as version 2", stacklevel=2)
        return envelope
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path} has checkpoint version {version!r}; this lsm-gnn reads versions 1 and "
                              f"{CHECKPOINT_VERSION}")
    payload, digest = envelope.get("payload"), envelope.get("sha256")
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or not isinstance(digest, str):
        raise CheckpointError(f"{path} is damaged: its payload or checksum field is missing")
    data = payload.numpy().tobytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(f"{path} is damaged: its SHA-256 does not match the one recorded when it was "
                              "written (a flipped or truncated byte); use an earlier checkpoint or start fresh "
                              "with checkpoint.resume=false")
    state = _safe_load(io.BytesIO(data), path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is damaged: its payload is not a trainer state")
    return state


def check_replaceable(path: str, key: str = "checkpoint.dir") -> None:
    """Raises :class:`CheckpointError` when ``path`` exists and is not an lsm-gnn checkpoint: a run would
    write over a file it did not create (someone's own ``last.pt``). Its own checkpoints, even damaged past
    their envelope, it may replace."""
    if not os.path.lexists(path):
        return
    try:
        envelope = _safe_load(path, path) if os.path.isfile(path) else None
    except CheckpointError:
        envelope = None
    if not isinstance(envelope, dict) or envelope.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not an lsm-gnn checkpoint, and this run would write over it: move it out "
                              f"of {key}, or give the run another {key}")


def remove_stale_checkpoint_temporaries(path: str) -> list[str]:
    """Deletes temporaries of checkpoint ``path`` left by writers that are gone (see
    :func:`~lsm_gnn.utils.fileio.remove_stale_temporaries`), and those of lsm-gnn before 0.2 (``.tmp-*.pt``,
    which name no writer) once they are an hour old. Returns the removed paths."""
    removed = remove_stale_temporaries(path, kind="file")
    for old in glob.glob(os.path.join(glob.escape(os.path.dirname(os.path.abspath(path))), ".tmp-*.pt")):
        if time.time() - os.path.getmtime(old) > 3600:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(old)
                removed.append(old)
    return removed
