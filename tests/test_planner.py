"""lsm-gnn plan: the model's rules on hand-made numbers, the simulation against a real run, the CLI."""
import json

import pytest

from lsm_gnn.cli import main
from lsm_gnn.config import load_config
from lsm_gnn.planner import (StageMs, bound_stage, contended_ms, make_plan, pipeline_ms, recommend, run_ms,
                             steady_ms)
from lsm_gnn.testing import write_tiny_dataset
from lsm_gnn.training.trainer import Trainer

RUN = ["sampler.fanouts=[4,3]", "sampler.batch_size=16", "model.kind=sage", "model.hidden=16", "cache.window=4",
       "cache.static_score=none", "train.eval_splits=[]", "log.progress=false", "cache.backend=pread"]


# -- the model ------------------------------------------------------------------------------------------------

def test_the_slower_thread_sets_the_pace_with_enough_cores():
    s = StageMs(sample=1.0, cache=2.0, read=10.0, train=5.0)
    assert steady_ms(s, cores=8, train_threads=2) == 13.0  # 1 + 2 + 10: the loader
    assert bound_stage(s, cores=8, train_threads=2) == "read"
    fast_loader = StageMs(sample=1.0, cache=2.0, read=1.0, train=5.0)
    assert steady_ms(fast_loader, cores=8, train_threads=2) == 5.0
    assert bound_stage(fast_loader, cores=8, train_threads=2) == "train"
    assert bound_stage(StageMs(sample=9.0, cache=2.0, read=1.0, train=5.0), 8, 2) == "sample"
    assert bound_stage(StageMs(sample=1.0, cache=9.0, read=1.0, train=5.0), 8, 2) == "cache"


def test_threads_competing_for_cores_lose_each_others_cpu_time():
    s = StageMs(sample=1.0, cache=3.0, read=4.0, train=10.0, read_cpu=2.0)  # loader CPU 1 + 3 + 2 = 6
    assert s.loader_cpu == 6.0
    # One core: all CPU work adds up on the training side; the loader loses what it overlaps.
    assert contended_ms(s, cores=1, train_threads=1) == (16.0, 14.0)
    # Two cores, training on both: three threads on two cores lose half of the other's CPU time.
    assert contended_ms(s, cores=2, train_threads=2) == (13.0, 11.0)
    # Enough cores: nothing lost.
    assert contended_ms(s, cores=4, train_threads=2) == (10.0, 8.0)
    assert steady_ms(s, cores=2, train_threads=2) == 13.0
    with pytest.raises(ValueError, match="cores"):
        steady_ms(s, cores=0)


def test_the_pipeline_hides_a_slow_loader_iteration_only_as_far_as_its_queue_reaches():
    # Steady loader at 2 ms, training at 5: training never waits after the first batch.
    assert pipeline_ms([5.0] * 4, [2.0] * 4, queue=2) == 2.0 + 4 * 5.0
    # Loader slower than training: its pace, plus the last step.
    assert pipeline_ms([1.0] * 4, [3.0] * 4, queue=2) == 4 * 3.0 + 1.0
    # One 8 ms loader iteration among 1 ms ones, training at 3 ms: the queue absorbs part of it.
    spiky = pipeline_ms([3.0] * 6, [1.0, 1.0, 1.0, 8.0, 1.0, 1.0], queue=2)
    assert max(sum([1.0] * 6) / 6, 3.0) * 6 < spiky < 1.0 + sum(max(3.0, x) for x in [1.0, 1.0, 1.0, 8.0, 1.0, 1.0])
    assert pipeline_ms([3.0] * 6, [1.0, 1.0, 1.0, 8.0, 1.0, 1.0], queue=1) >= spiky  # a shorter queue hides less
    assert pipeline_ms([5.0], [2.0], queue=2, start_ms=10.0) == 17.0
    with pytest.raises(ValueError, match="queue"):
        pipeline_ms([1.0], [1.0], queue=0)


def test_run_time_adds_one_window_fill_per_epoch_started():
    s = StageMs(sample=1.0, cache=1.0, read=1.0, train=5.0)
    one = run_ms([s] * 10, 8, 1, window=4, fill_sample_ms=2.0, epoch_length=100)
    assert one == 4 * 2.0 + 3.0 + 10 * 5.0  # fill, the first batch's loader time, ten steps
    two = run_ms([s] * 10, 8, 1, window=4, fill_sample_ms=2.0, epoch_length=6)
    assert two == 2 * (4 * 2.0 + 3.0) + 10 * 5.0


