#!/usr/bin/env bash
# For a GPU owner: builds the native core in place, runs the GPU tests and writes the GPU figures to $OUT
# (default bench-results/gpu). Works offline on a machine that already has a CUDA torch, triton, numpy,
# pyyaml, tqdm, scipy, pytest and torch_geometric: nothing is downloaded. What it measures and what is
# already checked without a GPU: docs/gpu.md.
#
#   bash benchmarks/gpu_suite.sh             # on a GPU machine: the build (1.5 minutes), then steps of at most
#                                            # 170 + 60 + 90 + 150 + 300 s (tests, gds, kernels, e2e, comm)
#   bash benchmarks/gpu_suite.sh --dry-run   # anywhere: the offline build and the steps' imports, no GPU
#   bash benchmarks/gpu_suite.sh --steps=tests,kernels,e2e --budget=540 --archive=/out/gpu.tgz
#       # a lent machine with a time limit: only those steps, each cut to the time the budget has left (one that
#       # cannot get 30 s is skipped and named: exit 3 if nothing failed), and $OUT packed into one file at exit
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-bench-results/gpu}
DRY_RUN=0
ALL_STEPS=tests,gds,kernels,e2e,comm
STEPS=$ALL_STEPS
BUDGET_S=0  # 0: no budget
ARCHIVE=
usage="gpu_suite.sh [--dry-run] [--steps=LIST] [--budget=SECONDS] [--archive=FILE.tgz]; steps: $ALL_STEPS"
for arg in "$@"; do
  case $arg in
    --dry-run) DRY_RUN=1 ;;
    --steps=*) STEPS=${arg#--steps=} ;;
    --budget=*) BUDGET_S=${arg#--budget=} ;;
    --archive=*) ARCHIVE=${arg#--archive=} ;;
    *) echo "gpu_suite.sh: unknown option '$arg'; usage: $usage" >&2; exit 2 ;;
  esac
done
for step in ${STEPS//,/ }; do
  [[ ",$ALL_STEPS," == *",$step,"* ]] || { echo "gpu_suite.sh: --steps: unknown step '$step' (of $ALL_STEPS)" >&2; exit 2; }
done
[ -n "${STEPS//,/}" ] || { echo "gpu_suite.sh: --steps is empty; give some of $ALL_STEPS" >&2; exit 2; }
[[ $BUDGET_S =~ ^[0-9]+$ ]] || { echo "gpu_suite.sh: --budget=$BUDGET_S: give whole seconds (0: no budget)" >&2; exit 2; }
if [ -n "$ARCHIVE" ]; then
  case $ARCHIVE in *.tgz|*.tar.gz) ;; *) echo "gpu_suite.sh: --archive=$ARCHIVE: name a .tgz file" >&2; exit 2 ;; esac
  ARCHIVE=$(realpath -m "$ARCHIVE")
  # At any exit, the outputs in one file (a lent machine brings back a few files), the archive itself left out.
  # It is written outside $OUT, then moved: tar fails on a folder that changes while it reads it.
  pack() {
    local part out
    part=$(mktemp "${TMPDIR:-/tmp}/gpu_suite.XXXXXX") && out=$(realpath -m "$OUT") &&
      tar czf "$part" --exclude="$(basename "$ARCHIVE")" -C "$(dirname "$out")" "$(basename "$out")" &&
      mv "$part" "$ARCHIVE" && echo "outputs packed in $ARCHIVE" ||
      { rm -f "$part"; echo "gpu_suite.sh: packing $OUT into $ARCHIVE failed" >&2; }
  }
  trap pack EXIT
  trap 'exit 143' TERM INT
