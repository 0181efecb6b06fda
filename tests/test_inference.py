"""Layer-wise full-neighbourhood inference equals the model run over the whole graph, hop by hop."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")

from lsm_gnn import open_storage  # noqa: E402
from lsm_gnn.cache import SoftwareCache  # noqa: E402
from lsm_gnn.loader import NodeLoader  # noqa: E402
from lsm_gnn.models import MODEL_KINDS, HopGNN  # noqa: E402
from lsm_gnn.sampling import Hop  # noqa: E402
from lsm_gnn.tasks.inference import full_hop, layerwise_inference  # noqa: E402
from lsm_gnn.testing import write_tiny_dataset  # noqa: E402

N, DIM = 90, 6


@pytest.fixture(autouse=True)
def _one_thread_for_every_test(one_torch_thread):
    """Tiny models (conftest.one_torch_thread)."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A directed random graph with self-loops and repeated edges, random features."""
    features = np.random.default_rng(1).standard_normal((N, DIM)).astype(np.float32)
    dataset, _ = write_tiny_dataset(tmp_path_factory.mktemp("inference") / "g", num_nodes=N, dim=DIM, avg_degree=5,
                                    features=features)
    indptr, indices = np.asarray(dataset.indptr), np.asarray(dataset.indices)
    assert (indices == np.repeat(np.arange(N), np.diff(indptr))).any()  # a self-loop is there to get right
    return dataset, torch.from_numpy(features)


def whole_graph(dataset, x, model):
    """The model over hops that each hold the whole graph (row v of the CSR: v's in-neighbours)."""
    indptr, indices = np.asarray(dataset.indptr), np.asarray(dataset.indices)
    dst = np.repeat(np.arange(N), np.diff(indptr))
    hop = Hop(nodes=torch.arange(N), num_dst=N, edge_index=torch.from_numpy(np.stack([indices, dst])).long())
    return model(SimpleNamespace(x=x, hops=[hop] * len(model.convs), emb=None))


def test_a_full_hop_holds_every_in_edge_with_destinations_first(tiny):
    dataset, _ = tiny
    dst = np.array([7, 3, 40, 3 + N // 2])
    hop = full_hop(dataset.indptr, dataset.indices, dst)
    assert hop.nodes[:4].tolist() == dst.tolist() and hop.nodes.unique().numel() == hop.nodes.numel()
    got = sorted(zip(hop.nodes[hop.edge_index[0]].tolist(), hop.nodes[hop.edge_index[1]].tolist()))
    indptr, indices = np.asarray(dataset.indptr), np.asarray(dataset.indices)
    expected = sorted((int(u), int(v)) for v in dst for u in indices[indptr[v]:indptr[v + 1]])
    assert got == expected


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("layers", [1, 3])
def test_layerwise_equals_the_whole_graph_computation(tiny, kind, layers):
    dataset, x = tiny
    torch.manual_seed(0)
    model = HopGNN(kind, DIM, 8, 5, num_layers=layers, heads=2, dropout=0.5)  # dropout: eval mode turns it off
    expected = whole_graph(dataset, x, model.eval())
    model.train()
    nodes = np.random.default_rng(2).permutation(N)[:50]  # any order, a subset
    # Chunks of 7 nodes, read 5 rows at a time through a cache of 32 lines: out of core in small pieces.
    cache = SoftwareCache(open_storage(dataset), num_sets=1, ways=32, policy="rr")
    got = layerwise_inference(model, dataset, cache, nodes, chunk_size=7, read_rows=5)
    assert model.training  # restored
    torch.testing.assert_close(got, expected[torch.from_numpy(nodes)].detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_layerwise_equals_sampling_every_neighbour(tiny, kind):
    """The sampler with fanout -1 takes every in-edge of every hop: for SAGE and GAT the same logits."""
    dataset, _ = tiny
    torch.manual_seed(0)
    model = HopGNN(kind, DIM, 8, 5, num_layers=2, heads=2).eval()
    features = open_storage(dataset, "memory")
    nodes = np.arange(0, N, 3)
    loader = NodeLoader(dataset, features, [-1, -1], 11, seeds=nodes, shuffle=False)
    sampled = torch.cat([model(batch) for batch in loader])
    got = layerwise_inference(model, dataset, features, nodes, chunk_size=16)
    torch.testing.assert_close(got, sampled.detach(), atol=1e-5, rtol=1e-5)


def test_bad_sizes_are_refused(tiny):
    dataset, _ = tiny
    with pytest.raises(ValueError, match="chunk_size and read_rows must be >= 1"):
        layerwise_inference(HopGNN("sage", DIM, 8, 5, num_layers=1), dataset, open_storage(dataset, "memory"),
                            [0], chunk_size=0)


def test_the_trainer_evaluates_with_every_neighbour(tiny, tmp_path):
    from lsm_gnn.config import ConfigError, load_config
    from lsm_gnn.training.trainer import Trainer

    dataset, _ = tiny
    common = [f"dataset={dataset.path}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[3,2]",
              "sampler.batch_size=16", "cache.features=memory", "log.progress=false", "train.epochs=2"]
    trainer = Trainer(load_config(None, [*common, "train.eval_mode=full", "train.eval_batch_size=10"]))
    result = trainer.fit()
    val = result["eval"]["val"]
    # The oracle: the same weights over hops sampled with every neighbour.
    seeds = trainer.task.labeled("val")
    loader = NodeLoader(dataset, open_storage(dataset, "memory"), [-1, -1], 7, seeds=seeds, shuffle=False)
    with torch.no_grad():
        trainer.module.eval()
        correct = sum(int((trainer.module(b).argmax(1) == b.y).sum()) for b in loader)
    assert val == {"accuracy": correct / seeds.size, "count": seeds.size}
    with pytest.raises(ConfigError, match="eval_mode"):
        load_config(None, [*common, "train.eval_mode=all"])
    # Sampled evaluation with fanouts of its own: every neighbour gives full evaluation's figures.
    from lsm_gnn.data.dataset import ONE_RELATION
    from lsm_gnn.tasks.options import loader_options

    trainer.task.cfg.train.eval_mode, trainer.task.cfg.train.eval_fanouts = "sampled", [-1, -1]
    assert trainer.evaluate("val") == val
    options = loader_options(trainer.task.cfg, 0, 1)
    train_loader = trainer.task._loader(trainer.features, seeds, 8, False, options)
    eval_loader = trainer.task._loader(trainer.features, seeds, 8, False, {**options, "training": False})
    assert train_loader.sampler.fanouts == {ONE_RELATION: [3, 2]}
    assert eval_loader.sampler.fanouts == {ONE_RELATION: [-1, -1]}
    train_loader.close(), eval_loader.close()
    for bad in ("[5]", "[5,2,2]", "[5,-2]"):
        with pytest.raises(ConfigError, match=r"train.eval_fanouts must be \[\] \(sampler.fanouts\) or a list of 2"):
            load_config(None, [*common, f"train.eval_fanouts={bad}"])
