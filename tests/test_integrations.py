"""PyG stores and DGL blocks: rows equal the file, edges equal the sampler's hops, and the stores are read-only."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lsm_gnn import open_storage
from lsm_gnn.cache import SoftwareCache
from lsm_gnn.loader import NodeLoader
from lsm_gnn.sampling import OneTypeSampler
from lsm_gnn.testing import write_tiny_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    ds, _ = write_tiny_dataset(tmp_path_factory.mktemp("integrations") / "ds", num_nodes=999, dim=13, avg_degree=5)
    return ds


@pytest.fixture(params=["io_uring", "pread", "cache"])
def features(request, dataset):
    storage = open_storage(dataset, "pread" if request.param == "cache" else request.param)
    if request.param == "cache":
        # 64 lines, fewer than most reads below hold: hits, misses and evictions all happen.
        yield SoftwareCache(storage, num_sets=2, ways=32, policy="lru", oversubscribe=True)
    else:
        yield storage
    storage.close()


def feature_store(dataset, features, **options):
    pytest.importorskip("torch_geometric")
    from lsm_gnn.integrations import LsmFeatureStore

    return LsmFeatureStore(dataset, features, **options)


def test_feature_store_rows_equal_the_file(dataset, features):
    from torch_geometric.data import TensorAttr

    store = feature_store(dataset, features)
    rng = np.random.default_rng(0)
    for size in (1, 7, 200, 500):
        ids = rng.integers(0, dataset.num_nodes, size)  # unsorted, with repeats
        expected = torch.from_numpy(dataset.read_features_direct(ids))
        assert torch.equal(store[None, "x", torch.from_numpy(ids).int()], expected)
        assert torch.equal(store.get_tensor(TensorAttr(None, "x", torch.from_numpy(ids))), expected)
        assert torch.equal(store[None, "x"][ids.tolist()], expected)  # a view, then a list index
    assert torch.equal(store[None, "x", 17], torch.from_numpy(dataset.read_features_direct([17])[0]))
    assert torch.equal(store[None, "x", 10:400:3], torch.from_numpy(dataset.read_features_direct(range(10, 400, 3))))
    assert torch.equal(store[None, "x"](), torch.from_numpy(dataset.read_features_direct(range(dataset.num_nodes))))
    if isinstance(features, SoftwareCache):
        assert features.stats.hits > 0 and features.stats.evictions > 0


def test_labels_sizes_and_dtype(dataset):
    storage = open_storage(dataset, "memory")
    store = feature_store(dataset, storage, group_name="paper", dtype=torch.float64)
    ids = torch.tensor([5, 998, 0, 5])
    assert torch.equal(store["paper", "y", ids], torch.from_numpy(np.array(dataset.labels()))[ids])
    assert store["paper", "x", ids].dtype == torch.float64
    assert torch.equal(store["paper", "x", ids], torch.from_numpy(dataset.read_features_direct(ids.numpy())).double())
    assert store.get_tensor_size("paper", "x") == (999, 13)
    assert store.get_tensor_size("paper", "y") == (999,)
    assert store.get_tensor_size("paper", "z") is None and store.get_tensor_size(None, "x") is None
    assert [(a.group_name, a.attr_name) for a in store.get_all_tensor_attrs()] == [("paper", "x"), ("paper", "y")]
    with pytest.raises(KeyError, match=r"it holds \(group_name, attr_name\) \[\('paper', 'x'\)"):
        store["paper", "feat", ids]
    with pytest.raises(IndexError, match="out of range"):
        store["paper", "x", torch.tensor([999])]


def test_reads_above_the_limit_are_refused(dataset):
    storage = open_storage(dataset, "memory")
    row_bytes = storage.row_bytes
    store = feature_store(dataset, storage, max_read_bytes=100 * row_bytes)
    assert store[None, "x", torch.arange(100)].shape == (100, 13)
    with pytest.raises(ValueError, match="exceeds max_read_bytes"):
        store[None, "x"]()  # all 999 nodes
    with pytest.raises(ValueError, match="exceeds max_read_bytes"):
        store[None, "x", torch.arange(101)]


def test_stores_are_read_only(dataset):
    store = feature_store(dataset, open_storage(dataset, "memory"))
    from lsm_gnn.integrations import LsmGraphStore

    graph = LsmGraphStore(dataset)
    rows = torch.zeros(2, 13)
    for attempt in (lambda: store.put_tensor(rows, None, "x", torch.arange(2)),
                    lambda: store.__setitem__((None, "x", torch.arange(2)), rows),
                    lambda: store.remove_tensor(None, "x", None),
                    lambda: store.__delitem__((None, "x")),
                    lambda: store.update_tensor(rows, None, "x", torch.arange(2)),
                    lambda: graph.put_edge_index((rows, rows), None, "coo"),
                    lambda: graph.remove_edge_index(None, "csc")):
        with pytest.raises(TypeError, match="read-only"):
            attempt()


def test_graph_store_edges_equal_the_dataset(dataset):
    pytest.importorskip("torch_geometric")
    from lsm_gnn.integrations import LsmGraphStore

    graph = LsmGraphStore(dataset)
    indptr, indices = np.asarray(dataset.indptr), np.asarray(dataset.indices)
    row, colptr = graph.get_edge_index(None, "csc")
    assert np.array_equal(row.numpy(), indices) and np.array_equal(colptr.numpy(), indptr)
    src, dst, _ = graph.coo()
    # Row v of the CSR lists the sources of v's edges u -> v.
    assert np.array_equal(dst.numpy(), np.repeat(np.arange(dataset.num_nodes), np.diff(indptr)))
    assert np.array_equal(src.numpy(), indices)
    with pytest.raises(KeyError, match="CSC layout only"):
        graph.get_edge_index(None, "coo")
    with pytest.raises(KeyError):
        graph.get_edge_index(("a", "to", "b"), "csc")


def test_pyg_builds_a_subgraph_from_the_stores(dataset):
    pytest.importorskip("torch_geometric")
    from torch_geometric.loader.utils import filter_custom_store

    from lsm_gnn.integrations import LsmGraphStore

    store = feature_store(dataset, open_storage(dataset, "memory"))
    hop = OneTypeSampler(dataset, [3]).sample([4, 9, 300])[0]
    data = filter_custom_store(store, LsmGraphStore(dataset), hop.nodes, *hop.edge_index, None)
    assert torch.equal(data.x, torch.from_numpy(dataset.read_features_direct(hop.nodes.numpy())))
    assert torch.equal(data.y, torch.from_numpy(np.array(dataset.labels()))[hop.nodes])
    assert data.num_nodes == hop.num_src


def test_dgl_blocks_equal_the_hops(dataset):
    dgl = pytest.importorskip("dgl")
    from lsm_gnn.integrations import to_dgl_blocks

    hops = OneTypeSampler(dataset, [4, 3, -1], seed=1).sample(np.arange(0, 999, 37), iteration=2)
    blocks = to_dgl_blocks(hops)
    assert len(blocks) == len(hops)
    for block, hop in zip(blocks, reversed(hops)):
        assert (block.num_src_nodes(), block.num_dst_nodes(), block.num_edges()) == \
            (hop.num_src, hop.num_dst, hop.edge_index.shape[1])
        src, dst = block.edges(order="eid")
        assert torch.equal(torch.stack([src, dst]), hop.edge_index)
        assert torch.equal(block.srcdata[dgl.NID], hop.nodes)
        assert torch.equal(block.dstdata[dgl.NID], hop.nodes[:hop.num_dst])
    for inner, outer in zip(blocks[1:], blocks[:-1]):
        assert torch.equal(outer.dstdata[dgl.NID], inner.srcdata[dgl.NID])


def test_dgl_sage_on_the_blocks_equals_the_pyg_model(dataset):
    dgl_nn = pytest.importorskip("dgl.nn")
    pytest.importorskip("torch_geometric")
    from lsm_gnn.integrations import to_dgl_blocks
    from lsm_gnn.models import HopGNN

    loader = NodeLoader(dataset, open_storage(dataset, "memory"), [5, 3], batch_size=64, window=0)
    batch = next(iter(loader))
    loader.close()
    torch.manual_seed(0)
    model = HopGNN("sage", 13, 16, 4, num_layers=2).eval()
    convs = [dgl_nn.SAGEConv(13, 16, "mean"), dgl_nn.SAGEConv(16, 4, "mean")]
    with torch.no_grad():
        for ours, theirs in zip(model.convs, convs):  # PyG: lin_l(mean) + lin_r(x_dst); DGL: fc_neigh + fc_self
            theirs.fc_neigh.weight.copy_(ours.lin_l.weight)
            theirs.fc_self.weight.copy_(ours.lin_r.weight)
            theirs.fc_self.bias.copy_(ours.lin_l.bias)
        h = batch.x.float()
        for i, (conv, block) in enumerate(zip(convs, to_dgl_blocks(batch))):
            h = conv(block, (h, h[:block.num_dst_nodes()]))
            h = torch.relu(h) if i < len(convs) - 1 else h
        assert h.shape == (batch.seeds.numel(), 4)
        torch.testing.assert_close(h, model(batch), rtol=1e-4, atol=1e-4)  # features reach ~1000


def test_a_missing_dgl_names_the_install_command(dataset, monkeypatch):
    from lsm_gnn.integrations import to_dgl_blocks

    monkeypatch.setitem(sys.modules, "dgl", None)  # makes "import dgl" raise ImportError
    with pytest.raises(ImportError, match=r"pip install dgl==1\.1\.3"):
        to_dgl_blocks(OneTypeSampler(dataset, [2]).sample([1, 2]))


def test_importing_lsm_gnn_imports_neither_library():
    code = ("import sys, lsm_gnn, lsm_gnn.integrations as i; assert 'to_dgl_blocks' in dir(i); "
            "assert not {'torch_geometric', 'dgl'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
