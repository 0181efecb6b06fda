"""Training tasks: what a batch's loss is and how a split is evaluated (``train.task``).

- :mod:`.node_classification`: the :class:`Task` interface the trainer calls, :func:`make_task` (the task a
  config names) and node classification;
- :mod:`.link_prediction`: user-item edge batches, BPR loss, recall@k (``train.task=link``);
- :mod:`.options`: what every task takes from the config (its loader's keywords, the evaluation batch size);
- :mod:`.inference`: full-neighbourhood (layer-wise) inference, for evaluations that see every neighbour.
"""
from lsm_gnn.tasks.link_prediction import LinkPrediction
from lsm_gnn.tasks.node_classification import NodeClassification, Task, make_task
from lsm_gnn.tasks.options import relation_fanouts

__all__ = ["LinkPrediction", "NodeClassification", "Task", "make_task", "relation_fanouts"]
