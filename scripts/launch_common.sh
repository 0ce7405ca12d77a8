# scripts/launch_common.sh: sourced by scripts/run_local.sh and scripts/run_mpi.sh, what both launchers do before
# they start the ranks:
#   launch_parse "$@"       N (the number of processes) and CMD (train_gpt --config CONFIG [args...], or the COMMAND
#                           after --) from the launcher's arguments "N CONFIG [args...]" or "N -- COMMAND [args...]";
#                           a bad N, no arguments or a missing build/train_gpt exit 2 with the usage
#   launch_env DEFAULT_ADDR the NCCL environment (NVLink SHARP off), LLM8_RDV_SECRET (a new random secret of this
#                           launch from /dev/urandom unless one is set: it authenticates the rendezvous and is never
#                           put on a command line or in a log), MASTER_ADDR (default DEFAULT_ADDR) and MASTER_PORT
#                           (default: a free port), all exported
launch_usage() {
  echo "usage: $0 N CONFIG [train_gpt args...] | $0 N -- COMMAND [args...]" >&2
  exit 2
}

launch_parse() {
  [ $# -ge 2 ] || launch_usage
  N=$1
  shift
  [[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "$0: N='$N' must be a positive number of processes" >&2; exit 2; }
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ "$1" == "--" ]; then
    shift
    [ $# -ge 1 ] || launch_usage
    CMD=("$@")
  else
    local config=$1
    shift
    local bin=${LLM8_TRAIN_GPT:-$root/build/train_gpt}
    [ -x "$bin" ] || { echo "$0: $bin not found: build first (cmake --build build --target train_gpt)" >&2; exit 2; }
    CMD=("$bin" --config "$config" "$@")
  fi
}

launch_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 20000))
}

launch_env() {
  export NCCL_NVLS_ENABLE=0
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  LLM8_RDV_SECRET=${LLM8_RDV_SECRET:-$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')}
  [ ${#LLM8_RDV_SECRET} -ge 32 ] ||
    { echo "$0: LLM8_RDV_SECRET must have at least 32 characters (is /dev/urandom readable?)" >&2; exit 2; }
  export LLM8_RDV_SECRET
  export MASTER_ADDR=${MASTER_ADDR:-$1}
  export MASTER_PORT=${MASTER_PORT:-$(launch_free_port)}
}
