"""LightGCN: its propagation over sampled hops equals LightGCN's full-graph formula, and it trains through the
trainer (node embeddings, BPR, the L2 on the batch's own rows)."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lsm_gnn.cli import main
from lsm_gnn.data.bipartite import generate_bipartite
from lsm_gnn.models import LightGCN, hop_sum
from lsm_gnn.sampling import OneTypeSampler


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return generate_bipartite(tmp_path_factory.mktemp("lgcn") / "g", num_users=120, num_items=80,
                              avg_interactions=6, feature_dim=4, seed=0, val_fraction=0.1, progress=False)


def full_graph_lightgcn(ds, e0: torch.Tensor, layers: int) -> torch.Tensor:
    """LightGCN as its paper writes it: E_k = D^-1/2 A D^-1/2 E_{k-1} over the whole graph, the mean of E_0..E_K."""
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    n = ds.num_nodes
    dst = np.repeat(np.arange(n), np.diff(indptr))
    degree = torch.as_tensor(np.diff(indptr), dtype=torch.float64).clamp(min=1)
    adjacency = torch.zeros(n, n, dtype=torch.float64)
    adjacency[torch.as_tensor(dst), torch.as_tensor(indices, dtype=torch.int64)] = 1.0
    norm = adjacency / degree.sqrt().unsqueeze(1) / degree.sqrt().unsqueeze(0)
    out, e = [e0], e0
    for _ in range(layers):
        e = norm @ e
        out.append(e)
    return torch.stack(out).mean(0)


@pytest.mark.parametrize("layers", [1, 3])
def test_every_neighbour_gives_the_full_graph_formula(ds, layers):
    torch.manual_seed(0)
    e0 = torch.randn(ds.num_nodes, 8, dtype=torch.float64)
    model = LightGCN(torch.as_tensor(np.diff(np.asarray(ds.indptr))), num_layers=layers).double()
    seeds = torch.tensor([0, 5, 17, 119, 120, 150, 199])  # users and items
    hops = OneTypeSampler(ds, [-1] * layers).sample(seeds, 0)
    e0.requires_grad_(True)
    batch = SimpleNamespace(hops=hops, x=e0[hops[-1].nodes], emb=None)
    expected = full_graph_lightgcn(ds, e0, layers)[seeds]
    out = model(batch)
    torch.testing.assert_close(out, expected.float(), rtol=1e-5, atol=1e-6)  # models read float32
    upstream = torch.randn(out.shape, dtype=torch.float64)
    # and so does the gradient that trains the embeddings
    torch.testing.assert_close(torch.autograd.grad(out, e0, upstream.float())[0],
                               torch.autograd.grad(expected, e0, upstream)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ["by destination", "shuffled", "no edges"])
def test_hop_sum_and_its_gradient_equal_adding_a_row_per_edge(order):
    """The sparse product (and its backward through the transpose) against index_add_, with repeated edges."""
    g = torch.Generator().manual_seed(0)
    num_src, num_dst, edges = 30, 12, 0 if order == "no edges" else 200
    dst = torch.sort(torch.randint(0, num_dst, (edges,), generator=g)).values
    src = torch.randint(0, num_src, (edges,), generator=g)
    if order == "shuffled":
        perm = torch.randperm(edges, generator=g)
        src, dst = src[perm], dst[perm]
    x = torch.randn(num_src, 5, dtype=torch.float64, generator=g, requires_grad=True)
    upstream = torch.randn(num_dst, 5, dtype=torch.float64, generator=g)
    out = hop_sum(x, src, dst, num_dst)
    (grad,) = torch.autograd.grad(out, x, upstream)
    x_ref = x.detach().clone().requires_grad_(True)
    expected = torch.zeros(num_dst, 5, dtype=torch.float64).index_add(0, dst, x_ref[src])
    (expected_grad,) = torch.autograd.grad(expected, x_ref, upstream)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)


def test_a_fanout_below_the_degree_estimates_the_sum_without_bias(ds):
    """Scaled by d_u / (neighbours held), one sampled layer's mean over many draws is the full sum."""
    torch.manual_seed(1)
    e0 = torch.randn(ds.num_nodes, 4, dtype=torch.float64)
    model = LightGCN(torch.as_tensor(np.diff(np.asarray(ds.indptr))), num_layers=1).double()
    seeds = torch.tensor([3, 9, 130])
    draws = []
    for iteration in range(3000):
        hops = OneTypeSampler(ds, [2], seed=iteration).sample(seeds, iteration)
        draws.append(model(SimpleNamespace(hops=hops, x=e0[hops[-1].nodes], emb=None)))
    torch.testing.assert_close(torch.stack(draws).mean(0), full_graph_lightgcn(ds, e0, 1)[seeds].float(), rtol=0,
                               atol=0.03)


def test_lightgcn_trains_through_the_trainer_and_is_refused_without_embeddings(ds, tmp_path, capsys):
    common = [f"dataset={ds.path}", "train.task=link", "model.kind=lightgcn", "sampler.fanouts=[-1,-1]",
              "sampler.batch_size=64", "cache.features=memory", "log.progress=false"]
    assert main(["train", *common, "model.node_embedding.dim=16", "model.node_embedding.features=false",
                 "model.node_embedding.optimizer=adam", "model.node_embedding.lr=0.01", "train.embedding_l2=1e-4",
                 "train.epochs=8", "train.eval_splits=[test]", f"checkpoint.dir={tmp_path / 'ck'}",
                 "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    losses = [h["loss"] for h in result["history"]]
    assert losses[-1] < losses[0]
    test = result["eval"]["test"]
    assert test["recall@20"] > 1.5 * test["random_recall@20"]
    assert main(["train", *common]) == 1
    assert "needs train.task=link and model.node_embedding.dim" in capsys.readouterr().err
    assert main(["train", *common, "model.node_embedding.dim=8", f"checkpoint.dir={tmp_path / 'c2'}"]) == 1
    # features on (the default): nothing to mix them with
    assert "model.node_embedding.features=false" in capsys.readouterr().err
