#!/usr/bin/env bash
# scripts/run_mpi.sh: data-parallel training with Open MPI's mpirun, one process per GPU.
#
#   scripts/run_mpi.sh N CONFIG [train_gpt args...]     e.g. scripts/run_mpi.sh 8 configs/gpt2_350m_bf16.json
#   scripts/run_mpi.sh N -- COMMAND [args...]           any command under mpirun (tests)
#   MPIRUN_ARGS="--hostfile hosts" scripts/run_mpi.sh 16 CONFIG    extra mpirun options (several nodes)
#
# train_gpt reads its rank, world size and local rank from Open MPI (OMPI_COMM_WORLD_*) and, when built with MPI
# (LLM8_MPI=ON), broadcasts the NCCL id over MPI (parallel.init = auto picks mpi). Without MPI in the build the same
# launch works through TCP: MASTER_ADDR (default: this host), MASTER_PORT (default: a free port) and LLM8_RDV_SECRET
# (a random secret of this launch that authenticates the rendezvous) are passed to every rank with mpirun -x, which
# names the variables: the secret's value is on no command line. mpirun itself stops the job when a rank exits with
# an error.
set -u
usage() {
  echo "usage: $0 N CONFIG [train_gpt args...] | $0 N -- COMMAND [args...]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
N=$1
shift
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "$0: N='$N' must be a positive number of processes" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "$0: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "$1" == "--" ]; then
  shift
  [ $# -ge 1 ] || usage
  CMD=("$@")
else
  CONFIG=$1
  shift
  BIN=${LLM8_TRAIN_GPT:-$ROOT/build/train_gpt}
  [ -x "$BIN" ] || { echo "$0: $BIN not found: build first (cmake --build build --target train_gpt)" >&2; exit 2; }
  CMD=("$BIN" --config "$CONFIG" "$@")
fi

# The NCCL environment, explicitly: NVLink SHARP (multicast) stays off on these machines.
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 20000))
}
# The rendezvous secret (llmc/distributed/rendezvous.h): one random value per launch from /dev/urandom, exported to
# every rank and never put on a command line or in a log. An LLM8_RDV_SECRET already set is kept (ranks started
# elsewhere can then join).
LLM8_RDV_SECRET=${LLM8_RDV_SECRET:-$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')}
[ ${#LLM8_RDV_SECRET} -ge 32 ] ||
  { echo "$0: LLM8_RDV_SECRET must have at least 32 characters (is /dev/urandom readable?)" >&2; exit 2; }
export LLM8_RDV_SECRET
export MASTER_ADDR=${MASTER_ADDR:-$(hostname)}
export MASTER_PORT=${MASTER_PORT:-$(free_port)}
# torchrun-style variables left in the environment would contradict mpirun's (train_gpt refuses that).
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE

extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)  # containers run as root; Open MPI refuses that by default
# Forward the variables the ranks need (only those that are set: mpirun warns about the others).
for var in PATH LD_LIBRARY_PATH MASTER_ADDR MASTER_PORT CUDA_VISIBLE_DEVICES $(compgen -e | grep -E '^(NCCL|LLM8)_'); do
  [ -n "${!var+x}" ] && extra+=(-x "$var")
done
# shellcheck disable=SC2206
user_args=(${MPIRUN_ARGS:-})
exec mpirun -np "$N" --bind-to none "${extra[@]}" "${user_args[@]}" "${CMD[@]}"
