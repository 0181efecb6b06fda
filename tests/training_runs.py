"""What the launcher tests share: a small training run (the graph and the overrides), the environment its ranks
run in, and the losses it logs."""
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The graph fixture (conftest.py) generates GRAPH once per module that imports it.
GRAPH = dict(num_nodes=2000, avg_degree=6, feature_dim=8, num_classes=4, seed=0)
TRAIN = ["model.kind=sage", "model.hidden=16", "sampler.fanouts=[5,5]", "sampler.batch_size=64",
         "cache.capacity=40%", "cache.window=4", "train.epochs=1", "log.progress=false"]


def rank_env(**extra) -> dict:
    """This environment with one OpenMP thread a rank and this checkout first on PYTHONPATH, plus ``extra``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def losses(log_dir) -> list[float]:
    """The loss of every iteration in a run's metrics.jsonl."""
    with open(os.path.join(log_dir, "metrics.jsonl")) as fh:
        return [json.loads(line)["loss"] for line in fh if '"iteration"' in line]
