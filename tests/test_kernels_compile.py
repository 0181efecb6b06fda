"""Every Triton kernel compiled by Triton's real NVIDIA compiler, down to cubin for sm_80 and sm_90, with no GPU.

The interpreter tests check what the kernels compute; these check that a GPU can run them at all, for every
specialization the project's own launches produce and their edge variants (lsm_gnn/kernels/aot.py). With
each installed triton: the one torch brought (3.9 here) and, where CI installed it, triton 3.6 (what torch
2.11's CUDA wheels ship, and what the lent GPU machines have) from ``LSM_GNN_TRITON36`` (a pip --target dir).
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from lsm_gnn.kernels.aot import EDGE_STAGE  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRITON36 = os.environ.get("LSM_GNN_TRITON36", os.path.join(ROOT, ".ci", "triton36"))
ARCHS = "80,90"

# Minutes per triton version on 2 cores (a fresh compiler cache); the kernels run in subprocesses, so the
# program-order variants of the other kernel tests have nothing to reorder here. .ci/run runs the module in its
# job beside the suite (one recording of the launches for all its cases).
pytestmark = [pytest.mark.slow, pytest.mark.launches_no_kernel, pytest.mark.beside]


def _python(args, env_extra=None, timeout=900, module="lsm_gnn.kernels.aot"):
    env = dict(os.environ, PYTHONPATH=ROOT, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """The project's own launches, recorded under the interpreter."""
    path = tmp_path_factory.mktemp("aot") / "launches.json"
    result = _python([str(path)], {"TRITON_INTERPRET": "1"}, module="lsm_gnn.testing.kernel_launches")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    recorded = json.loads(path.read_text())["launches"]
    kernels = {launch["kernel"].split(":")[1] for launch in recorded}
    # Every kernel the project launches was exercised (a workload that stopped launching one would hide it).
    assert kernels == {"_find_hits", "_serve_hits", "_install_misses", "_scan", "_victim_queues", "_copy_victims",
                       "_advance_counts", "_claim_first_line", "_take_claims", "_copy_served_rows", "_draw", "_relabel",
                       "_gather_rows", "_held", "_count_flags", "_write_distinct", "_write_segments",
                       "_write_misses", "_rows_by_line"}
    return path


def _triton_versions():
    versions = [pytest.param(None, id="triton-installed")]
    reason = f"triton 3.6 is not installed at {TRITON36} (.ci/run installs it; or set LSM_GNN_TRITON36)"
    missing = not os.path.isdir(os.path.join(TRITON36, "triton"))
    if missing and os.environ.get("LSM_GNN_REQUIRE_TRITON36"):  # CI: never skipped silently
        versions.append(pytest.param(TRITON36, id="triton-3.6"))
    else:
        versions.append(pytest.param(TRITON36, id="triton-3.6", marks=pytest.mark.skipif(missing, reason=reason)))
    return versions


def compile_report(launches, tmp_path, triton_dir, *extra):
    out = tmp_path / "report.json"
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
               PYTHONPATH=f"{triton_dir}{os.pathsep}{ROOT}" if triton_dir else ROOT)
    result = subprocess.run([sys.executable, "-m", "lsm_gnn.kernels.aot", "compile", str(launches), "--arch", ARCHS,
                             "--json", str(out), *extra], capture_output=True, text=True, timeout=900, cwd=ROOT,
                            env=env)
    report = json.loads(out.read_text()) if out.exists() else None
    return result, report


