"""The IGBH-shaped heterogeneous generator: the schema-2 dataset it writes, exact reverse relations, determinism
whatever the chunk sizes, power-law degrees, scores over the union of relations, and paper labels that need the
neighbors' features: a heterogeneous mean aggregation beats a features-only model by a wide margin."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import lsm_gnn.data.csr_build
import lsm_gnn.data.scores
import lsm_gnn.data.writer
from lsm_gnn.cli import main
from lsm_gnn.data import Dataset, open_dataset
from lsm_gnn.data.synthetic import FEATURE_BLOCK
from lsm_gnn.data.synthetic_hetero import NODE_TYPES, RELATIONS, generate_hetero_synthetic

PAPERS = 3000
DIM = 32
REVERSES = {("author", "writes", "paper"): ("paper", "written_by", "author"),
            ("author", "affiliated_with", "institute"): ("institute", "employs", "author"),
            ("paper", "has_topic", "fos"): ("fos", "topic_of", "paper")}


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return generate_hetero_synthetic(tmp_path_factory.mktemp("hetero") / "g", num_papers=PAPERS, feature_dim=DIM,
                                     progress=False)


def matrix(ds, relation):
    """The relation's CSR as a scipy matrix: row v of dst, a column per src."""
    indptr, indices = ds.csr(relation)
    src, _, dst = relation
    return sp.csr_matrix((np.ones(len(indices)), np.asarray(indices), np.asarray(indptr)),
                         shape=(ds.num_nodes_of(dst), ds.num_nodes_of(src)))


def test_types_relations_and_counts(ds):
    assert isinstance(ds, Dataset) and isinstance(open_dataset(ds.path), Dataset) and not ds.is_homogeneous
    assert ds.node_types == list(NODE_TYPES) and ds.relations == list(RELATIONS)
    sizes = {t: ds.num_nodes_of(t) for t in ds.node_types}
    assert sizes == {"paper": 3000, "author": 3600, "institute": 15, "fos": 30}  # 1.2, 0.005, 0.01 x papers
    assert ds.target == "paper" and ds.num_classes() == 19 and ds.labels().shape == (PAPERS,)
    assert ds.labels("author") is None
    assert [len(ds.split(s)) for s in ("train", "val", "test")] == [1800, 600, 600]
    assert {t: ds.node_type(t).feature_dim for t in NODE_TYPES} == dict.fromkeys(NODE_TYPES, DIM)
    params = ds.meta["generator"]
    assert params["kind"] == "hetero-communities" and params["num_nodes"] == sizes and params["seed"] == 0
    ds.verify_checksums()


def test_reverse_relations_are_exact_transposes(ds):
    for forward, reverse in REVERSES.items():
        assert (matrix(ds, forward).T != matrix(ds, reverse)).nnz == 0, reverse
        assert ds.num_edges_of(forward) == ds.num_edges_of(reverse)


def test_every_row_is_sorted_without_repeats_or_self_citations(ds):
    for relation in RELATIONS:
        indptr, indices = (np.asarray(a) for a in ds.csr(relation))
        rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        same_row = rows[1:] == rows[:-1]
        assert np.all(indices[1:][same_row] > indices[:-1][same_row]), relation
        if relation[0] == relation[2]:
            assert not np.any(rows == indices)


def test_degrees_follow_a_power_law_and_no_node_is_left_out(ds):
    for relation in (("paper", "cites", "paper"), ("paper", "written_by", "author"),
                     ("paper", "has_topic", "fos")):
        degree = np.diff(np.asarray(ds.csr(relation)[0]))
        assert degree.max() > (10 if relation[1] != "has_topic" else 1.5) * degree.mean(), (relation, degree.max())
    # Anchors: every author wrote a paper, every field and institute has members; every paper has an author.
    for relation in (("paper", "written_by", "author"), ("paper", "has_topic", "fos"),
                     ("author", "affiliated_with", "institute"), ("author", "writes", "paper"),
                     ("fos", "topic_of", "paper"), ("institute", "employs", "author")):
        assert np.diff(np.asarray(ds.csr(relation)[0])).min() >= 1, relation


def test_authors_and_fields_keep_mostly_to_one_class(ds):
    """The drawn relations' affinity: most of an author's (a field's) papers share the author's class."""
    labels = np.asarray(ds.labels())
    for relation in (("paper", "written_by", "author"), ("paper", "has_topic", "fos")):
        indptr, indices = (np.asarray(a) for a in ds.csr(relation))
        rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        per_class = sp.csr_matrix((np.ones(rows.size), (rows, labels[indices]))).toarray()
        assert per_class.max(1).sum() / per_class.sum() > 0.6, relation


