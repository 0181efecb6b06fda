"""Neighbor sampling: real edges, fanouts respected, no repeats, deterministic."""
import numpy as np
import pytest
import torch

from lsm_gnn.data.dataset import ONE_RELATION
from lsm_gnn.sampling import NeighborSampler, OneTypeSampler
from lsm_gnn.testing import write_tiny_dataset


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    dataset, _ = write_tiny_dataset(tmp_path_factory.mktemp("g") / "ds", num_nodes=3000, dim=2, avg_degree=6)
    return dataset


def neighbors(dataset, v):
    return dataset.indices[dataset.indptr[v]:dataset.indptr[v + 1]]


@pytest.mark.parametrize("fanouts", [[5, 2, 2, 2], [3], [-1, 2], [0, 4]])
def test_every_edge_exists_and_fanouts_hold(graph, fanouts):
    sampler = OneTypeSampler(graph, fanouts, seed=7)
    seeds = np.random.default_rng(0).choice(graph.num_nodes, 64, replace=False)
    hops = sampler.sample(seeds, iteration=3)
    assert len(hops) == len(fanouts)
    previous = torch.from_numpy(seeds)
    for hop, k in zip(hops, fanouts):
        assert torch.equal(hop.nodes[:hop.num_dst], previous)  # dst nodes are the previous hop's nodes
        assert hop.nodes.unique().numel() == hop.num_src       # every node once
        src, dst = hop.edge_index
        assert dst.numel() == 0 or int(dst.max()) < hop.num_dst
        per_dst = torch.bincount(dst, minlength=hop.num_dst)
        for i in range(hop.num_dst):
            v = int(hop.nodes[i])
            chosen = hop.nodes[src[dst == i]].numpy()
            expected = len(neighbors(graph, v)) if k < 0 else min(k, len(neighbors(graph, v)))
            assert per_dst[i] == expected
            assert len(set(chosen.tolist())) == len(chosen)            # no duplicate neighbors
            assert set(chosen.tolist()) <= set(neighbors(graph, v).tolist())  # every edge exists
        previous = hop.nodes


def test_one_type_graph_samples_the_same_hops_plain_or_typed(graph):
    """The keyed sampler takes seeds per type ({"node": ids} or the pair); OneTypeSampler, made once around it,
    takes plain ids and gives the very same hops plain. Counts and fanouts are keyed inside either way."""
    keyed, one_type = NeighborSampler(graph, [4, 3], seed=5), OneTypeSampler(graph, [4, 3], seed=5)
    assert keyed.num_nodes == one_type.sampler.num_nodes == {"node": graph.num_nodes}
    assert keyed.fanouts == {ONE_RELATION: [4, 3]} and one_type.num_nodes == graph.num_nodes
    seeds = np.random.default_rng(2).choice(graph.num_nodes, 50, replace=False)
    plain, typed = one_type.sample(seeds, 1), keyed.sample({"node": seeds}, 1)
    assert len(plain) == len(typed) == keyed.num_hops == 2
    for p, t in zip(plain, typed):
        assert list(t.nodes) == list(t.num_dst) == ["node"] and list(t.edge_index) == [ONE_RELATION]
        assert torch.equal(p.nodes, t.nodes["node"]) and torch.equal(p.edge_index, t.edge_index[ONE_RELATION])
        assert p.num_dst == t.num_dst["node"] and torch.equal(p.dst_nodes, t.dst_nodes["node"])
        assert p.num_src == t.num_src["node"] == p.nodes.numel()
        assert p.num_edges == t.num_edges[ONE_RELATION] == p.edge_index.shape[1] > 0
    assert torch.equal(plain[0].dst_nodes, torch.from_numpy(seeds))
    assert torch.equal(keyed.input_nodes(("node", seeds), 1)["node"], plain[-1].nodes)
    assert torch.equal(one_type.input_nodes(seeds, 1), plain[-1].nodes)
    hops = one_type.sample_many([(seeds, 1), (seeds[:10], 2)])
    assert torch.equal(hops[0][-1].nodes, plain[-1].nodes)
    assert torch.equal(hops[1][0].nodes, one_type.sample(seeds[:10], 2)[0].nodes)
    with pytest.raises(TypeError, match="OneTypeSampler"):  # the keyed sampler never guesses a form
        keyed.sample(seeds, 1)


