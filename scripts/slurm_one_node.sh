#!/usr/bin/env bash
# A private one-node SLURM cluster on this machine, to try launch/slurm.sbatch without a real cluster (and for
# tests/test_slurm.py). Needs root and Debian's slurm-wlm and munge packages. Everything lives under DIR: its
# own munge key and munged, slurm.conf, state, spool and logs; /etc/slurm and the system's munged are not used.
#
#   scripts/slurm_one_node.sh start DIR     # prints the SLURM_CONF to export for sbatch, sinfo, sacct ...
#   scripts/slurm_one_node.sh stop DIR      # cancels its jobs, stops slurmctld, slurmd and munged
#
# GPUS=N advertises N GPUs so that jobs can ask for `--gpus-per-node`: slurm wants a device file per GPU, and
# gets links to /dev/null (nothing opens them; torch sees no GPU and trains on the CPU).
set -euo pipefail

die() { echo "slurm_one_node.sh: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: $0 start|stop DIR"
ACTION=$1
mkdir -p "$2"
DIR=$(cd "$2" && pwd)
export SLURM_CONF=$DIR/slurm.conf
SOCKET=$DIR/munge/munge.socket

# Whether the process in pid file $1 runs (a daemon removes its pid file as it exits; a zombie has exited).
alive() {
  local pid state
  pid=$(cat "$1" 2>/dev/null) || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# Waits up to $2 seconds for the process in pid file $1 to exit.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do alive "$1" || return 0; sleep 0.1; done
  return 1
}

stop() {
  if [ -f "$SLURM_CONF" ] && alive "$DIR/slurmctld.pid"; then
    squeue -h -o %A 2>/dev/null | xargs -r scancel 2>/dev/null || true
    # Cancelled jobs leave the queue once their processes are gone; the daemons' shutdown would not wait for them.
    local i
    for ((i = 0; i < 100; i++)); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.1; done
    scontrol shutdown >/dev/null 2>&1 || true  # the controller and every slurmd
  fi
  # The slurm daemons stop on `scontrol shutdown`; SIGTERM when it could not reach them. munged stops on SIGTERM.
  local pid_file grace
  for pid_file in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
    grace=15; [[ $pid_file == *munged.pid ]] && grace=0
    if alive "$pid_file" && ! wait_gone "$pid_file" "$grace"; then
      kill -TERM "$(cat "$pid_file")" 2>/dev/null || true
      wait_gone "$pid_file" 15 || die "process $(cat "$pid_file" 2>/dev/null) ($pid_file) did not stop"
    fi
    rm -f "$pid_file"
  done
}

logs() {
  local log
  for log in "$DIR/munge/munged.log" "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log"; do
    if [ -f "$log" ]; then echo "--- $log"; tail -n 15 "$log"; fi
  done >&2
}

# A TCP port free now (the daemons' ports: a second cluster, or a real one, may hold the defaults 6817/6818).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }

start() {
  [ "$(id -u)" -eq 0 ] || die "needs root: slurmd starts jobs as their user, and munged's key must be private"
  for cmd in munged slurmctld slurmd sinfo sbatch; do
    command -v "$cmd" >/dev/null || die "$cmd not found: apt-get install --no-install-recommends slurm-wlm munge"
  done
  alive "$DIR/slurmctld.pid" && die "a cluster already runs from $DIR; stop it first"
  local host node_line i state=""
  host=$(hostname -s)
  # Jobs get their rendezvous host from the node list, so the node's name must resolve.
  getent hosts "$host" >/dev/null || die "this machine's name '$host' does not resolve (add it to /etc/hosts)"
  mkdir -p "$DIR/munge" "$DIR/state" "$DIR/spool" "$DIR/log"
  # munged refuses a key that others can read, and a socket directory that others cannot enter.
  chmod 755 "$DIR" "$DIR/munge"
  if [ ! -f "$DIR/munge/munge.key" ]; then
    (umask 077 && head -c 128 /dev/urandom > "$DIR/munge/munge.key")
  fi
  # slurmd -C: this machine's sockets, cores and memory, as slurm itself sees them.
  node_line=$(slurmd -C) || die "slurmd -C failed: $node_line"
  node_line=${node_line%%$'\n'*}
  [[ $node_line == NodeName=* ]] || die "slurmd -C printed no node line: $node_line"
  [[ ${GPUS:-0} =~ ^[0-9]+$ ]] || die "GPUS must be a number of GPUs, not '$GPUS'"
  local gres_types="" gres=""
  rm -f "$DIR/gres.conf"
  if [ "${GPUS:-0}" -gt 0 ]; then
    gres_types="GresTypes=gpu"
    gres="Gres=gpu:$GPUS"
    for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/gpu$i"; done
    printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/gpu[0-%d]\n' "$host" "$DIR" $((GPUS - 1)) > "$DIR/gres.conf"
  fi
  cat > "$SLURM_CONF" <<EOF
# Written by scripts/slurm_one_node.sh: one node, no cgroups (containers rarely allow them), no slurmdbd.
ClusterName=lsmgnn
SlurmctldHost=$host
SlurmUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# Finished jobs stay in \`scontrol show job\` for an hour.
MinJobAge=3600
# No slurmdbd: \`sacct\` answers "accounting storage is disabled", \`sacct -c\` reads this job completion log.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
$gres_types
$node_line $gres State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  munged --key-file="$DIR/munge/munge.key" --socket="$SOCKET" --pid-file="$DIR/munge/munged.pid" \
    --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || { logs; stop; die "munged did not start (the directories above its socket must be open to all: o+x)"; }
  slurmctld -f "$SLURM_CONF" || { logs; stop; die "slurmctld did not start"; }
  slurmd -f "$SLURM_CONF" || { logs; stop; die "slurmd did not start"; }
  for ((i = 0; i < 300; i++)); do
    state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
    [ "$state" = idle ] && break
    sleep 0.1
  done
  [ "$state" = idle ] || { logs; stop; die "node $host is '${state:-not registered}' after 30 s, not idle"; }
  echo "export SLURM_CONF=$SLURM_CONF"
}

case $ACTION in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop DIR" ;;
esac
