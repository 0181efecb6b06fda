"""benchmarks/paper: the paper's evaluation in one command; --quick checks the code path on tiny graphs."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _paper(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks.paper", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.slow
def test_quick_writes_each_figure_with_the_papers_numbers_beside_ours(tmp_path):
    pytest.importorskip("matplotlib")
    result = _paper("--quick", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    for figure in ("fig9", "fig10"):
        assert (tmp_path / f"{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "paper_vs_ours.md").read_text()
    assert result.stdout.endswith(table)  # after the figures' own tables
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    fig10 = [r for r in rows if r[0] == "| 10"]
    assert len(fig10) == 6 * 3  # the paper's six policies at its three sizes
    # Fig. 9: per policy (hybrid, rr) and size (the paper's three and 0.75%), three hit ratios and a read ratio;
    # the paper's 1.18x beside the hybrid's at 16 GB only
    fig9 = [r for r in rows if r[0] == "| 9"]
    assert len(fig9) == 2 * 4 * 4
    assert [(r[1], r[2]) for r in fig9 if r[3] != "-"] == [
        ("hybrid reads, isolated C / shared (paper: aggregation time)", "16 GB")]
    assert [r[3] for r in fig9 if r[3] != "-"] == ["1.18"]
    # the paper's published hit ratios beside ours: the hybrid's 0.25 / 0.33 / 0.48 at 4 / 8 / 16 GB
    hybrid = [r for r in fig10 if r[1].startswith("H2 ")]
    assert [(r[2], r[3]) for r in hybrid] == [("4 GB", "0.25"), ("8 GB", "0.33"), ("16 GB", "0.48")]
    assert all(0 <= float(r[4].rstrip(" |")) <= 1 for r in rows if "hit ratio" in r[1])
    # on this trace sharing reads fewer rows than isolated caches of C at every size
    assert all(float(r[4].rstrip(" |")) >= 1 for r in fig9 if "reads" in r[1])
    # Fig. 11: PVP's hit ratios and its speedup with 2 SSDs beside ours, and our two comparisons
    assert (tmp_path / "fig11.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig11 = {(r[1], r[2]): (r[3], float(r[4].rstrip(" |"))) for r in rows if r[0] == "| 11"}
    assert len(fig11) == 7 * 3
    assert fig11[("hybrid+PVP hit ratio", "16 GB")][0] == "0.69"
    assert fig11[("hybrid+PVP speedup, same cache (paper: 2 SSDs)", "4 GB")][0] == "1.54"
    assert all(v > 0 for _, v in fig11.values())
    # Fig. 12, on each graph: DistDGL at one shaped link beside both our modes, the paper's best speedups beside
    # ours (on the IGBH-shaped graph the paper has no DistDGL figure: it ran out of memory there)
    fig12 = [r for r in rows if r[0] == "| 12"]
    assert [(r[1], r[2].split("link")[0].split("one")[0], r[3]) for r in fig12] == [
        ("speedup over DistDGL (LSM-GNN)", "", "3.75"), ("speedup over DistDGL (M-GIDS)", "", "-"),
        ("speedup over M-GIDS (isolated caches)", "", "1.54"),
        ("speedup over DistDGL (LSM-GNN)", "IGBH-shaped, ", "-"), ("speedup over DistDGL (M-GIDS)", "IGBH-shaped, ", "-"),
        ("speedup over M-GIDS (isolated caches)", "IGBH-shaped, ", "1.54")]
    for name, model in (("fig12", "sage"), ("fig12_igbh", "r-sage")):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["config"]["model"] == model
        (dd,) = result["distdgl"]
        assert dd["rate_mbit"] > 0 and dd["link_mbit_s"] < 1.25 * dd["rate_mbit"]  # tc shaped the link
        # the same seeds in batches of the same size on every side: as many iterations per rank
        iterations = {dd["iterations"], *(result["ours"][m]["iterations"] for m in ("shared", "isolated"))}
        assert len(iterations) == 1 and iterations.pop() > 1, name
        assert 0 < dd["test_accuracy"] <= 1 and result["ours"]["shared"]["hit_ratio"] > 0
    assert json.loads((tmp_path / "fig12_igbh.json").read_text())["graph"]["target"] == "paper"


def test_an_unknown_figure_is_refused_naming_those_done():
    result = _paper("--quick", "--out", "unused", "--figures", "13")
    assert result.returncode == 2 and "--figures: 13; the figures done so far: 9, 10, 11, 12" in result.stderr


def test_an_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("mine")
    result = _paper("--quick", "--out", str(tmp_path / "f"))
    assert result.returncode == 2 and "is a file; give a directory" in result.stderr
    assert (tmp_path / "f").read_text() == "mine"


@pytest.mark.slow
def test_igb_medium_quick_plans_and_measures_the_slice_under_its_cap(tmp_path, memory_cap):
    memory_cap(1 << 30).close()  # skipped, with the reason, where no memory cgroup can be made
    result = subprocess.run([sys.executable, "-m", "benchmarks.paper.igb_medium", "--quick", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((tmp_path / "igb_medium.json").read_text())
    measured, planned = out["measured"], out["predicted_slice"]
    assert measured["iterations"] == planned["modelled_iterations"] == 20
    assert 0 < measured["peak_bytes"] <= measured["cap_bytes"] and not measured["oom_killed"]
    # the planner replays the run's own batches through the same cache: the same hits, whatever the timing
    assert planned["hit_ratio"] == pytest.approx(measured["hit_ratio"], abs=0.02)
    assert out["predicted_epoch"]["run_iterations"] > 20
    assert "data.verify=sampled" in out["overrides"]
    log = (tmp_path / "igb_medium_run.log").read_text()
    assert "epoch" in log and "IGB_MEDIUM_RESULT" in log
    metrics = [json.loads(line) for line in (tmp_path / "igb_medium_metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics if "iteration" in m] == list(range(20))
    assert metrics[-2]["epoch_summary"]["iterations"] == 20
    # nothing else left beside the figures but the quick graph
    assert sorted(p.name for p in tmp_path.iterdir()) == ["igb-medium-quick", "igb_medium.json",
                                                           "igb_medium_metrics.jsonl", "igb_medium_run.log"]


@pytest.mark.slow
@pytest.mark.beside  # 20 s: .ci/run's two jobs come out even with it beside the suite
def test_igb_medium_whole_epoch_measures_every_iteration_beside_the_one_plan(tmp_path, memory_cap):
    memory_cap(1 << 30).close()
    result = subprocess.run([sys.executable, "-m", "benchmarks.paper.igb_medium", "--quick", "--whole-epoch",
                             "--set", "sampler.batch_size=1024", "--set", "cache.capacity=100%", "--out",
                             str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((tmp_path / "igb_medium.json").read_text())
    measured, planned = out["measured"], out["predicted_slice"]
    assert out["whole_epoch"] and out["predicted_epoch"] == planned
    assert measured["iterations"] == planned["run_iterations"] == planned["modelled_iterations"] > 1
    assert not any(o.startswith("train.max_iterations") for o in out["overrides"])
    assert "measured, the whole epoch" in result.stdout and "the slice" not in result.stdout


def test_igb_medium_refuses_a_cap_over_a_quarter_of_the_feature_file(tmp_path):
    from lsm_gnn.data.synthetic import generate_synthetic

    generate_synthetic(str(tmp_path / "g"), num_nodes=2000, avg_degree=4, feature_dim=8, seed=0)  # 64 KB features
    result = subprocess.run([sys.executable, "-m", "benchmarks.paper.igb_medium", "--data", str(tmp_path / "g"),
                             "--cap", "1M", "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode != 0 and "more than a quarter of the feature file" in result.stderr
    assert not (tmp_path / "o" / "igb_medium.json").exists()


def test_fig9_counts_a_row_both_ranks_miss_as_one_read_and_bounds_it_with_min():
    """Both ranks asking the same ids: one cache of 2C fed their union is each rank's private 2C cache, so the
    hit ratios are equal and the union's storage reads half theirs, in the policy's count and in MIN's."""
    import numpy as np

    from benchmarks.paper import fig9

    rng = np.random.default_rng(0)
    stream = [np.unique(rng.zipf(1.3, 60) % 500) for _ in range(40)]
    result = fig9.simulate([stream, stream], 500, 64, ["hybrid"], window=4, warmup=4, end=30, static=None)
    merged, private = result["hybrid"]["merged 2C"], result["hybrid"]["isolated 2C"]
    assert 0 < merged["hit_ratio"] == private["hit_ratio"] < 1
    assert merged["reads_per_iteration"] == private["reads_per_iteration"] / 2
    bound = result["MIN"]
    assert (bound["shared 2C, fully associative"]["reads_per_iteration"]
            == bound["isolated 2C, fully associative"]["reads_per_iteration"] / 2)
    assert bound["shared 2C, fully associative"]["reads_per_iteration"] <= merged["reads_per_iteration"]
    # every id at every iteration, reused one iteration later: one line per id kept
    assert fig9.near_lines([np.array([1, 2])] * 5, (0, 1, 2), start=1, end=4) == {0: 0.0, 1: 2.0, 2: 2.0}


