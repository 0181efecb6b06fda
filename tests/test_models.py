"""The hop models keep their PyG full-graph counterparts' semantics, the self term included."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pyg = pytest.importorskip("torch_geometric.nn")

from lsm_gnn.models import MODEL_KINDS, HopGNN  # noqa: E402
from lsm_gnn.sampling import Hop  # noqa: E402

IN, OUT = 6, 5


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    yield
    torch.set_num_threads(threads)


def batch_of(x, hop):
    return SimpleNamespace(x=x, hops=[hop], emb=None)


def random_graph(n=40, m=160, self_loops=3, seed=0):
    """A symmetric edge_index (2, E) without parallel edges, with a few self-loops."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    pairs = {(int(a), int(b)) for a, b in zip(src[keep], dst[keep])}
    pairs |= {(b, a) for a, b in pairs}
    pairs |= {(int(v), int(v)) for v in rng.choice(n, self_loops, replace=False)}
    return torch.tensor(sorted(pairs), dtype=torch.int64).t().contiguous()


def hop_over(edge_index, dst_nodes):
    """The hop holding every in-edge of ``dst_nodes``: they come first among its nodes, as the sampler does."""
    keep = torch.isin(edge_index[1], dst_nodes)
    src, dst = edge_index[0][keep], edge_index[1][keep]
    extra = torch.unique(src[~torch.isin(src, dst_nodes)])
    nodes = torch.cat([dst_nodes, extra])
    local = torch.full((int(edge_index.max()) + 1,), -1, dtype=torch.int64)
    local[nodes] = torch.arange(nodes.numel())
    return Hop(nodes=nodes, num_dst=dst_nodes.numel(), edge_index=torch.stack([local[src], local[dst]]))


def full_graph_conv(kind, conv):
    """PyG's full-graph layer with ``conv``'s weights."""
    if kind == "gat":
        ref = pyg.GATConv(IN, OUT, heads=conv.heads, concat=False, add_self_loops=True)
    elif kind == "sage":
        ref = pyg.SAGEConv(IN, OUT)
    else:
        ref = pyg.GCNConv(IN, OUT)
        with torch.no_grad():
            ref.lin.weight.copy_(conv.lin.weight)
            ref.bias.copy_(conv.bias)
        return ref
    ref.load_state_dict(conv.state_dict())
    return ref


class TestSelfTerm:
    """A destination node's own features reach its output, whether or not it has sampled in-edges."""

    @staticmethod
    def _hop():
        # Destinations 0, 1, 2; sources 3, 4. Node 0 has no in-edge, 1 exactly one (from 3), 2 two (3 and 4).
        return Hop(nodes=torch.arange(5), num_dst=3, edge_index=torch.tensor([[3, 3, 4], [1, 2, 2]]))

    @pytest.mark.parametrize("kind", MODEL_KINDS)
    @pytest.mark.parametrize("node", [0, 1, 2], ids=["no-in-edges", "one-in-edge", "two-in-edges"])
    def test_changing_only_a_destinations_own_features_changes_its_output(self, kind, node):
        torch.manual_seed(0)
        model = HopGNN(kind, IN, 8, OUT, num_layers=1).eval()
        x = torch.randn(5, IN)
        changed = x.clone()
        changed[node] += 3.0
        with torch.no_grad():
            before, after = model(batch_of(x, self._hop())), model(batch_of(changed, self._hop()))
        assert not torch.allclose(before[node], after[node], atol=1e-4)
        others = [v for v in range(3) if v != node]
        assert torch.allclose(before[others], after[others])  # no edge leaves a destination here

    @pytest.mark.parametrize("kind", MODEL_KINDS)
    def test_the_self_term_reaches_through_two_layers(self, kind):
        # Seed 0 has no in-edge in either hop: only its own features, carried through itself, reach it.
        inner = Hop(nodes=torch.arange(2), num_dst=1, edge_index=torch.zeros((2, 0), dtype=torch.int64))
        outer = Hop(nodes=torch.arange(4), num_dst=2, edge_index=torch.tensor([[2, 3], [1, 1]]))
        torch.manual_seed(1)
        model = HopGNN(kind, IN, 8, OUT, num_layers=2, heads=2).eval()
        x = torch.randn(4, IN)
        changed = x.clone()
        changed[0] += 3.0
        with torch.no_grad():
            run = [model(SimpleNamespace(x=v, hops=[inner, outer], emb=None)) for v in (x, changed)]
        assert not torch.allclose(run[0], run[1], atol=1e-4)


class TestMatchesPyGFullGraph:
    @pytest.mark.parametrize("kind", ["gat", "sage"])
    def test_a_hop_with_full_neighborhoods_equals_the_full_graph_layer(self, kind):
        torch.manual_seed(2)
        edge_index = random_graph()
        x = torch.randn(40, IN)
        model = HopGNN(kind, IN, 8, OUT, num_layers=1, heads=3).eval()
        dst_nodes = torch.tensor([5, 0, 17, 33, 8, 21])
        hop = hop_over(edge_index, dst_nodes)
        with torch.no_grad():
            ours = model(batch_of(x[hop.nodes], hop))
            ref = full_graph_conv(kind, model.convs[0])(x, edge_index)[dst_nodes]
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)

    @pytest.mark.parametrize("kind", MODEL_KINDS)
    def test_a_hop_of_the_whole_graph_equals_the_full_graph_layer(self, kind):
        # GCN's normalization counts degrees inside the hop, so it equals PyG's over the whole graph.
        torch.manual_seed(3)
        edge_index = random_graph(seed=1)
        x = torch.randn(40, IN)
        model = HopGNN(kind, IN, 8, OUT, num_layers=1, heads=2).eval()
        hop = Hop(nodes=torch.arange(40), num_dst=40, edge_index=edge_index)
        with torch.no_grad():
            ours = model(batch_of(x, hop))
            ref = full_graph_conv(kind, model.convs[0])(x, edge_index)
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