def test_read_ahead_overlaps_the_reads_with_the_loaders_other_work():
    serial = StageMs(sample=1.0, cache=3.0, read=10.0, train=5.0)
    ahead = StageMs(sample=1.0, cache=3.0, read=10.0, train=5.0, read_ahead=True)
    assert serial.loader == 14.0 and ahead.loader == 10.0  # the reads hide the sampling and the cache's work
    assert StageMs(sample=6.0, cache=7.0, read=10.0, train=5.0, read_ahead=True).loader == 13.0
    assert ahead.loader_cpu == serial.loader_cpu  # the same CPU work, only overlapped
    assert steady_ms(ahead, 8, 1) == 10.0 and bound_stage(ahead, 8, 1) == "read"
    # Two cores, training on both: training slows the loader's CPU work (by half the 4 ms it has), not its reads.
    assert contended_ms(ahead, 2, 2) == (5.0 + 0.5 * 4.0, 10.0)
    cpu_bound = StageMs(sample=4.0, cache=4.0, read=9.0, train=10.0, read_ahead=True)
    assert contended_ms(cpu_bound, 2, 2) == (10.0 + 0.5 * 8.0, 4.0 + 4.0 + 0.5 * 8.0)


def test_node_embeddings_read_and_update_between_two_steps_overlapped_with_nothing():
    # The update follows the step on training's thread; the next batch's rows are read only after it, on the
    # loader's: the iteration is the slower thread's other work plus the read.
    s = StageMs(sample=1.0, cache=1.0, read=2.0, train=5.0, embedding=4.0, update=2.0)
    assert contended_ms(s, cores=8, train_threads=2) == (5.0 + 2.0 + 4.0, 4.0 + 4.0)
    assert steady_ms(s, 8, 2) == 11.0 and bound_stage(s, 8, 2) == "embedding"  # 4 + 2 over the step's 5
    assert bound_stage(StageMs(sample=1.0, cache=1.0, read=2.0, train=5.0, embedding=2.0, update=2.0), 8, 2) == "train"
    slow_loader = StageMs(sample=1.0, cache=1.0, read=9.0, train=5.0, embedding=4.0, update=2.0)
    assert steady_ms(slow_loader, 8, 2) == 11.0 + 4.0 and bound_stage(slow_loader, 8, 2) == "read"


def test_recommendation_is_the_smallest_cache_within_tolerance():
    rows = [{"capacity_bytes": 100, "ms_per_iteration": 20.0}, {"capacity_bytes": 200, "ms_per_iteration": 10.4},
            {"capacity_bytes": 400, "ms_per_iteration": 10.0}, {"capacity_bytes": 800, "ms_per_iteration": 10.1}]
    assert recommend(rows, 0.05)["capacity_bytes"] == 200
    assert recommend(rows, 0.0)["capacity_bytes"] == 400
    assert recommend([], 0.05) is None


def test_a_run_longer_than_a_plan_models_is_modelled_in_whole_epochs_one_at_least():
    from lsm_gnn.planner.plan import MODELLED_ITERATIONS, modelled_length

    assert modelled_length(46, 23) == 46  # the whole run
    assert modelled_length(2300, 23) == MODELLED_ITERATIONS // 23 * 23  # 43 epochs of 23
    assert modelled_length(5 * 4000, 4000) == 4000  # one epoch, however long: a hit ratio over less reads low


# -- the simulation against a real run --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    # 512 B rows at a 512 B stride: every missed row is one 512 B block.
    return write_tiny_dataset(tmp_path_factory.mktemp("plan") / "ds", num_nodes=600, dim=128, row_alignment=512)[0]


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cal") / "calibration.json")


def quick_plan(cfg, calibration, **grid):
    return make_plan(cfg, iterations=8, calibration_file=calibration, train_steps=2, storage_seconds=0.05,
                     log=lambda m: None, **grid)


# 22 iterations: the last windows of the run reach past the epoch's 23 batches, where the loader's stop.
@pytest.mark.parametrize("policy,pvp,iterations", [("hybrid", False, 8), ("rr", False, 8), ("auto", True, 8),
                                                   ("hybrid", False, 22)])