def test_scores_cover_every_type_over_the_union_of_relations(ds):
    pagerank_total = 0.0
    for t in NODE_TYPES:
        assert ds.score_names(t) == ["degree", "reverse_pagerank"]
        for name in ds.score_names(t):
            values = np.asarray(ds.score(name, t))
            assert values.shape == (ds.num_nodes_of(t),) and np.isfinite(values).all() and values.min() >= 0
        pagerank_total += float(np.sum(ds.score("reverse_pagerank", t), dtype=np.float64))
        # degree: how many rows of any relation list the node
        expected = sum(np.bincount(np.asarray(ds.csr(r)[1]), minlength=ds.num_nodes_of(t)) for r in RELATIONS
                       if r[0] == t)
        np.testing.assert_array_equal(ds.score("degree", t), expected)
    assert abs(pagerank_total - 1) < 1e-4  # one PageRank over all types together


def checksums(path):
    with open(os.path.join(path, "meta.json")) as f:
        return json.load(f)["checksums"]


def test_same_parameters_give_identical_files_whatever_the_chunk_sizes(tmp_path, monkeypatch):
    # 9000 authors span three feature blocks, so chunk_nodes=1 writes them block by block.
    args = dict(num_papers=2000, num_authors=9000, feature_dim={"paper": 4, "author": 3, "institute": 2, "fos": None},
                seed=7, progress=False)
    first = generate_hetero_synthetic(tmp_path / "first", **args)
    assert first.num_nodes_of("author") > 2 * FEATURE_BLOCK
    for module in (lsm_gnn.data.writer, lsm_gnn.data.csr_build, lsm_gnn.data.scores):  # every edge chunk
        monkeypatch.setattr(module, "EDGE_CHUNK", 999)
    monkeypatch.setattr(lsm_gnn.data.csr_build, "BUCKET_EDGES", 500)  # many buckets, read in row groups
    monkeypatch.setattr(lsm_gnn.data.csr_build, "MAX_BUCKETS", 5)
    again = generate_hetero_synthetic(tmp_path / "again", chunk_nodes=1, **args)
    assert checksums(again.path) == checksums(first.path)
    monkeypatch.undo()
    other = checksums(generate_hetero_synthetic(tmp_path / "other", **{**args, "seed": 8}).path)
    for file_name, checksum in checksums(first.path).items():
        if file_name.endswith((".bin", "indices.npy", "labels.npy")):
            assert other[file_name] != checksum, file_name


def test_per_type_dims_and_a_featureless_type(tmp_path):
    small = generate_hetero_synthetic(tmp_path / "dims", num_papers=200, feature_dim={"institute": 0, "fos": 8},
                                      feature_dtype="float16", num_classes=5, scores=(), progress=False)
    assert small.feature_types == ["paper", "author", "fos"]
    assert small.node_type("fos").feature_dim == 8 and small.node_type("author").feature_dim == 128
    assert small.node_type("paper").feature_dtype == np.float16
    assert small.node_type("institute").features is None and small.score_names("paper") == []
    assert small.num_nodes_of("fos") == 5  # at least one field per class


@pytest.mark.parametrize("papers", [1, 7])
def test_the_smallest_graphs_are_valid(tmp_path, papers):
    tiny = generate_hetero_synthetic(tmp_path / "tiny", num_papers=papers, feature_dim=2, progress=False)
    assert tiny.num_nodes_of("paper") == papers and tiny.num_nodes_of("institute") == 4


@pytest.mark.parametrize("kw, message", [
    ({"num_papers": 0}, "num_papers"),
    ({"feature_dim": {"venue": 3}}, "unknown node type"),
    ({"affinity": {"cites": 0.5}}, "affinity names unknown"),
    ({"affinity": {"writes": 1.5}}, "affinity of 'writes'"),
    ({"authors_per_paper": 0.5}, "authors_per_paper"),
    ({"homophily": -0.1}, "homophily"),
    ({"feature_dtype": "int8"}, "float32 or float16"),
    ({"scores": ("pagerank",)}, "unknown score"),
])
def test_bad_parameters_are_refused_before_writing(tmp_path, kw, message):
    args = {"num_papers": 50, "feature_dim": 4, "progress": False, **kw}
    with pytest.raises(ValueError, match=message):
        generate_hetero_synthetic(tmp_path / "bad", **args)
    assert os.listdir(tmp_path) == []


