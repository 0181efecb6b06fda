"""The trainer's parts, each with one job; :class:`lsm_gnn.trainer.Trainer` runs the loop and composes them.

- :mod:`.metrics`: per-stage times, the JSON-lines/TensorBoard log, the epoch's summary and its printed line;
- :mod:`.checkpointing`: ``last.pt`` (and the node-embedding table's commit with it), exact resume;
- :mod:`.selection`: when an evaluation is due, the best one by the watched metric, ``best.pt``, early stopping;
- :mod:`.ranks`: the collectives between ranks, with a message naming the one that is missing;
- :mod:`.startup`: the device, the model, and the checks a run passes before any work.
"""