def test_fig11_reads_every_miss_from_disk_and_pvp_only_turns_reads_into_hits(tmp_path):
    """Fig. 11's measurement: the caches' misses are real reads of 4 KiB rows (the file's bytes, each miss once),
    and PVP with reinstall leaves the cache's own hits as they are, serving some of its misses from the queues."""
    import numpy as np
    import torch

    from benchmarks import pvp
    from benchmarks.paper.fig11 import rows_on_disk

    num_nodes, window = 2000, 8
    from lsm_gnn.storage import open_storage

    storage = open_storage(rows_on_disk(str(tmp_path / "rows.bin"), num_nodes, pvp.FEATURE_ROW_BYTES), "auto")
    ids = torch.tensor([5, 1999, 0, 5])
    assert torch.equal(storage.read(ids), ids[:, None].float().expand(4, 1024))  # row i holds i
    rng = np.random.default_rng(0)
    trace = [torch.from_numpy(np.unique(rng.zipf(1.3, 60) % num_nodes)) for _ in range(40 + window)]
    static = np.zeros(num_nodes)
    plain, with_pvp = (pvp.run(trace, num_nodes, "farthest", mode, 1, window, 4, 4, static, 8, storage=storage)
                       for mode in ("off", "reinstall"))
    for r in (plain, with_pvp):
        assert r["disk_bytes_read"] == r["rows_read"] * pvp.FEATURE_ROW_BYTES > 0
        assert 0 < r["read_seconds"] < r["measured_seconds"]
    assert with_pvp["cache_hit_ratio"] == plain["cache_hit_ratio"] and with_pvp["pvp_hits"] > 0
    assert with_pvp["rows_read"] == plain["rows_read"] - with_pvp["pvp_hits"]
    storage.close()


