#!/usr/bin/env bash
# The main job on a small generated dataset: generate, inspect, read features
# through every storage backend.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-data/demo}
lsm-gnn prepare synthetic --out "$OUT" --num-nodes 200000 --avg-degree 10 --feature-dim 128 --overwrite
lsm-gnn inspect "$OUT" --verify
lsm-gnn bench storage "$OUT" --seconds 1
