"""benchmarks/out_of_core.py over several caps, without running anything: the caps it reads, the order it runs
them in, one record per cap from the runs, where memmap catches up, and the report and plot drawn from them."""
import json
import os

import pytest

from lsm_gnn.testing.benchmarking import load_script

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "out_of_core.py")
GiB = 2**30


@pytest.fixture(scope="module")
def bench():
    return load_script(BENCH)


def test_caps_are_read_in_bytes_and_sorted(bench):
    assert bench.parse_caps("2G, 1G,1.5G") == [GiB, 3 * GiB // 2, 2 * GiB]
    assert bench.parse_caps("512M") == [512 * 2**20]


@pytest.mark.parametrize("text, says", [("", "--caps is empty: give one or more"),
                                        (" , ", "--caps is empty: give one or more"),
                                        ("1G,,2G", "empty item: separate the limits by single commas"),
                                        ("1G,lots", "cannot read 'lots' as a memory limit; use sizes like"),
                                        ("0,1G", "above zero, e.g. 512M"), ("1G,1024M", "twice .*give each cap once")])
def test_bad_caps_are_refused_with_the_fix(bench, text, says):
    with pytest.raises(ValueError, match=says):
        bench.parse_caps(text)


def test_cap_and_caps_are_one_option(bench):
    one, same = bench.parse_args(["--cap", "1G"]), bench.parse_args(["--caps", "1G"])
    assert one.caps_bytes == same.caps_bytes == [GiB] and one.cap_bytes == GiB
    several = bench.parse_args(["--caps", "4G,1G,2G"])
    assert several.caps_bytes == [GiB, 2 * GiB, 4 * GiB] and several.cap_bytes == GiB  # the headline: the smallest
    assert len(bench.parse_args([]).caps_bytes) > 1 and len(bench.parse_args(["--quick"]).caps_bytes) == 2
    assert bench.parse_caps(bench.DEFAULT_CAPS)[-1] > 4.5e6 * 1024  # the default file (4.5M rows of 1 KiB) fits


def test_a_bad_cap_on_the_command_line_exits_naming_it(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--caps", "1G,big"])
    assert "cannot read 'big'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--methods", ","])
    assert "--methods is empty" in capsys.readouterr().err


def test_plot_without_matplotlib_fails_before_measuring(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "plotting_available", lambda: "No module named 'matplotlib'")
    with pytest.raises(SystemExit):
        bench.parse_args(["--plot", "curve.png"])
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "pip install matplotlib" in err and "--from-json" in err


def test_schedule_rotates_the_methods_at_every_cap_and_runs_the_ceiling_once_a_repeat(bench):
    methods, caps = ["hybrid", "storage", "memmap", "memory"], [GiB, 2 * GiB]
    order = bench.schedule(methods, caps, repeats=3)
    for rep in range(3):
        mine = [(cap, m) for r, cap, m in order if r == rep]
        assert sorted(mine, key=str) == sorted([(c, m) for c in caps for m in methods[:3]] + [(None, "memory")],
                                               key=str)
        assert [cap for cap, _ in mine if cap is not None] == sorted(cap for cap, _ in mine if cap is not None)
    firsts = {[m for r, cap, m in order if r == rep and cap == 2 * GiB][0] for rep in range(3)}
    assert firsts == {"hybrid", "storage", "memmap"}  # no method always runs first
    assert [m for _, _, m in bench.schedule(methods, [GiB], 1)] == methods  # one cap: as before several


def fake_run(method, cap, repeat, ms, iterations=10):
    return {"method": method, "cap_bytes": None if method == "memory" else cap, "repeat": repeat, "failed": False,
            "oom_killed": False, "capped": method != "memory", "peak_bytes": 300 << 20, "iterations": iterations,
            "wall_s": ms * iterations / 1e3, "stages_s": {k: 0.001 * iterations for k in ("sample", "gather", "wait",
                                                                                               "train")},
            "hit_ratio": 0.5 if method == "hybrid" else None, "feature_bytes_read": 1 << 20,
            "device_bytes_read": 2 << 20, "process_peak": {"rss_anon": 200 << 20},
            "storage_read_s": 0.001 * iterations, "loss": 0.5, "features": method}


