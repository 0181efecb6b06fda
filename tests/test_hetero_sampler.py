"""Typed neighbor sampling: real edges per relation, fanouts respected, the dst prefix per type, determinism,
independent relations, the Triton kernel's hops, and a PyG HeteroConv forward pass over the hops."""
import numpy as np
import pytest
import torch

from lsm_gnn.data.format import DatasetError
from lsm_gnn.sampling import Hop, NeighborSampler, OneTypeSampler
from lsm_gnn.utils.ids import _first_occurrence_labels_torch, first_occurrence_labels

CITES = ("paper", "cites", "paper")
WRITES = ("author", "writes", "paper")
WRITTEN_BY = ("paper", "written_by", "author")
AFFILIATED = ("author", "affiliated_with", "institute")
EMPLOYS = ("institute", "employs", "author")
NUM_NODES = {"paper": 300, "author": 400, "institute": 30}


class InMemoryGraph:
    """The sampler's Graph protocol over CSR arrays built from each relation's (src, dst) pairs."""

    def __init__(self, num_nodes, pairs, index_dtypes):
        self.node_types = list(num_nodes)
        self.relations = list(pairs)
        self.num_nodes = dict(num_nodes)
        self.arrays = {}
        for r, (src, dst) in pairs.items():
            order = np.argsort(dst, kind="stable")
            counts = np.bincount(dst, minlength=num_nodes[r[2]])
            indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            self.arrays[r] = (indptr, src[order].astype(index_dtypes.get(r, np.int64)))

    def num_nodes_of(self, node_type):
        return self.num_nodes[node_type]

    def csr(self, relation):
        return self.arrays[relation]

    def degree(self, relation):
        return np.diff(self.arrays[relation][0])


def distinct_sources(rng, num_src, degrees):
    """(src, dst) pairs: dst v gets degrees[v] distinct sources."""
    dst = np.repeat(np.arange(len(degrees)), degrees)
    src = np.concatenate([rng.choice(num_src, d, replace=False) for d in degrees])
    return src.astype(np.int64), dst.astype(np.int64)


def make_graph(seed=0):
    rng = np.random.default_rng(seed)
    n = NUM_NODES
    cite_degree = rng.integers(0, 9, n["paper"])
    cite_degree[rng.random(n["paper"]) < 0.2] = 0       # papers citing nothing
    cite_degree[[5, 77, 150]] = 120                     # hubs
    author_count = rng.integers(0, 5, n["paper"])
    author_count[[5, 9]] = 150                          # papers with many authors
    writes = distinct_sources(rng, n["author"], author_count)
    institutes = rng.integers(0, 3, n["author"])
    affiliation = distinct_sources(rng, n["institute"] - 5, institutes)  # institutes 25.. employ nobody
    affiliated = (affiliation[1], affiliation[0])       # (author, institute) pairs
    hub = np.setdiff1d(np.arange(n["author"]), affiliated[0][affiliated[1] == 0])[:120]
    affiliated = (np.concatenate([affiliated[0], hub]), np.concatenate([affiliated[1], np.zeros_like(hub)]))
    pairs = {CITES: distinct_sources(rng, n["paper"], cite_degree), WRITES: writes, WRITTEN_BY: writes[::-1],
             AFFILIATED: affiliated, EMPLOYS: affiliated[::-1]}
    return InMemoryGraph(n, pairs, {WRITES: np.int32, AFFILIATED: np.int32, EMPLOYS: np.int32})


@pytest.fixture(scope="module")
def graph():
    return make_graph()


