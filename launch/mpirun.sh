#!/usr/bin/env bash
# Multi-rank training with mpirun (Horovod-style workers): Open MPI starts the
# processes; each takes its rank and world size from the MPI environment
# (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE) and initialises torch.distributed
# from them, meeting at MASTER_ADDR:MASTER_PORT.
#
#   NPROC=2 launch/mpirun.sh configs/default.yaml dataset=data/igb
#   NPROC=8 HOSTS=node0:4,node1:4 MASTER_ADDR=node0 launch/mpirun.sh ...     # two nodes
#
# Across nodes, set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME) to the interface the nodes share; it and every
# LSM_GNN_* variable are passed on to the ranks.
#
# Arguments go to `lsm-gnn train`. Needs Open MPI (apt install openmpi-bin).
set -euo pipefail
NPROC=${NPROC:-2}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
PYTHON=${PYTHON:-python3}
command -v mpirun >/dev/null || { echo "launch/mpirun.sh: mpirun not found; apt install openmpi-bin" >&2; exit 127; }
OMP=${OMP_NUM_THREADS:-$(( $(nproc) / NPROC > 0 ? $(nproc) / NPROC : 1 ))}
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)   # containers often run as root
[ -n "${HOSTS:-}" ] && extra+=(--host "$HOSTS")
[ -n "${PYTHONPATH:-}" ] && extra+=(-x PYTHONPATH)
# Settings the ranks read from their environment (on other hosts too): the interface gloo/NCCL bind to,
# lsm-gnn's own (LSM_GNN_TIMEOUT_S, ...).
for v in $(compgen -e | grep -E '^(LSM_GNN_|GLOO_|NCCL_|TORCH_)' || true); do extra+=(-x "$v"); done
exec mpirun -np "$NPROC" --oversubscribe "${extra[@]}" \
  -x MASTER_ADDR="$MASTER_ADDR" -x MASTER_PORT="$MASTER_PORT" -x OMP_NUM_THREADS="$OMP" \
  "$PYTHON" -m lsm_gnn train "$@"