def fake_result(bench, memmap_ms):
    """Two repeats at each cap: hybrid 10 ms/it, storage 30, memmap as given per cap, memory 5."""
    caps = [GiB * k for k in range(1, len(memmap_ms) + 1)]
    runs = [fake_run("memory", None, rep, 5) for rep in range(2)]
    for rep in range(2):
        for cap, mm in zip(caps, memmap_ms):
            runs += [fake_run("hybrid", cap, rep, 10), fake_run("storage", cap, rep, 30),
                     fake_run("memmap", cap, rep, mm, iterations=2 if mm > 100 else 10)]
    methods = ["hybrid", "storage", "memmap", "memory"]
    records = bench.curve(runs, caps, methods, file_bytes=int(2.5 * GiB))
    return {"settings": {"methods": methods, "repeats": 2}, "curve": records, "crossover": bench.crossover(records),
            "dataset": {"num_nodes": 1000, "feature_file_bytes": int(2.5 * GiB)}}


def test_one_record_per_cap_with_paired_ratios(bench):
    result = fake_result(bench, [5000, 400, 20, 8])
    records = result["curve"]
    assert [r["cap_bytes"] for r in records] == [GiB, 2 * GiB, 3 * GiB, 4 * GiB]
    assert [r["cap"] for r in records] == ["1.0 GiB", "2.0 GiB", "3.0 GiB", "4.0 GiB"]
    assert records[0]["file_over_cap"] == pytest.approx(2.5)
    for rec, memmap_ms in zip(records, [5000, 400, 20, 8]):
        assert set(rec["summary"]) == {"hybrid", "storage", "memmap", "memory"}
        assert rec["summary"]["memory"]["repeats"] == 2 and not rec["summary"]["memory"]["capped"]  # shared
        assert rec["summary"]["memmap"]["ms_per_iter"] == pytest.approx(memmap_ms)
        assert rec["ratios"]["hybrid_speedup_vs_memmap"]["per_repeat"] == pytest.approx([memmap_ms / 10] * 2)
        assert rec["ratios"]["hybrid_speedup_vs_storage"]["median"] == pytest.approx(3)
        assert rec["ratios"]["hybrid_slowdown_vs_memory"]["median"] == pytest.approx(2)
    assert records[0]["summary"]["memmap"]["stages_ms_per_iter"]["train"] == pytest.approx(1)  # per its own runs
    assert json.loads(json.dumps(records)) == records


def test_crossover_names_the_caps_around_it(bench):
    result = fake_result(bench, [5000, 400, 20, 8])
    cross = result["crossover"]
    assert cross["ours_faster_up_to"] == "3.0 GiB" and cross["peer_at_least_as_fast_from"] == "4.0 GiB"
    assert ("between 3.0 GiB, where hybrid is 2x faster, and 4.0 GiB, where hybrid runs at 0.8x memmap's speed"
            in cross["sentence"])
    never = fake_result(bench, [5000, 400])["crossover"]
    assert never["peer_at_least_as_fast_from"] is None and "never catches up" in never["sentence"]
    always = fake_result(bench, [9, 8])["crossover"]
    assert always["ours_faster_up_to"] is None and "at every cap" in always["sentence"]
    # a dip below 1 that does not last is no crossover: memmap must stay at least as fast up to the largest cap
    dip = fake_result(bench, [5000, 9, 20])["crossover"]
    assert dip["peer_at_least_as_fast_from"] is None and dip["ours_faster_up_to"] == "3.0 GiB"
    assert bench.crossover([{"cap": "1.0 GiB", "ratios": {}}]) is None


def test_the_verdict_shows_how_far_the_repeats_spread(bench):
    records = [{"cap": "4.0 GiB", "ratios": {"hybrid_speedup_vs_memmap": {"per_repeat": [1.83, 1.1, 0.68],
                                                                         "median": 1.1}}}]
    assert bench.crossover(records)["sentence"] == ("memmap never catches up with hybrid: at the largest cap, "
                                                    "4.0 GiB, hybrid is still 1.1x faster (0.68-1.8x per repeat)")


def test_report_prints_every_cap_and_the_curve(bench, capsys):
    bench.report(fake_result(bench, [5000, 400, 20, 8]))
    out = capsys.readouterr().out
    assert out.count("-- cap ") == 4 and "memmap/hybrid" in out and "500x" in out and "catches up" in out


def test_plot_writes_a_png(bench, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "curve.png"
    bench.plot_curve(fake_result(bench, [5000, 400, 20, 8]), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_result_without_a_curve_is_refused_with_the_reason(bench, tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"summary": {}, "ratios": {}}))
    with pytest.raises(SystemExit, match="no 'curve'"):
        bench.load_result(str(old))