def check_hops(graph, sampler, seeds, hops):
    """Every property a hop promises, checked against the graph."""
    previous = {t: torch.as_tensor(seeds.get(t, []), dtype=torch.int64) for t in graph.node_types}
    for h, hop in enumerate(hops):
        assert isinstance(hop, Hop) and isinstance(hop.nodes, dict)
        assert list(hop.nodes) == graph.node_types and list(hop.edge_index) == graph.relations
        new_sources = {t: [] for t in graph.node_types}
        for t, ids in hop.nodes.items():
            assert hop.num_dst[t] == previous[t].numel()
            assert torch.equal(ids[:hop.num_dst[t]], previous[t]), f"hop {h}: {t}'s dst prefix"
            assert ids.unique().numel() == ids.numel(), f"hop {h}: {t}'s nodes repeat"
        for r, edges in hop.edge_index.items():
            s, _, d = r
            assert edges.shape[0] == 2 and edges.dtype == torch.int64
            src_ids, dst_pos = hop.nodes[s][edges[0]], edges[1]
            assert dst_pos.numel() == 0 or int(dst_pos.max()) < hop.num_dst[d]
            indptr, indices = graph.csr(r)
            # Every edge is in its relation's CSR: (dst, src) keys against the CSR's own.
            csr_keys = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr)) * graph.num_nodes[s] + indices
            keys = hop.nodes[d][dst_pos].numpy() * graph.num_nodes[s] + src_ids.numpy()
            assert np.isin(keys, csr_keys).all(), f"hop {h}: {r} has an edge not in the graph"
            assert np.unique(keys).size == keys.size, f"hop {h}: {r} repeats a neighbor"
            k = sampler.fanouts[r][h]
            degree = torch.from_numpy(graph.degree(r))[hop.nodes[d][:hop.num_dst[d]]]
            expected = degree if k < 0 else degree.clamp(max=k)
            assert torch.equal(torch.bincount(dst_pos, minlength=hop.num_dst[d]), expected), f"hop {h}: {r}"
            new_sources[s].append(src_ids)
        for t, ids in hop.nodes.items():  # the new nodes are exactly the sources not there before
            reached = set(torch.cat(new_sources[t] + [ids[:0]]).tolist()) - set(previous[t].tolist())
            assert set(ids[hop.num_dst[t]:].tolist()) == reached
        previous = hop.nodes


@pytest.mark.parametrize("fanouts", [[4, 3], [-1, 2], [0, 3], [2, 0, -1],
                                     {CITES: [3, 1], WRITES: [-1, 0], "paper__written_by__author": [2, 5],
                                      AFFILIATED: [1, 1], "institute__employs__author": [0, 4]}])
def test_every_edge_exists_and_fanouts_hold(graph, fanouts):
    sampler = NeighborSampler(graph, fanouts, seed=11)
    others = np.setdiff1d(np.arange(NUM_NODES["paper"]), [5, 9, 77])
    seeds = {"paper": np.concatenate([[5, 9, 77], np.random.default_rng(1).choice(others, 40, replace=False)])}
    hops = sampler.sample(seeds, iteration=2)
    assert len(hops) == sampler.num_hops
    check_hops(graph, sampler, seeds, hops)


def test_seeds_of_several_types_and_the_pair_form(graph):
    sampler = NeighborSampler(graph, [3, 2], seed=4)
    hop = sampler.sample(("paper", [3, 1, 2]))[0]
    assert torch.equal(hop.dst_nodes["paper"], torch.tensor([3, 1, 2]))
    assert hop.nodes["institute"].numel() == 0 and hop.num_edges[AFFILIATED] == 0  # no paper -> institute
    assert hop.num_src == {t: ids.numel() for t, ids in hop.nodes.items()}
    same = sampler.sample({"paper": torch.tensor([3, 1, 2])})
    assert torch.equal(same[0].edge_index[CITES], hop.edge_index[CITES])
    seeds = {"author": [7, 0, 399], "institute": np.array([0, 29], dtype=np.int32)}
    hops = sampler.sample(seeds, 1)
    check_hops(graph, sampler, seeds, hops)
    assert set(sampler.input_nodes(seeds, 1)) == set(NUM_NODES)
    empty = sampler.sample({"paper": []})
    assert all(ids.numel() == 0 for hop in empty for ids in hop.nodes.values())


def same_hops(a, b):
    return all(x.num_dst == y.num_dst and all(torch.equal(x.nodes[t], y.nodes[t]) for t in x.nodes)
               and all(torch.equal(x.edge_index[r], y.edge_index[r]) for r in x.edge_index) for x, y in zip(a, b))