def test_predicted_hit_ratio_and_bytes_are_the_runs(dataset, calibration, policy, pvp, iterations):
    # Read-ahead off: a run stopped by train.max_iterations has read ahead the misses of the batches after the
    # stop too (its window reaches past it), which the plan, counting the misses of the run, leaves out.
    cfg = load_config(None, [f"dataset={dataset.path}", *RUN, f"train.max_iterations={iterations}",
                             "cache.pvp_queue_capacity=64", f"cache.policy={policy}", f"cache.pvp={str(pvp).lower()}",
                             "cache.capacity=40%", "cache.read_ahead=0"])
    row = make_plan(cfg, iterations=iterations, calibration_file=calibration, train_steps=2, storage_seconds=0.05,
                    log=lambda m: None, sizes=["40%"], policies=[policy], pvp=[pvp])["rows"][0]
    result = Trainer(cfg, out=open("/dev/null", "w")).fit()
    measured = result["history"][0]
    assert row["hit_ratio"] == pytest.approx(measured["hit_ratio"], abs=1e-12)
    assert row["bytes_read"] == measured["bytes_read"]
    assert len(result["history"]) == 1
    assert row["bytes_read"] == row["misses_per_iteration"] * iterations * 512  # misses x bytes per miss
    assert 0 < row["hit_ratio"] < 1


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic

    # Two feature groups: papers and authors share a row format (one cache, one id space over two files),
    # institutes have rows of their own (a second cache); fields of study have no features.
    return generate_hetero_synthetic(tmp_path_factory.mktemp("plan") / "hetero", num_papers=600,
                                     feature_dim={"paper": 64, "author": 64, "institute": 32, "fos": 0},
                                     progress=False)


# 22 iterations: past the window's reach into the epoch's end (23 batches), as for one node type.
@pytest.mark.parametrize("policy,pvp,iterations,score", [("hybrid", False, 8, "none"), ("auto", True, 8, "none"),
                                                         ("hybrid", False, 22, "reverse_pagerank")])
def test_a_heterogeneous_plans_hit_ratios_and_bytes_are_the_runs(hetero, calibration, policy, pvp, iterations, score):
    cfg = load_config(None, [f"dataset={hetero.path}", *RUN, f"train.max_iterations={iterations}",
                             "cache.pvp_queue_capacity=64", f"cache.policy={policy}", f"cache.pvp={str(pvp).lower()}",
                             "cache.capacity=40%", "cache.read_ahead=0", f"cache.static_score={score}"])
    plan = make_plan(cfg, iterations=iterations, calibration_file=calibration, train_steps=2, storage_seconds=0.05,
                     log=lambda m: None, sizes=["40%"], policies=[policy], pvp=[pvp])
    row = plan["rows"][0]
    trainer = Trainer(cfg, out=open("/dev/null", "w"))
    result = trainer.fit()
    measured = result["history"][0]
    assert len(result["history"]) == 1
    assert row["hit_ratio"] == pytest.approx(measured["hit_ratio"], abs=1e-12)
    assert row["bytes_read"] == measured["bytes_read"]
    assert row["rows_by_type"] == measured["rows_by_type"]
    assert row["hit_ratio_by_type"] == pytest.approx(measured["hit_ratio_by_type"], abs=1e-12)
    assert 0 < row["hit_ratio"] < 1 and set(row["hit_ratio_by_type"]) == {"paper", "author", "institute"}
    # the run's caches, one per feature group, with the share of the budget the run gave each
    assert plan["dataset"]["groups"] == [["paper", "author"], ["institute"]]
    assert [g["types"] for g in row["groups"]] == [group.types for group in trainer.features.groups]
    assert [g["capacity_bytes"] for g in row["groups"]] == [group.features.capacity_bytes
                                                            for group in trainer.features.groups]
    assert row["capacity_bytes"] == sum(g["capacity_bytes"] for g in row["groups"])


def test_each_feature_files_reads_cost_at_its_own_calibration():
    from lsm_gnn.planner.plan import stage_times

    train = {"sample_ms": 1.0, "train_ms": 5.0}
    paper = {"fixed_ms": 0.5, "per_read_us": 20.0, "cpu_fraction": 0.5}
    author = {"fixed_ms": 0.25, "per_read_us": 100.0, "cpu_fraction": 0.2}
    one = stage_times({"paper": paper}, train, 2.0, {"paper": 100})
    assert one.read == pytest.approx(0.5 + 2.0) and one.read_cpu == pytest.approx(1.25)
    both = stage_times({"paper": paper, "author": author}, train, 2.0, {"paper": 100, "author": 10})
    assert both.read == pytest.approx(2.5 + 0.25 + 1.0) and both.read_cpu == pytest.approx(1.25 + 0.25)
    # a file the batch reads nothing of costs nothing, not its fixed cost
    assert stage_times({"paper": paper, "author": author}, train, 2.0, {"paper": 100, "author": 0}).read == \
        pytest.approx(2.5)


