"""One rank of a training run with node embeddings that records what its embedding step is given
(run by tests/test_node_embedding.py under torchrun).

    torchrun --nproc_per_node 2 tests/embedding_worker.py OUT_DIR key=value ...
"""
import os
import sys

import numpy as np
import torch

from lsm_gnn.config import load_config
from lsm_gnn.embedding import NodeEmbedding
from lsm_gnn.training.trainer import Trainer


def main():
    out, overrides = sys.argv[1], sys.argv[2:]
    steps = []
    original = NodeEmbedding.step

    def record(self, nodes, grad):
        steps.append((nodes.numpy().copy(), grad.detach().numpy().copy()))
        return original(self, nodes, grad)

    NodeEmbedding.step = record
    torch.set_num_threads(1)
    Trainer(load_config(None, overrides)).fit()
    rank = int(os.environ["RANK"])
    np.savez(os.path.join(out, f"steps{rank}.npz"), **{f"nodes{t}": n for t, (n, _) in enumerate(steps)},
             **{f"grad{t}": g for t, (_, g) in enumerate(steps)}, count=len(steps))


if __name__ == "__main__":
    main()