fi
START_S=$SECONDS
SKIPPED=()
# want STEP: whether --steps names it
want() { [[ ",$STEPS," == *",$1,"* ]]; }
# limit STEP: the step's time limit in seconds (each can be set: TESTS_S, GDS_S, ...)
limit() {
  case $1 in
    tests) echo "${TESTS_S:-170}" ;; gds) echo "${GDS_S:-60}" ;; kernels) echo "${KERNELS_S:-90}" ;;
    e2e) echo "${E2E_S:-150}" ;; comm) echo $(( ${COMM_PREPARE_S:-120} + ${COMM_S:-180} )) ;;
  esac
}
PLANNED_S=0  # --dry-run: the limits of the steps it would have run, as if each took all of its limit
# within LIMIT: LIMIT, or the budget's time left (less 15 s to pack) where that is shorter
within() {
  local limit=$1
  if [ "$BUDGET_S" -gt 0 ]; then
    local left=$((BUDGET_S - (SECONDS - START_S) - PLANNED_S - 15))
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "$limit"
}
# fits STEP LIMIT: true where the step gets at least 30 s; else it is named as skipped
fits() {
  local got
  got=$(within "$2")
  if [ "$got" -lt 30 ]; then
    echo "== $1: skipped, ${got} s of the --budget left" | tee -a "$OUT/skipped.txt"
    SKIPPED+=("$1")
    return 1
  fi
}
mkdir -p "$OUT"
rm -f "$OUT/skipped.txt"  # this run's skips only
export PYTHONUNBUFFERED=1

echo "== environment"
$PY - <<'EOF' 2>&1 | tee "$OUT/environment.txt"
import platform, sys
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton missing")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"{p.total_memory / 2**30:.0f} GiB,", p.multi_processor_count, "SMs,",
          f"capability {p.major}.{p.minor}")
EOF