def test_calibration_is_reused_from_its_file(dataset, calibration):
    cfg = load_config(None, [f"dataset={dataset.path}", *RUN])
    quick_plan(cfg, calibration, sizes=["30%"], policies=["hybrid"], pvp=[False])
    messages = []
    make_plan(cfg, sizes=["30%"], policies=["hybrid"], pvp=[False], iterations=8, calibration_file=calibration,
              train_steps=2, storage_seconds=0.05, log=messages.append)
    assert sum("reused from" in m for m in messages) == 3  # storage, memcpy, training
    with open(calibration) as f:
        older = json.load(f)
    with open(calibration, "w") as f:  # a calibration of an older version is this planner's own: replaced
        json.dump(dict(older, version=older["version"] - 1), f)
    messages.clear()
    make_plan(cfg, sizes=["30%"], policies=["hybrid"], pvp=[False], iterations=8, calibration_file=calibration,
              train_steps=2, storage_seconds=0.05, log=messages.append)
    assert not any("reused from" in m for m in messages)
    with open(calibration) as f:
        assert json.load(f)["version"] == older["version"]


@pytest.mark.parametrize("content", ["{not json", '{"format": "lsm-gnn", "version": 1}', "[1, 2]", b"\xff\xfe"])
def test_a_file_that_is_no_calibration_is_refused_and_left_as_it_is(dataset, tmp_path, capsys, content):
    target = tmp_path / "mine.json"
    (target.write_bytes if isinstance(content, bytes) else target.write_text)(content)
    before = target.read_bytes()
    assert main(["plan", dataset.path, *RUN, "--iterations", "8", "--train-steps", "2", "--storage-seconds", "0.05",
                 "--calibration", str(target)]) == 1
    err = capsys.readouterr().err
    assert "--calibration" in err and str(target) in err and "left as it is" in err and "Traceback" not in err
    assert target.read_bytes() == before


def test_plan_pointed_at_a_datasets_meta_json_leaves_the_dataset_whole(dataset, tmp_path, capsys):
    import shutil

    copy = shutil.copytree(dataset.path, tmp_path / "ds")
    meta = copy / "meta.json"
    before = meta.read_bytes()
    for option in ("--calibration", "--json"):
        assert main(["plan", str(copy), *RUN, "--iterations", "8", "--train-steps", "2", "--storage-seconds", "0.05",
                     "--calibration", str(meta) if option == "--calibration" else "none", *(
                         ["--json", str(meta)] if option == "--json" else [])]) == 1
        err = capsys.readouterr().err
        assert f"{option} {meta}" in err and "left as it is" in err
        assert meta.read_bytes() == before
    from lsm_gnn.data import open_dataset

    assert open_dataset(str(copy)).num_nodes == dataset.num_nodes


# -- the command --------------------------------------------------------------------------------------------

def test_cli_prints_the_table_and_json(dataset, calibration, capsys, tmp_path):
    out_json = tmp_path / "plan.json"
    args = ["plan", dataset.path, *RUN, "--sizes", "1%,40%,70%", "--policies", "hybrid,rr", "--iterations", "8",
            "--train-steps", "2", "--storage-seconds", "0.05", "--calibration", calibration, "--json", str(out_json)]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "policy" in captured.out and "bound" in captured.out and "recommended:" in captured.out
    assert "cannot run" in captured.out  # 1% of 600 nodes holds less than one batch
    assert "calibrating" in captured.err  # progress goes to stderr
    plan = json.loads(out_json.read_text())
    assert plan["written_by"] == "lsm-gnn plan"
    assert main(args) == 0  # its own output is replaced
    plan = json.loads(out_json.read_text())
    assert len(plan["rows"]) == 6
    ok = [r for r in plan["rows"] if "error" not in r]
    assert len(ok) == 4 and all(r["bound"] in ("train", "sample", "cache", "read") for r in ok)
    for r in ok:  # the efficiency a run would report: max(read, train) over the predicted time per iteration
        assert r["bound_ms"] == max(r["stages_ms"]["read"], r["stages_ms"]["train"])
        assert r["pipeline_efficiency"] == pytest.approx(r["bound_ms"] / r["ms_per_iteration"])
    assert plan["recommendation"]["capacity"] in ("40%", "70%")


