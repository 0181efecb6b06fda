#!/usr/bin/env bash
# The main job on a small generated dataset: generate a graph whose features
# live on disk, check it, and train one epoch with features read through the
# cache, printing the per-stage time table and the final accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-data/demo}
lsm-gnn prepare synthetic --out "$OUT" --num-nodes 200000 --avg-degree 10 --feature-dim 128 --overwrite
lsm-gnn inspect "$OUT" --verify
# A fresh run each time: resuming a finished run would train nothing.
lsm-gnn train configs/demo.yaml dataset="$OUT" checkpoint.resume=false
