#!/usr/bin/env bash
# Installs everything lsm-gnn needs on a fresh Debian/Ubuntu machine with
# Python 3.10+: system packages (apt), torch, the Python dependencies and the
# package itself with its native extension. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(fio openmpi-bin)  # fio: the storage benchmark's physical limit; openmpi-bin: launch/mpirun.sh
# Only with --test-packages (CI, .ci/run): a real SLURM for tests/test_slurm.py, which starts its own one-node
# cluster. Without recommends: they are every optional plugin (HDF5, ROCm, InfluxDB, ...). Installing starts no
# slurm daemon: their units need /etc/slurm/slurm.conf, which nothing here writes. ccache: torch's build calls it
# when installed, so the GPU suite's offline build test (.ci/run) compiles nothing the install did not.
TEST_APT_PACKAGES=(slurm-wlm munge ccache)
PYTHON=${PYTHON:-python3}

TEST_PACKAGES=0
for arg in "$@"; do
  case $arg in
    --test-packages) TEST_PACKAGES=1 ;;
    *) echo "install.sh: unknown option '$arg' (only --test-packages)" >&2; exit 2 ;;
  esac
done

# apt_install [apt-get options] PACKAGE...: installs those not installed yet, updating the package lists if needed.
apt_install() {
  local options=() missing=() p
  while [[ ${1:-} == -* ]]; do options+=("$1"); shift; done
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  local install=($SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${options[@]}" "${missing[@]}")
  "${install[@]}" >/dev/null 2>&1 || { $SUDO apt-get update -qq && "${install[@]}"; }
}

if command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  apt_install "${APT_PACKAGES[@]}"
  if [ "$TEST_PACKAGES" -eq 1 ]; then apt_install --no-install-recommends "${TEST_APT_PACKAGES[@]}"; fi
else
  echo "install.sh: no apt-get; install ${APT_PACKAGES[*]} yourself (only the benchmarks need them)" >&2
  if [ "$TEST_PACKAGES" -eq 1 ]; then echo "install.sh: and ${TEST_APT_PACKAGES[*]} for tests/test_slurm.py" >&2; fi
fi

# Keep an existing torch (a CUDA build on GPU machines); otherwise pin the
# CPU build. Never let pip resolve torch on its own: it would fetch GBs of CUDA wheels.
if ! $PYTHON -c "import torch" >/dev/null 2>&1; then
  $PYTHON -m pip install -q torch==2.13.0
fi
$PYTHON -m pip install -q ninja "numpy>=1.23" "pyyaml>=6" "tqdm>=4.60" "pytest>=7" "hypothesis>=6" scipy torch_geometric libcachesim
# matplotlib: lsm-gnn plot, lsm-gnn report and the benchmarks' --plot; tensorboard: log.tensorboard=true
# (both optional for training; their tests need them)
$PYTHON -m pip install -q "matplotlib>=3.5" "tensorboard>=2.10"
# Triton: the GPU kernels' language; CUDA builds of torch bring it, CPU machines run its interpreter in the tests.
# --no-deps: it needs nothing else, and must not touch the torch pin.
if ! $PYTHON -c "import triton" >/dev/null 2>&1; then
  $PYTHON -m pip install -q --no-deps "triton==3.9.0"
fi
# Only with --test-packages: triton 3.6 (what torch 2.11's CUDA wheels ship, and the lent GPU machines have) in a
# folder of its own, for tests/test_kernels_compile.py and the interpreter tests (.ci/run); with numpy 2.3, whose
# scalars its interpreter still converts (numpy 2.4 refuses int() of a 1-element array).
if [ "$TEST_PACKAGES" -eq 1 ] && [ ! -d .ci/triton36/triton ]; then
  $PYTHON -m pip install -q --no-deps --target .ci/triton36 "triton==3.6.0" "numpy==2.3.5"
fi
# Optional: DGL 1.1.3 (the release that works with torch 2.13) for the from_dgl converter and its test.
$PYTHON -m pip install -q dgl==1.1.3 >/dev/null 2>&1 || echo "install.sh: dgl 1.1.3 unavailable; DGL tests will be skipped" >&2
# --no-build-isolation: build against the torch installed above.
MAX_JOBS=${MAX_JOBS:-2} $PYTHON -m pip install -q --no-build-isolation --no-deps -e .
# pyenv only sees new console scripts (lsm-gnn) after a rehash.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
$PYTHON -c "import lsm_gnn, lsm_gnn._C; print('lsm-gnn', lsm_gnn.__version__, 'installed')"