def test_deterministic_in_seed_and_iteration(graph):
    seeds = {"paper": np.arange(0, 300, 5)}
    a = NeighborSampler(graph, [4, 2], seed=1).sample(seeds, 4)
    b = NeighborSampler(graph, [4, 2], seed=1, num_threads=1).sample(seeds, 4)
    c = NeighborSampler(graph, [4, 2], seed=1).sample(seeds, 5)
    d = NeighborSampler(graph, [4, 2], seed=2).sample(seeds, 4)
    e = NeighborSampler(graph, [4, 2], seed=1 + 2**64).sample(seeds, 4)  # seeds are taken mod 2**64
    assert same_hops(a, b) and same_hops(a, e)
    assert not same_hops(a, c) and not same_hops(a, d)


def test_many_typed_batches_side_by_side_equal_each_sampled_alone(graph):
    batches = [({"paper": np.arange(k, 300, 7)}, k) for k in range(6)]
    alone = [NeighborSampler(graph, [4, 2], seed=1).sample(seeds, it) for seeds, it in batches]
    together = NeighborSampler(graph, [4, 2], seed=1, num_threads=2).sample_many(batches)
    assert all(same_hops(a, b) for a, b in zip(alone, together))


def test_relations_draw_independently():
    """Two relations with identical CSRs into the same type, and one relation hop after hop, draw
    different neighbors of a hub: their random streams differ."""
    rng = np.random.default_rng(3)
    degree = rng.integers(0, 4, 50)
    degree[0] = 100
    src, dst = distinct_sources(rng, 200, degree)
    first, second = ("paper", "cites", "paper"), ("paper", "cites_again", "paper")
    twin = InMemoryGraph({"paper": 200}, {first: (src, dst), second: (src, dst)}, {})
    sampler = NeighborSampler(twin, [5, 5], seed=9)
    equal_relations = equal_hops = 0
    for iteration in range(40):
        hops = sampler.sample({"paper": [0]}, iteration)
        drawn = [sorted(hop.nodes["paper"][hop.edge_index[r][0][hop.edge_index[r][1] == 0]].tolist())
                 for hop in hops for r in (first, second)]
        equal_relations += drawn[0] == drawn[1]
        equal_hops += drawn[0] == drawn[2]
    assert equal_relations <= 2 and equal_hops <= 2


def test_plain_seeds_need_one_node_type_and_one_relation(graph):
    """Plain ids name no type: a graph of several types, or of one type with several relations, has no
    OneTypeSampler, and the keyed sampler takes seeds only as {type: ids}; its counts and fanouts are per type
    and per relation."""
    src, dst = distinct_sources(np.random.default_rng(4), 50, np.full(50, 2))
    twin = InMemoryGraph({"paper": 50}, {CITES: (src, dst), ("paper", "cites_again", "paper"): (src, dst)}, {})
    for g, shape in ((graph, "3 node types .* and 5 relations"), (twin, r"1 node types \(paper\) and 2 relations")):
        with pytest.raises(ValueError, match=rf"one node type and one relation; this one has {shape}: use "
                                             r"NeighborSampler with seeds as \{node type: ids\}"):
            OneTypeSampler(g, [2])
        sampler = NeighborSampler(g, [2], seed=1)
        assert sampler.fanouts == {r: [2] for r in g.relations}
        with pytest.raises(TypeError, match=r"seeds must be \{node type: ids\} or a \(node type, ids\) pair"):
            sampler.sample(np.arange(3))
        with pytest.raises(AttributeError, match="relations, so no one indptr"):
            sampler.indptr
        assert all(isinstance(hop.nodes, dict) for hop in sampler.sample({"paper": [0, 1, 2]}))
    assert NeighborSampler(graph, [2]).num_nodes == NUM_NODES and NeighborSampler(twin, [2]).num_nodes == {"paper": 50}