@pytest.mark.parametrize("extra,message", [
    (["--sizes", "0%"], "cache.capacity"),
    (["--policies", "nope"], "cache.policy"),
    (["cache.features=memory"], "cache.features=cache"),
    (["--storage-seconds", "0"], "storage_seconds"),
    (["cache.backend=memory"], "cache.backend"),
])
def test_cli_errors_are_one_clear_line(dataset, calibration, capsys, extra, message):
    assert main(["plan", dataset.path, *RUN, *extra, "--calibration", calibration]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lsm-gnn: error:") and message in err and "Traceback" not in err


def test_cli_missing_dataset_and_bad_counts(tmp_path, capsys):
    assert main(["plan", f"dataset={tmp_path / 'missing'}"]) == 1
    assert "no such dataset directory" in capsys.readouterr().err
    assert main(["plan"]) == 1
    assert "no dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", str(tmp_path), "--iterations", "0"])


@pytest.fixture(scope="module")
def tiny_hetero(tmp_path_factory):
    from lsm_gnn.testing import write_tiny_hetero_dataset

    return write_tiny_hetero_dataset(tmp_path_factory.mktemp("plan") / "tiny-hetero")


def test_cli_plans_and_plots_a_heterogeneous_dataset(tiny_hetero, calibration, capsys, tmp_path):
    out_json = tmp_path / "plan.json"
    assert main(["plan", tiny_hetero.path, *RUN, "--sizes", "30%,50%,70%", "--iterations", "6", "--train-steps", "2",
                 "--storage-seconds", "0.05", "--calibration", calibration, "--json", str(out_json),
                 "--plot", str(tmp_path / "drawn.png")]) == 0
    out = capsys.readouterr().out
    # its JSON drawn as its --plot drew it (a heterogeneous plan has rows per type, not one row size)
    assert main(["plot", str(out_json), "--out", str(tmp_path / "plotted.png")]) == 0
    png = b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "plotted.png").read_bytes()[:8] == (tmp_path / "drawn.png").read_bytes()[:8] == png
    assert "wrote" in capsys.readouterr().out
    assert "3 node types" not in out and "(paper 600 x 64 B, author 500 x 64 B, topic 30)" in out
    assert "1 cache(s): paper+author" in out and "storage of paper" in out and "storage of author" in out
    assert out.count("hit by type: paper ") == 2 and "recommended:" in out
    # too small for a batch: the group's cache named, the fix in config keys as the run would give it
    assert "cannot run: the cache of paper+author: a batch has" in out and "set cache.capacity=" in out
    plan = json.loads(out_json.read_text())
    assert set(plan["calibration"]["storage_by_type"]) == {"paper", "author"} and "storage" not in plan["calibration"]
    assert [r.get("error") is None for r in plan["rows"]] == [False, True, True]
    for row in plan["rows"][1:]:
        assert set(row["hit_ratio_by_type"]) == {"paper", "author"} and row["groups"][0]["types"] == ["paper", "author"]
        assert sum(row["rows_by_type"].values()) == row["unique_per_iteration"] * 6
        assert sum(row["bytes_read_by_type"].values()) == row["bytes_read"]