echo "== native core (lsm_gnn._C), built in place against this torch, offline"
# This checkout's own extension (an editable install elsewhere would otherwise answer the import).
built() { $PY -c "import glob, importlib.machinery as m, sys
sys.exit(0 if any(glob.glob('lsm_gnn/_C' + s) for s in m.EXTENSION_SUFFIXES) else 1)"; }
if ! built; then
  # build_ext alone: pip would try to resolve build requirements from an index.
  MAX_JOBS=${MAX_JOBS:-$(nproc)} $PY setup.py -q build_ext --inplace >"$OUT/build.txt" 2>&1 \
    || { tail -40 "$OUT/build.txt"; echo "gpu_suite.sh: building lsm_gnn._C failed (log: $OUT/build.txt)" >&2; exit 1; }
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import os, lsm_gnn._C as c; assert c.__file__.startswith(os.getcwd()), c.__file__; print('lsm_gnn._C imports')" \
  || exit 1

if [ "$DRY_RUN" -eq 1 ]; then
  # Every step's script must import; the GPU tests must be collected.
  $PY -m pytest -q --collect-only tests/test_sampler_cuda.py tests/test_device_path.py tests/test_hits_first.py tests/test_gpu_paths.py \
    tests/test_gds_cache.py >"$OUT/collect.txt" 2>&1 || { cat "$OUT/collect.txt"; exit 1; }
  for script in benchmarks/gpu_kernels.py benchmarks/end_to_end.py benchmarks/comm_layer.py; do
    $PY "$script" --help >/dev/null || { echo "gpu_suite.sh: $script does not start" >&2; exit 1; }
  done
  # What a run would do with these options, each step taking all of its time limit.
  for step in ${STEPS//,/ }; do
    for capacity in $([ "$step" = e2e ] && echo "${E2E_CAPACITIES:-30%}" || echo -); do
      name=$step
      [ "$step" = e2e ] && name="e2e $capacity"
      if fits "$name" "$(limit "$step")"; then
        got=$(within "$(limit "$step")")
        echo "== $name: would run, at most $got s"
        PLANNED_S=$((PLANNED_S + got))
      fi
    done
  done
  echo "dry run: build, imports and test collection fine"
  exit 0
fi

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_suite.sh: torch sees no CUDA device; run this on a GPU machine (or --dry-run)" >&2
  exit 2
fi
status=0
GPU_TESTS=(tests/test_sampler_cuda.py tests/test_device_path.py tests/test_hits_first.py)
[ -f tests/test_gpu_paths.py ] && GPU_TESTS+=(tests/test_gpu_paths.py)
if want tests && fits tests "$(limit tests)"; then
  echo "== GPU tests (a cache on the device against the CPU cache, the sampler, embeddings, evaluation)"
  timeout "$(within "$(limit tests)")" $PY -m pytest -q -p no:cacheprovider -m "" "${GPU_TESTS[@]}" 2>&1 \
    | tee "$OUT/tests.txt" || status=1
fi
if want gds && fits gds "$(limit gds)"; then
  echo "== storage.kind=gds: a cache on the GPU over KvikIO in its compatibility mode (skipped without kvikio)"
  if $PY -c "import kvikio" 2>/dev/null; then
    KVIKIO_COMPAT_MODE=ON timeout "$(within "$(limit gds)")" $PY -m pytest -q -p no:cacheprovider \
      tests/test_gds_cache.py 2>&1 | tee "$OUT/gds.txt" || status=1
  else
    echo "kvikio does not import here: skipped" | tee "$OUT/gds.txt"
  fi
fi
if want kernels && fits kernels "$(limit kernels)"; then
  echo "== kernel figures: cache all-hit beside a device copy, a lookup with misses beside the rows moved without a cache, sampler edges/s beside the C++ sampler"
  # KERNELS_ARGS: more options, e.g. "--profile" (where an all-hit serve's time goes, op by op)
  timeout "$(within "$(limit kernels)")" $PY benchmarks/gpu_kernels.py ${KERNELS_ARGS:-} --json "$OUT/gpu_kernels.json" \
    2>&1 | tee "$OUT/gpu_kernels.txt" || status=1
fi
if want e2e; then
  echo "== end to end on one GPU: the cache on the device (default policy, and hybrid) vs the table in GPU memory"
  # farthest-pinned: the default cache with its misses gathered by the GPU from page-locked host memory (no disk),
  # so its ratio to device is the project's own overhead; the others add the VM's disk.
  # Each capacity after an untimed warm-up run of every method (Triton compiles the kernels at their first
  # launches). In 100 iterations most misses are first touches: 60% gave the hit ratio of 30% (0.734 and 0.730)
  # on the H200. Then each method's training step alone and beside its loader's thread, and their ratio (target:
  # within 1.05x).
  for capacity in ${E2E_CAPACITIES:-30%}; do
    fits "e2e $capacity" "$(limit e2e)" || continue
    timeout "$(within "$(limit e2e)")" $PY benchmarks/end_to_end.py \
      --methods farthest,farthest-pinned,hybrid,hybrid-no-read-ahead,device --num-nodes 200000 \
      --capacity "$capacity" --iterations 100 --warmup 20 --repeats 2 --backend auto \
      --step-beside-loader 20 --step-runs 5 \
      --data "${E2E_DATA:-/tmp/lsm-gnn-gpu-e2e}" --json "$OUT/end_to_end_${capacity%\%}.json" 2>&1 \
      | tee -a "$OUT/end_to_end.txt" || status=1
  done
fi
if want comm && fits comm "$(limit comm)"; then
  echo "== the shared cache's exchange, 2 ranks on the host's cores (issue 43's target: at most 15% of the gather)"
  # CPU processes over gloo, as docs/benchmarks/distributed.md's 4 KiB figure (2 shared cores there: 25.3%).
  COMM_DATA=${COMM_DATA:-/tmp/lsm-gnn-gpu-comm}
  ( [ -f "$COMM_DATA/meta.json" ] || timeout "$(within "${COMM_PREPARE_S:-120}")" $PY -m lsm_gnn prepare synthetic \
      --out "$COMM_DATA" --num-nodes "${COMM_NODES:-300000}" --feature-dim 1024 --no-progress \
      >"$OUT/comm_prepare.txt" 2>&1 ) &&
    timeout "$(within "${COMM_S:-180}")" $PY benchmarks/comm_layer.py --data "$COMM_DATA" --worlds 2 \
      --capacities 1.5% --owner hashed --shared-only --exchanges shm --repeats 1 \
      --out "${COMM_WORK:-/tmp/lsm-gnn-gpu-comm-work}" --json "$OUT/comm_layer.json" 2>&1 | tee "$OUT/comm_layer.txt" \
    || { tail -20 "$OUT/comm_prepare.txt" 2>/dev/null; status=1; }
fi
if [ "${#SKIPPED[@]}" -gt 0 ] && [ "$status" -eq 0 ]; then
  echo "skipped for time: ${SKIPPED[*]} (rerun with --steps naming them)"
  status=3
fi
echo "results in $OUT (status $status)"
exit $status
