"""On a GPU the sampler (its Triton kernel) returns exactly the CPU sampler's hops.

Needs a CUDA GPU and triton; skipped otherwise. The same kernel runs on CPU tensors under Triton's
interpreter in tests/test_kernels_sampler.py, so its logic is checked everywhere; only the refusal of a
CUDA request by a CPU-only setup runs here without a GPU.
"""
import numpy as np
import pytest
import torch

from lsm_gnn.sampling import CSRGraph, NeighborSampler, OneTypeSampler

try:
    import triton  # noqa: F401

    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    HAVE_CUDA = False
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU and triton")


def random_graph(rng, num_nodes, index_dtype, max_degree=60):
    degree = rng.integers(0, max_degree, num_nodes)
    degree[rng.random(num_nodes) < 0.2] = 0                  # isolated nodes
    degree[rng.choice(num_nodes, 3, replace=False)] = 300    # hubs: more neighbors than a warp has lanes
    indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    indices = rng.integers(0, num_nodes, int(indptr[-1])).astype(index_dtype)
    return CSRGraph(indptr, indices)


def assert_same_hops(cpu, gpu):
    assert len(cpu) == len(gpu)
    for h, (c, g) in enumerate(zip(cpu, gpu)):
        assert g.nodes.is_cuda and g.edge_index.is_cuda
        assert c.num_dst == g.num_dst, f"hop {h}"
        assert torch.equal(c.nodes, g.nodes.cpu()), f"hop {h}: nodes differ"
        assert torch.equal(c.edge_index, g.edge_index.cpu()), f"hop {h}: edges differ"


@needs_cuda
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("fanouts", [[5, 2, 2], [-1, 3], [0, 4], [40, -1], [3, 0, -1], [1]])
def test_cuda_matches_cpu(index_dtype, fanouts):
    rng = np.random.default_rng(len(fanouts) * 10 + fanouts[0] + 2)
    for trial in range(3):
        graph = random_graph(rng, int(rng.integers(200, 4000)), index_dtype)
        isolated = np.flatnonzero(np.diff(graph.indptr) == 0)[:4]  # isolated seeds too
        others = np.setdiff1d(np.arange(graph.indptr.size - 1), isolated)
        seeds = np.concatenate([isolated, rng.permutation(others)[:124]])
        cpu = OneTypeSampler(graph, fanouts, seed=trial + 11)
        gpu = OneTypeSampler(graph, fanouts, seed=trial + 11, device="cuda")
        for iteration in (0, 1, 977):
            assert_same_hops(cpu.sample(seeds, iteration), gpu.sample(seeds, iteration))


@needs_cuda
def test_cuda_seeds_select_the_gpu():
    rng = np.random.default_rng(5)
    graph = random_graph(rng, 1000, np.int64)
    seeds = torch.from_numpy(rng.choice(1000, 64, replace=False))
    cpu = OneTypeSampler(graph, [4, 3], seed=2).sample(seeds, 8)
    auto = OneTypeSampler(graph, [4, 3], seed=2).sample(seeds.cuda(), 8)  # device=None follows the seeds
    assert_same_hops(cpu, auto)


@needs_cuda
def test_cuda_empty_batch_matches_cpu():
    graph = random_graph(np.random.default_rng(1), 100, np.int32)
    empty = torch.empty(0, dtype=torch.int64)
    cpu = OneTypeSampler(graph, [3, 2]).sample(empty)
    assert_same_hops(cpu, OneTypeSampler(graph, [3, 2], device="cuda").sample(empty))


@needs_cuda
def test_cuda_bad_input_is_refused():
    graph = random_graph(np.random.default_rng(2), 100, np.int64)
    sampler = OneTypeSampler(graph, [2], device="cuda")
    with pytest.raises(IndexError, match="outside"):
        sampler.sample([100])
    with pytest.raises(IndexError, match="outside"):
        sampler.sample([4, -1])
    with pytest.raises(ValueError, match="twice"):
        sampler.sample([3, 7, 3])


@pytest.mark.skipif(HAVE_CUDA, reason="checks the refusal on a setup without CUDA")
def test_cuda_request_without_cuda_is_refused():
    graph = random_graph(np.random.default_rng(3), 50, np.int64)
    with pytest.raises(RuntimeError, match="CUDA"):
        NeighborSampler(graph, [2], device="cuda")
    with pytest.raises(ValueError, match="device"):
        NeighborSampler(graph, [2], device="meta")
    hops = OneTypeSampler(graph, [2], device="cpu").sample([1, 2])  # the CPU path is unaffected
    assert hops[0].nodes[:2].tolist() == [1, 2]
