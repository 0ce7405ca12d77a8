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
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
launch_parse "$@"
command -v mpirun >/dev/null || { echo "$0: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
launch_env "$(hostname)"
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