def test_fanout_dicts(graph):
    by_tuple = {r: [2, 1] for r in graph.relations}
    by_name = {"__".join(r): [2, 1] for r in graph.relations}
    mixed = {**{r: [2, 1] for r in graph.relations[:2]}, **{"__".join(r): [2, 1] for r in graph.relations[2:]}}
    seeds = {"paper": [1, 2, 3, 5]}
    hops = [NeighborSampler(graph, f, seed=5).sample(seeds) for f in (by_tuple, by_name, mixed, [2, 1])]
    assert all(same_hops(hops[0], other) for other in hops[1:])


@pytest.mark.parametrize("fanouts, message", [
    ({r: [2] for r in [CITES, WRITES, WRITTEN_BY, AFFILIATED]}, "missing: institute__employs__author"),
    ({**{r: [2] for r in [CITES, WRITES, WRITTEN_BY, AFFILIATED, EMPLOYS]}, "paper__cited_by__paper": [2]},
     "relation 'paper__cited_by__paper', which the graph does not have"),
    ({**{r: [2] for r in [CITES, WRITES, WRITTEN_BY, AFFILIATED, EMPLOYS]}, ("a", "b", "c"): [2]},
     r"relation \('a', 'b', 'c'\)"),
    ({**{r: [2] for r in [CITES, WRITES, WRITTEN_BY, AFFILIATED]}, EMPLOYS: [2, 2]},
     "institute__employs__author has 2, paper__cites__paper has 1"),
    ({**{r: [2] for r in [CITES, WRITES, WRITTEN_BY, AFFILIATED, EMPLOYS]}, "paper__cites__paper": [2]}, "twice"),
    ({**{r: [2] for r in [CITES, WRITES, WRITTEN_BY, AFFILIATED]}, EMPLOYS: [-2]}, "fanouts of institute__employs"),
    ({**{r: [2] for r in [CITES, WRITES, WRITTEN_BY, AFFILIATED]}, EMPLOYS: 3}, "fanouts of institute__employs"),
    ([], "non-empty"), ([3, -5], "non-empty"),
])
def test_bad_fanouts_are_refused(graph, fanouts, message):
    with pytest.raises(ValueError, match=message):
        NeighborSampler(graph, fanouts)


def test_bad_seeds_are_refused(graph):
    sampler = NeighborSampler(graph, [2])
    with pytest.raises(IndexError, match="seed node 300 of type 'paper' at position 1 is outside"):
        sampler.sample({"paper": [4, 300]})
    with pytest.raises(IndexError, match="type 'institute'"):
        sampler.sample(("institute", [-1]))
    with pytest.raises(ValueError, match="seed node 7 of type 'author' appears twice"):
        sampler.sample({"paper": [7], "author": [7, 7]})
    with pytest.raises(ValueError, match="node type 'venue'"):
        sampler.sample({"venue": [0]})
    with pytest.raises(TypeError, match=r"got list; for plain ids of a graph of one node type use "
                                        r"lsm_gnn.sampling.OneTypeSampler"):
        sampler.sample([1, 2])
    with pytest.raises(TypeError, match=r"seeds must be \{node type: ids\}.*got ndarray"):
        sampler.input_nodes(np.array([1, 2]))
    with pytest.raises(ValueError, match="a hop of 3 node types and 5 relations has no plain form"):
        sampler.sample({"paper": [1, 2]})[0].unkeyed()


