"""Bounded memory at small scale: training with the cache on, over a feature file more than three times a
memory cap that counts the page cache, completes inside the cap with no OOM kill. Skipped, with the reason,
where no memory cgroup can be created (lsm_gnn.utils.memcap.MemoryCapError)."""
import json
import os
import sys

import pytest

import lsm_gnn
from lsm_gnn.storage.probe import evict_page_cache

pytestmark = pytest.mark.slow  # generating the 1.2 GB feature file takes most of its ~40 s

CAP = 400 << 20
NUM_NODES, FEATURE_DIM = 300_000, 1024  # 4 KiB float32 rows: a 1.23 GB feature file, 2.9x the cap
ITERATIONS = 40


@pytest.fixture
def cap(memory_cap):
    return memory_cap(CAP)


@pytest.fixture
def big_features(tmp_path):
    from lsm_gnn.data.synthetic import generate_synthetic

    ds = generate_synthetic(str(tmp_path / "big"), num_nodes=NUM_NODES, feature_dim=FEATURE_DIM, avg_degree=10,
                            scores=("degree",), progress=False)
    for root, _, files in os.walk(ds.path):  # the capped run pays for every page it touches, in its cgroup
        for name in files:
            evict_page_cache(os.path.join(root, name))
    return ds


def test_training_over_a_feature_file_three_times_the_cap_stays_under_it(cap, big_features, tmp_path):
    assert big_features.features.file_bytes > 2.8 * CAP
    result_file = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(lsm_gnn.__file__)))}
    run = cap.run([sys.executable, "-m", "lsm_gnn", "train", f"dataset={big_features.path}", "cache.features=cache",
                   "cache.capacity=32M", "cache.policy=hybrid", "cache.static_score=degree", "sampler.fanouts=[5,5]",
                   "sampler.batch_size=128", f"train.max_iterations={ITERATIONS}", "train.eval_splits=[]",
                   "model.hidden=32", "log.progress=false", "--json", str(result_file)], timeout=600, env=env)
    assert not run.timed_out and not run.oom_killed, f"killed (OOM: {run.oom_killed}): {run.stderr[-3000:]}"
    assert run.returncode == 0, run.stderr[-3000:]
    print(f"capped training: peak {run.peak_bytes / 2**20:.0f} MiB of {CAP >> 20} MiB")
    assert run.peak_bytes <= CAP, f"peak {run.peak_bytes / 2**20:.0f} MiB over the {CAP >> 20} MiB cap"
    result = json.loads(result_file.read_text())
    last = result["history"][-1]
    assert result["iterations"] == ITERATIONS
    assert last["bytes_read"] > 0 and 0 < last["hit_ratio"] < 1, "the cache served some rows and storage the rest"
    # The run happened inside the cgroup: Python, torch and the cache alone fill a good part of it.
    assert run.peak_bytes > CAP // 2