@pytest.mark.parametrize("extra,message", [
    (["cache.mode=shared", "cache.owner=hotness"], "cache.owner=hotness is not available for heterogeneous"),
    (["model.kind=gcn"], "model.kind=gcn has no heterogeneous form"),
    (["train.task=link"], "train.task=link needs a dataset of one node type"),
])
def test_what_a_heterogeneous_run_refuses_the_plan_refuses_first(tiny_hetero, capsys, extra, message, tmp_path,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", tiny_hetero.path, *RUN, *extra, "--calibration", "none"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("lsm-gnn: error:") and message in err and "Traceback" not in err
    assert "calibrating" not in err  # refused before any measuring (the task's own check: before the trace too)


def test_work_on_the_loader_thread_returns_or_raises_in_the_caller():
    import threading

    from lsm_gnn.planner.simulate import on_loader_thread

    assert on_loader_thread(lambda: threading.current_thread().name) == "lsm-gnn-plan"
    with pytest.raises(KeyError, match="x"):
        on_loader_thread(lambda: {}["x"])


# -- the validation benchmark, smoke-run ----------------------------------------------------------------------

@pytest.mark.slow
def test_plan_validation_benchmark_runs(tmp_path):
    import os

    from lsm_gnn.testing.benchmarking import load_script

    script = load_script(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "plan_validation.py"))
    out = script.main(["--quick", "--data", str(tmp_path / "data"), "--json", str(tmp_path / "v.json"),
                       "--configs", "1k-hybrid-20%,128B-hybrid-10%"])
    assert out["summary"]["configs"] == 2
    for r in out["results"]:
        assert r["predicted"]["hit_ratio"] == pytest.approx(r["measured"]["hit_ratio"], abs=1e-12)
        assert r["predicted"]["bytes_read"] == r["measured"]["bytes_read"]  # read-ahead off in these runs
        assert r["predicted"]["ms_per_iteration"] > 0 and r["measured"]["ms_per_iteration"] > 0
    assert json.loads((tmp_path / "v.json").read_text())["summary"]["configs"] == 2


# -- trusting a calibration ----------------------------------------------------------------------------------------

def test_a_calibration_is_measured_again_while_its_runs_disagree():
    from lsm_gnn.planner.calibrate import repeated

    steady = iter([10.0, 10.5, 9.8])
    got = repeated(lambda: {"ms": next(steady), "other": 1}, "ms")
    assert got["figures"] == [10.0, 10.5, 9.8] and got["ms"] == 10.0 and got["spread"] == pytest.approx(0.07)
    assert got["other"] == 1 and got["measured_at"] > 0  # the median run's whole record, with when it was taken
    unsteady = iter([10.0, 30.0, 10.2, 10.1, 9.9, 50.0])
    got = repeated(lambda: {"ms": next(unsteady)}, "ms", most=5)
    assert len(got["figures"]) == 5 and got["ms"] == 10.1  # five runs at most; the median still the usual one
    assert got["spread"] == pytest.approx((30.0 - 9.9) / 10.1)


def test_a_plan_says_what_it_should_not_trust():
    from lsm_gnn.planner.calibrate import out_of_range, trust_warnings

    quiet = {"figures": [1.0, 1.05], "spread": 0.05, "other_load": 0.05}
    assert trust_warnings({"storage": quiet, "memcpy": quiet, "train": quiet}) == []
    warnings = trust_warnings({"storage": {**quiet, "figures": [1.0, 2.0], "spread": 1.0},
                               "train": {**quiet, "other_load": 1.2}, "memcpy": quiet})
    assert len(warnings) == 2 and "storage calibration's runs differ by 100%" in warnings[0]
    assert "1.2 core(s) busy while train was calibrated" in warnings[1] and "--recalibrate" in warnings[1]
    assert out_of_range({"memcpy_gb_per_s": 0.3}, {"memcpy_gb_per_s": 9.0}).startswith("the stored calibration's")
    assert out_of_range({"memcpy_gb_per_s": 4.0}, {"memcpy_gb_per_s": 9.0}) is None  # quiet runs vary 2-3x


def test_a_stored_calibration_out_of_physical_range_is_measured_again(dataset, tmp_path):
    from lsm_gnn.planner.plan import format_plan, one_type_view

    cfg = load_config(None, [f"dataset={dataset.path}", *RUN])
    calibration = str(tmp_path / "cal.json")
    plan = one_type_view(quick_plan(cfg, calibration, sizes=["30%"], policies=["hybrid"], pvp=[False]))
    text = format_plan(plan)
    assert "calibration: storage 20" in text and "UTC (runs within" in text  # its date and spread, every plan
    plan["calibration"]["warnings"] = ["the train calibration's runs differ by 40%"]
    assert "\nwarning: the train calibration's runs differ by 40%" in format_plan(plan)
    with open(calibration) as f:
        stored = json.load(f)
    for entry in stored["entries"].values():  # as if measured while another job held the machine
        if "memcpy_gb_per_s" in entry["value"]:
            entry["value"]["memcpy_gb_per_s"] = 1e-3
        entry["value"].update(spread=0.9, figures=[1.0, 1.9])
    with open(calibration, "w") as f:
        json.dump(stored, f)
    messages = []
    plan = make_plan(cfg, sizes=["30%"], policies=["hybrid"], pvp=[False], iterations=8, calibration_file=calibration,
                     train_steps=2, storage_seconds=0.05, log=messages.append)
    assert any("memcpy (0.00 GB/s) is below 20%" in m and "measuring every part again" in m for m in messages)
    assert not any("reused from" in m for m in messages)
    assert plan["calibration"]["memcpy"]["memcpy_gb_per_s"] > 1e-3
    assert all(len(c["figures"]) >= 3 for c in (plan["calibration"]["storage_by_type"]["node"],
                                                 plan["calibration"]["memcpy"], plan["calibration"]["train"]))


