#!/usr/bin/env bash
# For a GPU owner: runs the GPU tests and writes the GPU figures to $OUT (default bench-results/gpu).
# What it measures and what is already checked without a GPU: docs/gpu.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-results/gpu}
mkdir -p "$OUT"
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_suite.sh: torch sees no CUDA device; run this on a GPU machine" >&2
  exit 2
fi
status=0
echo "== GPU tests (the Triton sampler and a cache on the device against the CPU implementations)"
python -m pytest -q tests/test_sampler_cuda.py tests/test_device_path.py 2>&1 | tee "$OUT/tests.txt" || status=1
echo "== kernel figures: cache all-hit beside a device copy, sampler edges/s"
python benchmarks/gpu_kernels.py --json "$OUT/gpu_kernels.json" 2>&1 | tee "$OUT/gpu_kernels.txt" || status=1
echo "== end to end on one GPU (hybrid cache vs in-memory features)"
python benchmarks/end_to_end.py --methods hybrid,memory --json "$OUT/end_to_end.json" 2>&1 \
  | tee "$OUT/end_to_end.txt" || status=1
echo "results in $OUT"
exit $status