def test_deterministic_in_seed_and_iteration(graph):
    seeds = np.arange(100)
    a = OneTypeSampler(graph, [5, 2], seed=1).sample(seeds, 4)
    b = OneTypeSampler(graph, [5, 2], seed=1, num_threads=1).sample(seeds, 4)
    c = OneTypeSampler(graph, [5, 2], seed=1).sample(seeds, 5)
    d = OneTypeSampler(graph, [5, 2], seed=2).sample(seeds, 4)
    same = lambda x, y: all(torch.equal(p.nodes, q.nodes) and torch.equal(p.edge_index, q.edge_index)
                            for p, q in zip(x, y))
    assert same(a, b)
    assert not same(a, c) and not same(a, d)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_many_batches_side_by_side_equal_each_sampled_alone(graph, threads, monkeypatch):
    """sample_many over several workers, one thread each: every batch's hops are those of sample(), in order;
    the work was spread over the workers (threads > 1)."""
    import threading
    import time

    rng = np.random.default_rng(5)
    batches = [(np.sort(rng.choice(graph.num_nodes, 50, replace=False)), 10 + k) for k in range(9)]
    alone = [OneTypeSampler(graph, [5, 2], seed=3).sample(seeds, it) for seeds, it in batches]
    sampler = OneTypeSampler(graph, [5, 2], seed=3, num_threads=threads)
    workers, inner = set(), sampler.sampler._sample

    def recording(*args):
        workers.add(threading.current_thread().name)
        time.sleep(0.005)  # so that no worker drains the queue before the others start
        return inner(*args)

    monkeypatch.setattr(sampler.sampler, "_sample", recording)
    together = sampler.sample_many(batches)
    same = lambda x, y: all(torch.equal(p.nodes, q.nodes) and torch.equal(p.edge_index, q.edge_index)
                            for p, q in zip(x, y))
    assert len(together) == len(batches) and all(same(a, b) for a, b in zip(alone, together))
    assert (len(workers) > 1) == (threads > 1)  # (9 batches: every worker of 2 or 3 gets some)
    assert sampler.sample_many([]) == []


def test_many_batches_stay_on_the_callers_thread_with_the_triton_kernels(graph, monkeypatch):
    """The Triton interpreter is not safe on several threads: kernels=triton samples the batches one by one."""
    import threading

    from lsm_gnn.kernels import using

    sampler = OneTypeSampler(graph, [2], seed=0, num_threads=2)
    names = []
    monkeypatch.setattr(sampler.sampler, "_sample", lambda seeds, it, threads: names.append(threading.current_thread().name)
                        or [])
    with using("triton"):
        sampler.sample_many([(np.arange(5), 0), (np.arange(5), 1), (np.arange(5), 2)])
    assert names == [threading.current_thread().name] * 3


@pytest.mark.parametrize("shape", ["random", "hubs"])
def test_numbering_on_several_threads_equals_one_thread(tmp_path, shape):
    """A hop of 16,384 edges or more has its new nodes numbered by several threads (claims on a shared table,
    the first position of each id, prefix sums per chunk); the local ids must be the serial numbering's, new
    ids in order of their first edge. "hubs": nearly every edge reaches one of 5 nodes, some of them seeds, so
    threads race to claim the same slots and most edges find an id numbered before."""
    from lsm_gnn.data.writer import DatasetWriter

    rng = np.random.default_rng(3)
    n = 20_000
    if shape == "random":
        dataset, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=n, dim=2, avg_degree=12)
    else:
        src = np.repeat(np.arange(n), 12)
        dst = np.where(rng.random(src.size) < 0.95, rng.integers(0, 5, src.size), rng.integers(0, n, src.size))
        with DatasetWriter(tmp_path / "ds", num_nodes=n, feature_dim=2, scores=()) as writer:
            writer.write_features(np.zeros((n, 2), dtype=np.float32))
            writer.write_edges([(dst, src)])  # each node's row (its in-neighbours) mostly hubs
            dataset = writer.commit()
    seeds = np.concatenate([[0, 1, 2], rng.choice(np.arange(3, n), 4500, replace=False)])
    runs = [OneTypeSampler(dataset, [10, 5], seed=5, num_threads=t).sample(seeds, 2) for t in (1, 2, 3)]
    assert runs[0][0].edge_index.shape[1] >= 16_384, "the first hop must be large enough to number in parallel"
    for threads, hops in zip((2, 3), runs[1:]):
        for h, (one, several) in enumerate(zip(runs[0], hops)):
            assert torch.equal(one.nodes, several.nodes), f"hop {h}, {threads} threads: other nodes or order"
            assert torch.equal(one.edge_index, several.edge_index), f"hop {h}, {threads} threads: other local ids"


def test_samples_are_uniform(graph):
    v = int(np.argmax(np.diff(np.asarray(graph.indptr))))
    nbrs = neighbors(graph, v)
    counts = {int(u): 0 for u in nbrs}
    sampler = OneTypeSampler(graph, [2], seed=3)
    trials = 3000
    for it in range(trials):
        hop = sampler.sample([v], it)[0]
        for u in hop.nodes[hop.edge_index[0]].tolist():
            counts[u] += 1
    expected = trials * 2 / len(nbrs)
    assert all(abs(c - expected) < 6 * np.sqrt(expected) for c in counts.values())


def test_bad_input_is_refused(graph):
    sampler = OneTypeSampler(graph, [2])
    with pytest.raises(IndexError, match="outside"):
        sampler.sample([graph.num_nodes])
    with pytest.raises(ValueError, match="twice"):
        sampler.sample([3, 3])
    with pytest.raises(ValueError, match="fanouts"):
        OneTypeSampler(graph, [])
    with pytest.raises(ValueError, match="fanouts"):
        OneTypeSampler(graph, [2, -3])
