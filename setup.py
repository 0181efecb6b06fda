"""Builds lsm_gnn._C: the native core, C++ and OpenMP only on every machine. The GPU
kernels are Triton (lsm_gnn/kernels), compiled at run time: no CUDA toolkit is needed.

Install with ``pip install --no-build-isolation -e .`` so the build uses the
torch that is already installed (an isolated build would download another).
"""
import glob
import os

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as exc:  # pragma: no cover - guidance for a wrong install command
    raise SystemExit(
        "lsm-gnn builds against the installed torch: install torch first "
        "(pip install torch==2.13.0) and then run "
        "'pip install --no-build-isolation -e .'"
    ) from exc

HERE = os.path.dirname(os.path.abspath(__file__))


def _sources(pattern):
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "**", pattern), recursive=True))


def _extension():
    # C++20 because the torch headers of 2.13 use C++20 features; the core itself is C++17.
    cxx_flags = ["-O3", "-std=c++20", "-fopenmp", "-Wall", "-Wno-unused-function"]
    # No debug info (Python's flags ask for -g): it was 40% of the compile time and 95% of the library's size.
    # LSM_GNN_DEBUG_INFO=1 keeps it, for gdb on the native core.
    cxx_flags.append("-g" if os.environ.get("LSM_GNN_DEBUG_INFO") == "1" else "-g0")
    link_flags = ["-fopenmp"]
    return cpp_extension.CppExtension(
        "lsm_gnn._C",
        _sources("*.cpp"),
        include_dirs=[os.path.join(HERE, "csrc")],
        extra_compile_args=cxx_flags,
        extra_link_args=link_flags,
    )


class BuildExt(cpp_extension.BuildExtension.with_options(use_ninja=True)):
    """Object files in the checkout's build/temp wherever the build runs (pip's editable build would use a new
    temporary directory each time): a rebuild compiles only what changed, and a compiler cache (torch's build
    calls ccache when it is installed; CCACHE_BASEDIR above two copies) finds another copy's objects."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(HERE, "build", "temp")


setup(
    name="lsm-gnn",
    version="0.1.0",
    description="Storage-based multi-GPU GNN training with a shared software cache",
    long_description=open(os.path.join(HERE, "README.md")).read() if os.path.exists(os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["lsm_gnn", "lsm_gnn.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExt},
    install_requires=["numpy>=1.23", "pyyaml>=6", "tqdm>=4.60"],
    extras_require={
        "pyg": ["torch_geometric>=2.4"],
        "test": ["pytest>=7", "hypothesis>=6"],
        "plot": ["matplotlib>=3.5"],  # lsm-gnn plot, lsm-gnn report and the benchmarks' --plot
        "tensorboard": ["tensorboard>=2.10"],  # log.tensorboard=true
    },
    entry_points={"console_scripts": ["lsm-gnn=lsm_gnn.cli:main"]},
)