@pytest.mark.parametrize("missing, reason", [
    ("namespaces", "network namespaces need root"),
    ("dgl", "dgl 2.0.0 is installed; the baseline is dgl==1.1.3: pip install --no-deps dgl==1.1.3"),
])
def test_fig12_refuses_with_the_reason_where_it_cannot_run(monkeypatch, tmp_path, missing, reason):
    from benchmarks.paper import fig12
    from lsm_gnn.testing import virtual_hosts

    monkeypatch.setattr(virtual_hosts, "unavailable", lambda: reason if missing == "namespaces" else None)
    if missing == "dgl":
        monkeypatch.setitem(sys.modules, "dgl", type(sys)("dgl"))
        sys.modules["dgl"].__version__ = "2.0.0"
    monkeypatch.setattr(fig12.shutil, "which", lambda name: "/usr/sbin/" + name)
    with pytest.raises(RuntimeError, match="Fig. 12 cannot run here: " + reason.replace(".", r"\.")):
        fig12.run(str(tmp_path), quick=True)
    assert not list(tmp_path.iterdir())  # refused before any work


def test_fig12_rows_are_distdgl_time_over_ours_at_each_link():
    from benchmarks.paper import fig12

    result = {"ours": {"shared": {"epoch_s": 10.0}, "isolated": {"epoch_s": 15.0}},
              "distdgl": [{"epoch_s": 30.0, "link_over_ssd": 0.5}, {"epoch_s": 12.0, "link_over_ssd": 8.0}]}
    got = [(r["what"], r["size"], r["paper"], r["ours"]) for r in fig12.rows(result)]
    assert got == [("speedup over DistDGL (LSM-GNN)", "link/SSD 0.50", 3.75, 3.0),
                   ("speedup over DistDGL (M-GIDS)", "link/SSD 0.50", None, 2.0),
                   ("speedup over DistDGL (LSM-GNN)", "link/SSD 8.00", 3.75, 1.2),
                   ("speedup over DistDGL (M-GIDS)", "link/SSD 8.00", None, 0.8),
                   ("speedup over M-GIDS (isolated caches)", "one host", 1.54, 1.5)]
    # on a heterogeneous graph the paper's DistDGL ran out of memory: no published speedup over it beside ours
    hetero = [(r["size"], r["paper"]) for r in fig12.rows(result, "IGBH-shaped, ")]
    assert hetero == [("IGBH-shaped, link/SSD 0.50", None), ("IGBH-shaped, link/SSD 0.50", None),
                      ("IGBH-shaped, link/SSD 8.00", None), ("IGBH-shaped, link/SSD 8.00", None),
                      ("IGBH-shaped, one host", 1.54)]


