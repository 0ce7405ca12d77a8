#!/usr/bin/env bash
# scripts/run_local.sh: data-parallel training on the GPUs of this machine, one process per GPU, without mpirun.
#
#   scripts/run_local.sh N CONFIG [train_gpt args...]    e.g. scripts/run_local.sh 2 configs/gpt2_124m_bf16.json
#   scripts/run_local.sh N -- COMMAND [args...]          any command, started N times the same way (tests, tools)
#
# Every process gets torchrun-style variables: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
# (default 127.0.0.1) and MASTER_PORT (default: a free port), LLM8_RDV_SECRET (a random secret of this launch that
# authenticates the rendezvous) and the NCCL environment below; train_gpt picks GPU LOCAL_RANK and exchanges the NCCL
# id over TCP with rank 0. Rank 0 prints; the others print only errors ("[rank R] error: ...").
#
# Exit codes are collected: when a rank fails, the others get LLM8_KILL_GRACE_S seconds (default 10) to stop on their
# own (they normally do at once, printing why: train_gpt's check points and timeouts), then SIGTERM, then SIGKILL.
# The script exits with the first failing rank's code (0 when all succeed). Ctrl-C stops every rank.
#
# Environment: LLM8_TRAIN_GPT (the binary, default build/train_gpt), LLM8_LOG_DIR (when set, rank R's output goes to
# LLM8_LOG_DIR/rank<R>.log instead of the terminal), NCCL_* variables are passed through.
set -u

source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
launch_parse "$@"
launch_env 127.0.0.1
export WORLD_SIZE=$N LOCAL_WORLD_SIZE=$N
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK PMI_SIZE PMI_RANK

if [ -n "${LLM8_LOG_DIR:-}" ]; then mkdir -p "$LLM8_LOG_DIR"; fi
pids=()
for ((r = 0; r < N; r++)); do
  if [ -n "${LLM8_LOG_DIR:-}" ]; then
    RANK=$r LOCAL_RANK=$r "${CMD[@]}" >"$LLM8_LOG_DIR/rank$r.log" 2>&1 &
  else
    RANK=$r LOCAL_RANK=$r "${CMD[@]}" &
  fi
  pids+=($!)
done

stop_all() {  # stop_all SIGNAL: signal every rank still running
  for pid in "${pids[@]}"; do kill -"$1" "$pid" 2>/dev/null; done
}
trap 'echo "run_local.sh: interrupted, stopping all ranks" >&2; stop_all TERM; sleep 2; stop_all KILL; exit 130' INT TERM

grace=${LLM8_KILL_GRACE_S:-10}
codes=()
for ((r = 0; r < N; r++)); do codes[r]=""; done
first_failure=""
failed_at=0
running=$N
while [ $running -gt 0 ]; do
  for ((r = 0; r < N; r++)); do
    [ -z "${codes[r]}" ] || continue
    if ! kill -0 "${pids[r]}" 2>/dev/null; then
      wait "${pids[r]}"
      codes[r]=$?
      running=$((running - 1))
      if [ "${codes[r]}" -ne 0 ] && [ -z "$first_failure" ]; then
        first_failure=$r
        failed_at=$SECONDS
        [ $running -gt 0 ] && echo "run_local.sh: rank $r exited with code ${codes[r]}; the other ranks get ${grace}s to stop" >&2
      fi
    fi
  done
  if [ -n "$first_failure" ] && [ $running -gt 0 ]; then
    if [ $((SECONDS - failed_at)) -ge "$grace" ]; then
      echo "run_local.sh: stopping the remaining ranks (SIGTERM)" >&2
      stop_all TERM
      sleep 5
      stop_all KILL
      failed_at=$((SECONDS + 1000000))  # signal once
    fi
  fi
  [ $running -gt 0 ] && sleep 0.2
done

if [ -n "$first_failure" ]; then
  summary=""
  for ((r = 0; r < N; r++)); do summary+=" rank $r: ${codes[r]};"; done
  echo "run_local.sh: failed (exit codes:${summary%;})" >&2
  exit "${codes[first_failure]}"
fi
exit 0