# -- the paper labels need the neighbors ---------------------------------------------

def mean_over(ds, relation, h):
    """Mean of ``h`` (rows of the relation's src type) over each dst node's row: one aggregation step."""
    indptr, indices = ds.csr(relation)
    indptr = torch.from_numpy(np.asarray(indptr))
    rows = torch.repeat_interleave(torch.arange(len(indptr) - 1), indptr.diff())
    total = torch.zeros(len(indptr) - 1, h.shape[1]).index_add_(0, rows, h[np.asarray(indices, dtype=np.int64)])
    return total / indptr.diff().clamp(min=1).unsqueeze(1)


def fit(x, y, train, val, epochs=100):
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], int(y.max()) + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05, weight_decay=1e-3)
    for _ in range(epochs):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[train]), y[train]).backward()
        optimizer.step()
    with torch.no_grad():
        return (model(x[val]).argmax(1) == y[val]).float().mean().item()


def test_aggregating_authors_topics_and_citations_beats_paper_features(ds, one_torch_thread):
    x = {t: torch.from_numpy(ds.node_type(t).read_features_direct(np.arange(ds.num_nodes_of(t))))
         for t in ("paper", "author", "fos")}
    y = torch.from_numpy(np.array(ds.labels()))
    train, val = (torch.from_numpy(np.array(ds.split(s))) for s in ("train", "val"))
    features_only = fit(x["paper"], y, train, val)
    # A one-layer heterogeneous GNN with mean aggregation per relation, precomputed (as SIGN does).
    aggregated = torch.cat([x["paper"], mean_over(ds, ("author", "writes", "paper"), x["author"]),
                            mean_over(ds, ("fos", "topic_of", "paper"), x["fos"]),
                            mean_over(ds, ("paper", "cites", "paper"), x["paper"])], 1)
    gnn = fit(aggregated, y, train, val)
    print(f"features only {features_only:.3f}, aggregated {gnn:.3f}")
    assert features_only < 0.4  # 19 classes: chance is 0.05
    assert gnn >= features_only + 0.3, (gnn, features_only)


# -- the command line ------------------------------------------------------------------

def test_prepare_hetero_synthetic_writes_a_dataset_and_prints_one_line(tmp_path, capsys):
    out = tmp_path / "h"
    assert main(["prepare", "hetero", "synthetic", "--out", str(out), "--num-papers", "500", "--feature-dim", "8",
                 "--feature-dims", "institute=0", "--num-classes", "4", "--seed", "3", "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "paper 500" in lines[0] and "target paper: 4 classes" in lines[0], lines
    ds = open_dataset(out)
    assert isinstance(ds, Dataset) and ds.num_nodes_of("paper") == 500 and ds.num_classes() == 4
    assert ds.feature_types == ["paper", "author", "fos"] and ds.meta["generator"]["seed"] == 3
    assert main(["prepare", "hetero", "synthetic", "--out", str(out), "--num-papers", "100", "--no-progress"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["prepare", "hetero", "synthetic", "--out", str(tmp_path / "bad"), "--num-papers", "100",
                 "--feature-dims", "venue=3", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lsm-gnn: error:") and "venue" in err[0]


@pytest.mark.slow
@pytest.mark.beside  # half a minute of one core: .ci/run's two jobs come out even with it beside the suite
def test_a_million_papers_in_bounded_memory(tmp_path):
    """10^6 papers (2.2 M nodes, 1.3 GB written): the generator's resident memory grows by far less than the
    output, since features and edges stream in fixed blocks (most of the growth is their fixed-size temporaries)."""
    script = ("import json, resource, sys\n"
              "from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic\n"
              "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
              "generate_hetero_synthetic(sys.argv[1], num_papers=10**6, progress=False)\n"
              "print(json.dumps([before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))\n")
    out = tmp_path / "big"
    result = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    before_kib, peak_kib = json.loads(result.stdout.strip().splitlines()[-1])
    written = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(out) for f in files)
    print(f"peak RSS {peak_kib / 1024:.0f} MiB (after imports {before_kib / 1024:.0f}), "
          f"wrote {written / 2**20:.0f} MiB")
    assert written > 10**9
    assert (peak_kib - before_kib) * 1024 < 0.6 * written  # measured: 540 MiB for 1239 MiB written
