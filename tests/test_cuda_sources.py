"""Compile-checks every CUDA source with `nvcc -c` where nvcc exists.

The kernels need only the CUDA runtime (raw pointers, a stream); their torch
binding lives in .cpp files. So on a machine with nvcc but a CPU-only torch,
this still catches CUDA compile errors before anything reaches a GPU.
"""
import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CU_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.cu"), recursive=True))
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.skipif(not CU_SOURCES, reason="the project has no CUDA sources yet")
@pytest.mark.parametrize("source", CU_SOURCES, ids=lambda p: os.path.relpath(p, ROOT))
def test_cuda_source_compiles(source, tmp_path):
    result = subprocess.run(
        [NVCC, "-c", "-std=c++17", "-O2", "-I", os.path.join(ROOT, "csrc"), source, "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"nvcc failed on {source}:\n{result.stderr[-4000:]}"
