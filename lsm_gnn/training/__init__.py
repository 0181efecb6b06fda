"""Training: :class:`Trainer` (:mod:`.trainer`) runs the loop and composes the parts, each with one job.

- :mod:`.metrics`: per-stage times, the JSON-lines/TensorBoard log, the epoch's summary and its printed line;
- :mod:`.checkpointing`: ``last.pt`` (and the node-embedding table's commit with it), exact resume;
- :mod:`.checkpoint_files`: the checkpoint file itself: written atomically, loaded without running code, checked
  by SHA-256;
- :mod:`.selection`: when an evaluation is due, the best one by the watched metric, ``best.pt``, early stopping;
- :mod:`.ranks`: the collectives between ranks, with a message naming the one that is missing;
- :mod:`.startup`: the device, the model, and the checks a run passes before any work;
- :mod:`.resources`: what a run holds for its life (the ``kernels=`` scope, rank 0's output locks, the data check
  beside training) and gives back at its end;
- :mod:`.run_log`: a run's metrics log read back and checked, for ``lsm-gnn plot`` and ``lsm-gnn report``.
"""


def __getattr__(name: str):
    # Trainer on first use: `lsm-gnn plot` and `report` read logs through .run_log without the trainer's imports.
    if name == "Trainer":
        from lsm_gnn.training.trainer import Trainer

        return Trainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Trainer"]