@pytest.mark.parametrize("triton_dir", _triton_versions())
def test_every_launch_compiles_to_cubin_without_spills(launches, tmp_path, triton_dir):
    # The edge variants (three quarters of the compiles) with triton 3.6, the lent GPUs' own; the installed triton
    # compiles every recorded launch for both archs, and its front end meets edge values in the fixed-bug cases.
    result, report = compile_report(launches, tmp_path, triton_dir, *(() if triton_dir else ("--edge-arch", "")))
    assert report is not None, result.stdout[-3000:] + result.stderr[-3000:]
    if triton_dir:
        assert report["triton"].startswith("3.6"), f"{triton_dir} holds triton {report['triton']}"
    rows = report["results"]
    failures = [r for r in rows if "error" in r]
    assert not failures, "\n\n".join(f"sm_{r['arch']} {r['kernel']} ({r['variant']}, {r['signature']}):\n"
                                     f"{r['error']}" for r in failures[:5])
    assert result.returncode == 0
    recorded = [r for r in rows if r["variant"] == "recorded"]
    assert {r["arch"] for r in recorded} == {80, 90}
    # Every recorded launch reached cubin with a register count from ptxas; the edge variants stopped at EDGE_STAGE
    # (triton's own stages) and claim no cubin or registers.
    assert all(r["stage"] == "cubin" and r["cubin_bytes"] > 0 and 0 < r["registers"] <= 255 for r in recorded)
    assert all(r["stage"] == EDGE_STAGE and "cubin_bytes" not in r and "registers" not in r
               for r in rows if r["variant"] != "recorded")
    # At the project's own geometry (the recorded launches) nothing spills to local memory.
    spilled = [r for r in recorded if r["spill_stores"] or r["spill_loads"]]
    assert not spilled, [(r["arch"], r["kernel"], r["blocks"], r["registers"], r["spill_stores"]) for r in spilled]
    # The edge variants ran (with triton 3.6): some integer argument became the constant 1, some another i64.
    variants = {r["variant"].split(" = ")[-1] for r in rows}
    assert {"1", str(2**31 + 16)} <= variants if triton_dir else variants == {"recorded"}
    print("\n".join(sorted({f"sm_{r['arch']} {r['kernel'].split(':')[1]:<18} {json.dumps(r['blocks'])} "
                            f"regs {r['registers']}" for r in recorded})))


# The four compile failures this check was built to catch, each put back into a copy of its module: the check must
# fail on each. (old text, new text, the kernel that must fail)
BUGS = {
    "bypass as a Python truth test": (
        "cache_assign", "if (bypass != 0) & (first_invalid == WAYS):", "if bypass and first_invalid == WAYS:",
        "_install_misses", None),
    "a method call on a rank that is 1": (
        "cache_assign", "2 * tl.cast(r0, tl.int64) + 1", "2 * r0.to(tl.int64) + 1", "_install_misses", None),
    "a method call on a one-set cache's num_sets": (
        "cache_assign", "z % tl.cast(num_sets, tl.uint64)", "z % num_sets.to(tl.uint64)", "_find_hits", None),
    # No recorded hop key has a half equal to 1: only the edge variants find this one.
    "a method call on a hop key's half": (
        "sampler", "(tl.cast(key_hi, tl.uint64) << 32) | tl.cast(key_lo, tl.uint64)",
        "(key_hi.to(tl.uint64) << 32) | key_lo.to(tl.uint64)", "_draw", "key_lo,key_hi"),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_the_check_fails_when_a_fixed_bug_is_put_back(launches, tmp_path, bug):
    module, fixed, broken, kernel, edge_args = BUGS[bug]
    source = open(os.path.join(ROOT, "lsm_gnn", "kernels", f"{module}.py")).read()
    assert source.count(fixed) == 1, f"the fix of '{bug}' is no longer in lsm_gnn/kernels/{module}.py"
    mutant = tmp_path / f"{module}.py"
    mutant.write_text(source.replace(fixed, broken))
    # Only that kernel's launches, for one arch: the front end fails before any arch-specific pass.
    subset = tmp_path / "subset.json"
    recorded = json.loads(launches.read_text())
    recorded["launches"] = [x for x in recorded["launches"] if x["kernel"].endswith(f":{kernel}")]
    subset.write_text(json.dumps(recorded))
    edges = ["--edge-args", edge_args] if edge_args else ["--edge-arch", ""]
    result, report = compile_report(subset, tmp_path, None, "--arch", "90", *edges, "--override",
                                    f"lsm_gnn.kernels.{module}={mutant}")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    failed = [r for r in report["results"] if "error" in r]
    assert failed and all(r["kernel"].endswith(kernel) for r in failed)
    if edge_args:  # found by the edge variants, which stop at EDGE_STAGE
        assert all(r["variant"] != "recorded" and r["stage"] == EDGE_STAGE for r in failed)