def test_fig12_refuses_a_graph_it_does_not_know(tmp_path, monkeypatch):
    from benchmarks.paper import fig12

    monkeypatch.setattr(fig12, "unavailable", lambda: None)
    with pytest.raises(ValueError, match="Fig. 12's graphs are igb, igbh; got mag"):
        fig12.run(str(tmp_path), quick=True, graphs=("igb", "mag"))
    assert not list(tmp_path.iterdir())


def test_fig12_medians_pair_each_setting_over_repeats():
    from benchmarks.paper import fig12

    def repeat(shared, dd):
        return {"ours": {"shared": {"epoch_s": shared}},
                "distdgl": [{"epoch_s": e, "link_over_ssd": x, "iterations": 5} for e, x in dd],
                "ratios_run": [None, 1.0], "skipped_ratios": [4.0]}

    got = fig12.medians([repeat(10.0, [(50.0, 3.9), (29.0, 0.9)]), repeat(12.0, [(30.0, 3.7), (31.0, 1.1)]),
                         repeat(11.0, [(40.0, 3.8), (33.0, 1.0)])])
    assert got["ours"]["shared"]["epoch_s"] == 11.0 and got["ours"]["shared"]["epoch_s_each"] == [10.0, 12.0, 11.0]
    assert [(d["epoch_s"], d["link_over_ssd"], d["iterations"]) for d in got["distdgl"]] == [(40.0, 3.8, 5),
                                                                                           (31.0, 1.0, 5)]
    assert got["skipped_ratios"] == [4.0] and got["ratios_run"] == [None, 1.0]


def test_distdgl_takes_a_typed_graph_as_its_csrs_and_files_and_trains_r_sage_on_it(tmp_path):
    pytest.importorskip("dgl")
    import numpy as np
    import torch

    from benchmarks import distdgl
    from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic

    ds = generate_hetero_synthetic(str(tmp_path / "h"), num_papers=300, feature_dim={"paper": 8, "author": 4,
                                                                                   "institute": 4, "fos": 2},
                                   progress=False)
    g, num_classes, target = distdgl.to_dgl_graph(ds.path)
    assert (num_classes, target) == (ds.num_classes("paper"), "paper")
    for relation in ds.relations:  # row v of a relation's CSR: the sources of v's in-edges
        indptr, indices = (np.asarray(a) for a in ds.csr(relation))
        src, dst = (e.numpy() for e in g.in_edges(np.arange(ds.num_nodes_of(relation[2])), etype=relation))
        assert sorted(zip(dst, src)) == sorted(zip(np.repeat(np.arange(len(indptr) - 1), np.diff(indptr)), indices))
    for t in ds.node_types:
        ids = np.arange(ds.num_nodes_of(t))
        assert torch.equal(g.nodes[t].data["feat"], torch.from_numpy(ds.node_type(t).read_features_direct(ids)))
    assert g.nodes["paper"].data["train_mask"].nonzero().flatten().tolist() == sorted(ds.split("train", "paper"))
    in_dims = {t: g.nodes[t].data["feat"].shape[1] for t in g.ntypes}
    layers, forward = distdgl.relational_sage(in_dims, g.canonical_etypes, "paper", 16, num_classes, 2)
    seeds = {"paper": torch.arange(10)}
    inputs, _, blocks = __import__("dgl").dataloading.NeighborSampler([2, 3]).sample_blocks(g, seeds)
    logits = forward(blocks, {t: g.nodes[t].data["feat"][i] for t, i in inputs.items()})
    assert logits.shape == (10, num_classes)
    logits.sum().backward()
    assert layers[-1]["convs"]["author__writes__paper"].fc_neigh.weight.grad.abs().sum() > 0
    featureless = generate_hetero_synthetic(str(tmp_path / "f"), num_papers=300, progress=False,
                                            feature_dim={"paper": 8, "author": 4, "institute": 0, "fos": 2})
    with pytest.raises(ValueError, match=r"node types \['institute'\] .* have no features"):
        distdgl.to_dgl_graph(featureless.path)


