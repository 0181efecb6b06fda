"""benchmarks/gpu_suite.sh on a bare GPU machine has no package index: its install path (the native core built in
place against the torch present) must work offline. Here it runs from a copy of the tracked files with pip's index
disabled; --dry-run stops before the steps that need a GPU. A lent machine also has a time limit and brings back a
few files: the options that fit the suite to both are checked here too."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tracked_copy(dest) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), os.path.join(dest, name))


OFFLINE_BUILD_ENV = "LSM_GNN_OFFLINE_BUILD_TEST"


# It builds the native core from scratch (a minute of both cores): .ci/run runs it on its own, beside the suite,
# with LSM_GNN_OFFLINE_BUILD_TEST=1 (and ccache, which finds the install's objects: seconds); elsewhere it says how
# to run it.
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get(OFFLINE_BUILD_ENV), reason=f"a 1-minute build: set {OFFLINE_BUILD_ENV}=1 to run "
                    "it (.ci/run does, beside the test suite)")
def test_the_gpu_suite_builds_and_starts_offline(tmp_path):
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("needs the git checkout to copy its tracked files")
    copy = tmp_path / "checkout"
    tracked_copy(copy)
    assert not list((copy / "lsm_gnn").glob("_C*.so")), "the copy must build its own extension"
    out = tmp_path / "out"
    # Any download fails: no index, an unreachable one, no proxy. PYTHONPATH empty: nothing of this checkout leaks in.
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_FIND_LINKS="",
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", OUT=str(out), PYTHONPATH="",
               MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    result = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "--dry-run"], cwd=copy, env=env, capture_output=True,
                            text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "dry run: build, imports and test collection fine" in result.stdout
    assert list((copy / "lsm_gnn").glob("_C*.so")), "the suite built lsm_gnn._C in place"
    assert "torch" in (out / "environment.txt").read_text()


@pytest.mark.parametrize("option,message", [
    ("--steps=tests,bogus", "--steps: unknown step 'bogus' (of tests,gds,kernels,e2e,comm)"),
    ("--steps=", "--steps is empty"),
    ("--budget=5m", "--budget=5m: give whole seconds"),
    ("--archive=out.zip", "--archive=out.zip: name a .tgz file"),
    ("--fast", "unknown option '--fast'"),
])
def test_a_bad_option_is_refused_before_any_work(tmp_path, option, message):
    result = subprocess.run(["bash", "benchmarks/gpu_suite.sh", option], cwd=ROOT, capture_output=True, text=True,
                            env=dict(os.environ, OUT=str(tmp_path / "out")), timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_budget_runs_the_steps_that_fit_and_the_outputs_come_back_in_one_file(tmp_path):
    """A lent machine's call has a time limit and brings back a few files: --budget cuts the steps to it (the dry
    run shows which would run, each taking all of its limit) and --archive packs $OUT at exit."""
    import glob
    import importlib.machinery
    import tarfile

    if not any(glob.glob(os.path.join(ROOT, "lsm_gnn", "_C" + s)) for s in importlib.machinery.EXTENSION_SUFFIXES):
        pytest.skip("needs lsm_gnn._C built in place (scripts/install.sh): this test must not build it")
    out, archive = tmp_path / "gpu", tmp_path / "gpu" / "gpu.tgz"
    limits = dict(TESTS_S="100", KERNELS_S="50", E2E_S="1000")
    result = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "--dry-run", "--steps=tests,kernels,e2e,comm",
                             "--budget=400", f"--archive={archive}"], cwd=ROOT, capture_output=True, text=True,
                            env=dict(os.environ, OUT=str(out), **limits), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    planned = [line for line in result.stdout.splitlines() if line.startswith("== ") and ": " in line]
    assert [line.split(":")[0] for line in planned] == ["== tests", "== kernels", "== e2e 30%", "== comm"]
    # 400 s less 15 to pack and the seconds the environment took: tests and kernels whole, e2e cut to what is
    # left (under its 1000 s), and nothing left for comm
    assert planned[0].endswith("would run, at most 100 s") and planned[1].endswith("would run, at most 50 s")
    cut = int(planned[2].split("at most ")[1].split()[0])
    assert 30 <= cut <= 400 - 15 - 150
    assert "skipped" in planned[3] and "would run" not in planned[3]
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"gpu/environment.txt", "gpu/skipped.txt", "gpu/collect.txt"} <= names and "gpu/gpu.tgz" not in names
    assert (out / "skipped.txt").read_text().startswith("== comm: skipped")
