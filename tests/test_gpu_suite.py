"""benchmarks/gpu_suite.sh on a bare GPU machine has no package index: its install path (the native core built in
place against the torch present) must work offline. Here it runs from a copy of the tracked files with pip's index
disabled; --dry-run stops before the steps that need a GPU."""
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