def test_corrupt_topology_names_the_relation_and_file(graph, tmp_path):
    def corrupted(relation, array, position, value, save=False):
        arrays = {r: [a.copy() for a in graph.csr(r)] for r in graph.relations}
        arrays[relation][array][position] = value
        if save:
            path = tmp_path / "indices.npy"
            np.save(path, arrays[relation][1])
            arrays[relation][1] = np.load(path, mmap_mode="r")
        broken = InMemoryGraph.__new__(InMemoryGraph)
        broken.node_types, broken.relations, broken.num_nodes = graph.node_types, graph.relations, NUM_NODES
        broken.arrays = arrays
        return broken

    seeds = {"paper": np.arange(300), "author": np.arange(400), "institute": np.arange(30)}
    # 400 authors but 300 papers: author 400 is past the source type, though within the CSR's id range
    with pytest.raises(DatasetError, match="relation author__writes__paper: neighbor id 400"):
        NeighborSampler(corrupted(WRITES, 1, 0, 400), [-1]).sample(seeds)
    # 30 institutes but 400 authors: institute 31 would be a valid row, but not a valid source id
    with pytest.raises(DatasetError, match=r"relation institute__employs__author: neighbor id 31 .* outside \[0, 30\)"):
        NeighborSampler(corrupted(EMPLOYS, 1, 3, 31), [-1]).sample(seeds)
    with pytest.raises(DatasetError, match=r"indices\.npy: relation paper__cites__paper: neighbor id -2"):
        NeighborSampler(corrupted(CITES, 1, 0, -2, save=True), [-1]).sample(seeds)
    with pytest.raises(DatasetError, match="relation paper__written_by__author: the row of node"):
        NeighborSampler(corrupted(WRITTEN_BY, 0, 10, 10**6), [-1]).sample(seeds)
    short = corrupted(CITES, 0, 0, 0)
    short.arrays[CITES][0] = short.arrays[CITES][0][:-1]
    with pytest.raises(DatasetError, match="relation paper__cites__paper: indptr has 300 entries, but 'paper' has 300"):
        NeighborSampler(short, [2])


def test_first_occurrence_labels_on_cpu_equal_the_gpu_way():
    rng = np.random.default_rng(2)
    ids = torch.from_numpy(np.concatenate([rng.permutation(50)[:20], rng.integers(0, 80, 300)]))
    nodes, labels = first_occurrence_labels(ids)
    assert torch.equal(nodes[:20], ids[:20]) and torch.equal(nodes[labels], ids)
    other_nodes, other_labels = _first_occurrence_labels_torch(ids)
    assert torch.equal(nodes, other_nodes) and torch.equal(labels, other_labels)



@pytest.mark.parametrize("ids", [[], [7], [3, 3, 3], [-5, 2**62, -5, 0, 2**62, 1], list(range(9, -1, -1)) * 3])
def test_first_occurrence_labels_gpu_way_at_the_edges(ids):
    ids = torch.tensor(ids, dtype=torch.int64)
    nodes, labels = first_occurrence_labels(ids)
    other_nodes, other_labels = _first_occurrence_labels_torch(ids)
    assert torch.equal(nodes, other_nodes) and torch.equal(labels, other_labels)
    assert other_nodes.dtype == other_labels.dtype == torch.int64

def test_the_triton_kernel_draws_the_same_hops(graph, monkeypatch):
    pytest.importorskip("triton")
    from lsm_gnn import _C
    from lsm_gnn import kernels

    seeds = {"paper": [5, 12, 40], "institute": [2]}
    sampler = NeighborSampler(graph, [3, 2], seed=21)
    native = sampler.sample(seeds, 6)

    def unused(*args, **kwargs):
        raise AssertionError("kernels=triton called the C++ core")

    monkeypatch.setattr(_C, "sample_hops", unused)
    with kernels.using("triton"):
        triton = sampler.sample(seeds, 6)
    assert same_hops(native, triton)


def test_a_pyg_hetero_conv_runs_over_the_hops(graph):
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    sampler = NeighborSampler(graph, [4, 3], seed=2)
    seeds = torch.tensor([5, 8, 13, 21, 34])
    hops = sampler.sample({"paper": seeds}, 0)
    features = {t: torch.randn(n, 6) for t, n in NUM_NODES.items()}
    convs = [pyg.HeteroConv({r: pyg.SAGEConv((-1, -1), 8) for r in graph.relations}, aggr="sum")
             for _ in hops]
    x_dict = {t: features[t][ids] for t, ids in hops[-1].nodes.items()}
    for conv, hop in zip(convs, reversed(hops)):
        out = conv(x_dict, hop.edge_index)
        x_dict = {t: y[:hop.num_dst[t]] for t, y in out.items()}
    assert x_dict["paper"].shape == (len(seeds), 8)
    x_dict["paper"].sum().backward()
    assert any(p.grad is not None and bool(p.grad.any()) for p in convs[0].parameters())  # through both layers
