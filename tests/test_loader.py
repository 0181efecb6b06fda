"""The loader: every batch's features equal the file, deterministic, and no thread left behind."""
import threading

import numpy as np
import pytest
import torch

from lsm_gnn import open_storage
from lsm_gnn.cache import SoftwareCache
from lsm_gnn.loader import NodeLoader


@pytest.fixture(scope="module")
def data(loader_graph):
    return loader_graph


def loader_threads():
    return [t for t in threading.enumerate() if t.name == "lsm-gnn-loader"]


@pytest.mark.parametrize("policy", ["rr", "hybrid"])
def test_features_equal_the_file_for_every_batch(data, policy):
    dataset, features = data
    with open_storage(dataset, "io_uring") as storage:
        cache = SoftwareCache(storage, num_sets=8, ways=32, policy=policy, window=16, oversubscribe=True)
        loader = NodeLoader(dataset, cache, [4, 2], batch_size=64, window=16)
        seen = []
        for epoch in range(2):
            for batch in loader:
                assert torch.equal(batch.x, features[batch.input_nodes])
                assert torch.equal(batch.hops[0].nodes[:batch.seeds.numel()], batch.seeds)
                if epoch == 0:  # sampled per type, unwrapped: the very hops a one-type sampler gives plain ids
                    plain = [h.unkeyed() for h in loader.sampler.sample({"node": batch.seeds}, batch.iteration)]
                    assert len(plain) == len(batch.hops) == 2
                    for p, h in zip(plain, batch.hops):
                        assert p.num_dst == h.num_dst and torch.equal(p.nodes, h.nodes)
                        assert torch.equal(p.edge_index, h.edge_index)
                assert torch.equal(batch.y, torch.from_numpy(np.asarray(dataset.labels()))[batch.seeds])
                seen.append(batch.iteration)
        assert seen == list(range(2 * len(loader)))
        assert cache.stats.hits > 0
    assert loader_threads() == []


def test_an_epoch_covers_every_seed_once(data):
    dataset, _ = data
    loader = NodeLoader(dataset, open_storage(dataset, "memory"), [2], batch_size=50, window=4)
    seeds = torch.cat([b.seeds for b in loader])
    assert sorted(seeds.tolist()) == sorted(np.asarray(dataset.split("train")).tolist())
    dropped = NodeLoader(dataset, open_storage(dataset, "memory"), [2], batch_size=50, drop_last=True)
    assert len(dropped) == len(np.asarray(dataset.split("train"))) // 50
    assert all(b.seeds.numel() == 50 for b in dropped)


def test_same_seed_same_batches(data):
    dataset, _ = data
    a = [b.input_nodes for b in NodeLoader(dataset, open_storage(dataset, "memory"), [3, 2], 100, seed=4)]
    b = [b.input_nodes for b in NodeLoader(dataset, open_storage(dataset, "memory"), [3, 2], 100, seed=4)]
    c = [b.input_nodes for b in NodeLoader(dataset, open_storage(dataset, "memory"), [3, 2], 100, seed=5)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("stop", ["mid-epoch", "after the last batch", "between epochs"])
def test_a_loader_restored_at_any_point_yields_the_same_batches(data, stop):
    """Restored from ``state_dict`` wherever it was taken, a loader continues with the very batches (and
    iteration numbers, which seed the sampler) of one that was never stopped."""
    dataset, _ = data

    def make():
        return NodeLoader(dataset, open_storage(dataset, "memory"), [3, 2], 150, seed=1, window=2)

    whole = make()
    expected = [(b.iteration, b.input_nodes) for _ in range(2) for b in whole]
    first = make()
    batches = iter(first)
    taken = [next(batches) for _ in range(2 if stop == "mid-epoch" else len(first))]
    if stop == "between epochs":
        assert next(batches, None) is None
    state = first.state_dict()
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [(b.iteration, b.input_nodes) for _ in range(2 - state["epoch"]) for b in resumed]
    got = [(b.iteration, b.input_nodes) for b in taken] + rest
    assert [i for i, _ in got] == [i for i, _ in expected]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, expected))


def test_no_thread_left_after_an_exception_or_break(data):
    dataset, _ = data
    loader = NodeLoader(dataset, open_storage(dataset, "memory"), [2], batch_size=10, prefetch=1)
    with pytest.raises(RuntimeError, match="boom"):
        for batch in loader:
            raise RuntimeError("boom")
    assert loader_threads() == []
    for batch in loader:
        break
    loader.close()
    assert loader_threads() == []