# -- plan takes what train takes ------------------------------------------------------------------------------------

#: keys train takes that the plan's training calibration once refused (it turned evaluation off but left what
#: watches it, and dropped the checkpoint directory a node embedding table lives in) or wrote into the user's files
TRAIN_ACCEPTS = [
    ["train.early_stopping.patience=2"],
    ["train.early_stopping.metric=val.accuracy"],
    ["train.early_stopping.metric=test.accuracy", "train.early_stopping.patience=1", "train.early_stopping.mode=max"],
    ["model.node_embedding.dim=8", "checkpoint.dir={tmp}/ck"],
    ["model.node_embedding.dim=8", "model.node_embedding.path={tmp}/table", "checkpoint.dir={tmp}/ck"],
    ["checkpoint.dir={tmp}/ck", "checkpoint.every=1", "train.eval_every=1"],
]


@pytest.mark.parametrize("extra", TRAIN_ACCEPTS, ids=lambda e: e[0].split("=")[0])
def test_the_training_calibration_takes_every_config_train_takes_and_writes_none_of_its_files(dataset, tmp_path,
                                                                                              extra):
    from lsm_gnn.planner.calibrate import measure_training

    extra = [e.format(tmp=tmp_path) for e in extra]
    cfg = load_config(None, [f"dataset={dataset.path}", *RUN, "train.eval_splits=[val,test]", *extra])
    assert measure_training(cfg, dataset, steps=1, skip=0)["steps"] == 1
    assert list(tmp_path.iterdir()) == []  # no checkpoint, no table, no log of the user's


def test_plan_takes_a_config_with_early_stopping(dataset, calibration, capsys):
    assert main(["plan", dataset.path, *RUN, "train.eval_splits=[val]", "train.early_stopping.patience=3",
                 "--sizes", "40%", "--iterations", "4", "--train-steps", "2", "--storage-seconds", "0.05",
                 "--calibration", calibration]) == 0
    assert "recommended:" in capsys.readouterr().out


#: node embedding tables' plans against their runs: embeddings alone in one epoch; features and a table over two
#: epochs, the checkpoint between them writing the dirty rows (left out of the counts, as the run leaves them); a
#: heterogeneous graph's tables, one per type (author's own; fos without features)
TABLE_RUNS = [("dataset", ["model.node_embedding.features=false", "model.node_embedding.capacity=60%"], 8),
              ("dataset", ["cache.capacity=40%"], 30),
              ("hetero", ["cache.capacity=40%", "model.node_embedding.author.dim=4"], 8)]


@pytest.mark.slow
@pytest.mark.parametrize("graph,extra,iterations", TABLE_RUNS,
                         ids=["embeddings-alone", "features-and-table", "heterogeneous"])
def test_node_embedding_tables_hit_ratio_and_bytes_are_the_runs(request, calibration, tmp_path, graph, extra,
                                                                iterations):
    # Read-ahead off as for the features' cache (the plan counts each read at its lookup); no evaluation: its reads
    # through the table's cache between epochs are left out of the plan.
    cfg = load_config(None, [f"dataset={request.getfixturevalue(graph).path}", *RUN, "model.node_embedding.dim=8",
                             "cache.policy=hybrid", "cache.read_ahead=0", "train.epochs=2",
                             f"train.max_iterations={iterations}", f"checkpoint.dir={tmp_path}", *extra])

    def plan_of(modelled):
        return make_plan(cfg, iterations=modelled, calibration_file=calibration, train_steps=2, storage_seconds=0.05,
                         log=lambda m: None, sizes=["40%"], policies=["hybrid"], pvp=[False])["rows"][0]

    row = plan_of(iterations)
    history = Trainer(cfg, out=open("/dev/null", "w")).fit()["history"]
    assert row["embedding_bytes_read"] == sum(e["embedding_bytes_read"] for e in history) > 0
    assert row["embedding_bytes_written"] == sum(e["embedding_bytes_written"] for e in history)
    assert row["embedding_bytes_written"] > 0 or graph == "hetero"  # its tables' caches hold every row
    first = history[0]
    # the run logs its ratio per epoch: over two, the first epoch's from a plan of it
    epoch = row if len(history) == 1 else plan_of(23)
    assert epoch["embedding_hit_ratio"] == pytest.approx(first["embedding_hit_ratio"], abs=1e-12)
    assert epoch["embedding_bytes_read"] == first["embedding_bytes_read"]
    assert row["bytes_read"] == sum(e["bytes_read"] for e in history)  # the features' cache beside them
    assert all(0 < table["hit_ratio"] < 1 for table in row["embedding"].values())
    assert set(row["embedding"]) == ({"author", "fos"} if graph == "hetero" else {"node"})
    assert row["stages_ms"]["embedding"] > 0 and row["stages_ms"]["update"] > 0