def test_fig12_step_times_the_same_function_on_both_sides(tmp_path):
    # our hops as DGL blocks, our weights in DGL's layers: the same logits, so the step benchmark compares layers
    pytest.importorskip("dgl")
    import torch

    from benchmarks.paper import fig12_step
    from lsm_gnn.data.synthetic import generate_synthetic

    generate_synthetic(str(tmp_path / "g"), num_nodes=3000, feature_dim=1024, seed=0, progress=False)
    (hops, x, y), = fig12_step.batches(str(tmp_path / "g"), 1, 16)
    model, forward, _ = fig12_step.ours(1024, 32, 8)
    layers, dgl_forward, blocks = fig12_step.distdgl(1024, 32, 8)
    with torch.no_grad():
        for conv, layer in zip(model.convs, layers):
            layer.fc_neigh.weight.copy_(conv.lin_l.weight)
            layer.fc_self.bias.copy_(conv.lin_l.bias)
            layer.fc_self.weight.copy_(conv.lin_r.weight)
        assert torch.allclose(forward(hops, x), dgl_forward(blocks(hops), x), atol=1e-4)


def test_distdgl_r_sage_is_our_hetero_model_given_its_weights(tmp_path):
    # our typed hops as DGL blocks, our HeteroHopGNN's weights in DistDGL's R-SAGE: the same logits, so Fig. 12
    # trains the same function on both sides of the heterogeneous graph
    pytest.importorskip("dgl")
    from types import SimpleNamespace

    import dgl
    import torch

    from benchmarks import distdgl
    from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic
    from lsm_gnn.models import HeteroHopGNN
    from lsm_gnn.sampling import NeighborSampler

    ds = generate_hetero_synthetic(str(tmp_path / "h"), num_papers=400, feature_dim=16, progress=False)
    hops = NeighborSampler(ds, [3, 2, 2]).sample({"paper": torch.arange(12)}, 0)
    x = {t: torch.from_numpy(ds.node_type(t).read_features_direct(hops[-1].nodes[t].numpy()))
         for t in ds.node_types}
    torch.manual_seed(0)
    ours = HeteroHopGNN("sage", {t: 16 for t in ds.node_types}, ds.relations, "paper", 8, 5, num_layers=3)
    layers, forward = distdgl.relational_sage({t: 16 for t in ds.node_types}, ds.relations, "paper", 8, 5, 3)
    with torch.no_grad():
        for conv, skip, layer in zip(ours.convs, ours.skips, layers):
            for relation, rc in conv.convs.items():
                theirs = layer["convs"]["__".join(relation)]
                theirs.fc_neigh.weight.copy_(rc.lin_l.weight)
                theirs.fc_self.bias.copy_(rc.lin_l.bias)
                theirs.fc_self.weight.copy_(rc.lin_r.weight)
            for t, linear in skip.items():
                layer["skips"][t].load_state_dict(linear.state_dict())
        blocks = [dgl.create_block({r: (e[0], e[1]) for r, e in hop.edge_index.items()},
                                   num_src_nodes=hop.num_src, num_dst_nodes=hop.num_dst) for hop in reversed(hops)]
        want = ours(SimpleNamespace(hops=hops, x=x))
        assert want.shape == (12, 5)
        assert torch.allclose(forward(blocks, x), want, atol=1e-5)