def test_errors_in_the_background_reach_the_caller(data):
    dataset, _ = data
    cache = SoftwareCache(open_storage(dataset, "memory"), num_sets=1, ways=4)  # smaller than a batch
    with pytest.raises(ValueError, match="distinct ids"):
        for _ in NodeLoader(dataset, cache, [2], batch_size=64):
            pass
    assert loader_threads() == []


def test_bad_arguments(data):
    dataset, _ = data
    storage = open_storage(dataset, "memory")
    with pytest.raises(ValueError, match="batch_size"):
        NodeLoader(dataset, storage, [2], batch_size=0)
    with pytest.raises(ValueError, match="distinct"):
        NodeLoader(dataset, storage, [2], 4, seeds=[1, 1])
    with pytest.raises(ValueError, match="no seed"):
        NodeLoader(dataset, storage, [2], 4, seeds=[])


@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_a_gnn_learns_through_the_cached_loader(tmp_path, kind):
    pytest.importorskip("torch_geometric")
    from lsm_gnn.data.synthetic import generate_synthetic
    from lsm_gnn.models import HopGNN

    torch.manual_seed(0)
    ds = generate_synthetic(tmp_path / "g", num_nodes=3000, avg_degree=8, feature_dim=16, num_classes=4, seed=1,
                            progress=False)
    cache = SoftwareCache(open_storage(ds, "io_uring"), capacity=1500 * 64, policy="hybrid", window=8,
                          static_scores=ds.score("reverse_pagerank"), oversubscribe=True)
    model = HopGNN(kind, 16, 32, 4, num_layers=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = NodeLoader(ds, cache, [10, 5], batch_size=128, window=8)
    for _ in range(4):
        for batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch), batch.y)
            loss.backward()
            optimizer.step()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in NodeLoader(ds, cache, [10, 5], batch_size=256, seeds=ds.split("test"), shuffle=False, window=8):
            correct += int((model(batch).argmax(1) == batch.y).sum())
            total += batch.y.numel()
    assert correct / total > 0.6  # chance is 0.25


@pytest.mark.parametrize("labels, narrow", [(np.array([0, 7, -1, 3, 5]), torch.int8),
                                            (np.array([0, 300, -1, 2, 9]), torch.int16),
                                            (np.array([2**40, -1, 0, 1, 2]), torch.int64)])
def test_labels_are_kept_narrow_and_handed_out_in_the_files_dtype(tmp_path, labels, narrow):
    from lsm_gnn.loader import compact_labels

    np.save(tmp_path / "labels.npy", labels)
    mapped = np.load(tmp_path / "labels.npy", mmap_mode="r")
    kept, dtype = compact_labels(mapped, block=2)  # odd blocks: the last one is short
    assert kept.dtype == narrow and dtype == torch.int64
    assert torch.equal(kept.to(dtype), torch.from_numpy(labels))


def test_labels_that_are_not_integer_node_labels_stay_as_they_are():
    from lsm_gnn.loader import compact_labels

    scores = np.random.default_rng(0).random((4, 2)).astype(np.float32)
    kept, dtype = compact_labels(scores)
    assert kept.dtype == dtype == torch.float32 and torch.equal(kept, torch.from_numpy(scores))


def test_repeated_or_negative_seeds_are_refused(data):
    from lsm_gnn.loader import all_distinct

    dataset, _ = data
    assert all_distinct(np.array([5, 0, 3])) and not all_distinct(np.array([5, 0, 5]))
    with pytest.raises(ValueError, match="distinct"):
        NodeLoader(dataset, open_storage(dataset, "memory"), [2], batch_size=4, seeds=[1, 2, 1])
    with pytest.raises(ValueError, match=">= 0"):
        NodeLoader(dataset, open_storage(dataset, "memory"), [2], batch_size=4, seeds=[1, -2])


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_epoch_order_is_the_permutation_of_the_seeds_held_as_int32_positions(data, world_size):
    # Plans are positions into the seeds (4 bytes a seed, not 8); the batches must be those of
    # permutation(seeds) with the (seed, epoch) stream, dealt out in turn across ranks.
    ds, _ = data
    for rank in range(world_size):
        loader = NodeLoader(ds, open_storage(ds, "memory"), [2], 32, seed=7, rank=rank, world_size=world_size,
                            window=0)
        plans = loader._epoch_plans(3)
        assert all(plan.dtype == np.int32 for plan in plans)
        order = np.random.default_rng([7, 3]).permutation(np.asarray(loader.seeds, dtype=np.int64))
        order = order[:loader.seeds_per_rank * world_size][rank::world_size]
        np.testing.assert_array_equal(np.concatenate([loader._plan_seeds(p) for p in plans]), order)
        assert loader._plan_seeds(plans[0]).dtype == np.int64