def test_a_plan_of_node_embeddings_prints_and_plots_each_tables_cache(dataset, calibration, tmp_path, capsys):
    plan_json, png = tmp_path / "plan.json", tmp_path / "plan.png"
    assert main(["plan", dataset.path, *RUN, "model.node_embedding.dim=8", "model.node_embedding.features=false",
                 f"checkpoint.dir={tmp_path}", "--sizes", "40%,80%", "--iterations", "4", "--train-steps", "2",
                 "--storage-seconds", "0.05", "--calibration", calibration, "--json", str(plan_json)]) == 0
    out = capsys.readouterr().out
    assert "node embeddings of node: cache" in out and "not modelled" not in out
    rows = json.loads(plan_json.read_text())["rows"]
    # embeddings alone: no features' cache; each row's size is its table's cache's, which grows with the grid
    assert [r["hit_ratio"] for r in rows] == [None, None]
    assert rows[0]["capacity_bytes"] == rows[0]["embedding"]["node"]["capacity_bytes"] < rows[1]["capacity_bytes"]
    assert main(["plot", str(plan_json), "--out", str(png)]) == 0
    assert png.stat().st_size > 0


@pytest.mark.parametrize("extra,length", [(["train.epochs=2"], 46),
                                          (["train.epochs=3", "train.max_iterations=30"], 30)])
def test_a_plan_models_the_runs_own_length_unless_told(dataset, calibration, extra, length):
    from lsm_gnn.planner import format_plan

    # 23 batches of 16 seeds per epoch; the run's length: its epochs, or train.max_iterations where that is less
    cfg = load_config(None, [f"dataset={dataset.path}", *RUN, *extra])
    plan = make_plan(cfg, sizes=["40%"], policies=["hybrid"], pvp=[False], calibration_file=calibration,
                     train_steps=2, storage_seconds=0.05, log=lambda m: None)
    assert plan["run"]["iterations"] == plan["run"]["run_iterations"] == length and plan["run"]["epoch_length"] == 23
    assert f"modelled: the run's {length} iterations" in format_plan(plan)
    told = quick_plan(cfg, calibration, sizes=["40%"], policies=["hybrid"], pvp=[False])  # --iterations 8
    assert told["run"]["iterations"] == 8 and told["run"]["run_iterations"] == length
    assert f"modelled: 8 of the run's {length} iterations" in format_plan(told) and "as --iterations asks" in \
        format_plan(told)


def test_a_trace_the_memory_cannot_hold_is_cut_short_and_said_so(dataset, calibration, monkeypatch):
    from lsm_gnn.planner import format_plan, plan as planning

    # room for the ids of about 10 of the run's 23 batches (169 input nodes each, 8 bytes an id) in the trace's share
    monkeypatch.setattr(planning, "available_memory", lambda: planning.TRACE_SHARE * 10 * 169 * 8)
    cfg = load_config(None, [f"dataset={dataset.path}", *RUN])
    plan = make_plan(cfg, sizes=["40%"], policies=["hybrid"], pvp=[False], calibration_file=calibration,
                     train_steps=2, storage_seconds=0.05, log=lambda m: None)
    run = plan["run"]
    assert run["run_iterations"] == 23 and 4 <= run["iterations"] < 23 and run["trace_memory"] == 10 * 169 * 8
    assert f"modelled: {run['iterations']} of the run's 23 iterations" in format_plan(plan)
    assert "as many as a 1/4 share of the memory available holds in the trace" in format_plan(plan)
