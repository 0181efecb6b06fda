#!/usr/bin/env bash
# Multi-rank training with torchrun: one process per GPU (or per CPU worker).
#
#   NPROC=2 launch/torchrun.sh configs/default.yaml dataset=data/igb            # one node
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 NPROC=4 launch/torchrun.sh ...       # on each of 2 nodes
#
# Arguments go to `lsm-gnn train`. torchrun sets RANK, WORLD_SIZE, MASTER_ADDR
# and MASTER_PORT; the trainer initialises torch.distributed from them (NCCL on
# GPUs, gloo on CPU) and the communication layer shares the cache over ranks.
set -euo pipefail
NPROC=${NPROC:-2}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
PYTHON=${PYTHON:-python3}
# Split the cores between the ranks, else each rank's OpenMP pool takes them all.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / NPROC > 0 ? $(nproc) / NPROC : 1 ))}
exec "$PYTHON" -m torch.distributed.run --nproc_per_node="$NPROC" --nnodes="$NNODES" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" -m lsm_gnn train "$@"
