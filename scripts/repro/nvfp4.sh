#!/usr/bin/env bash
# scripts/repro/nvfp4.sh: NVIDIA's NVFP4 recipe (arXiv 2509.25149) in our numbers, in one command (issue 15):
#   1. the loss comparison: bf16, fp8_tensorwise and nvfp4 trained from the same seed on the same data (GPT-2 124M,
#      Llama 350M or Llama 125M, 100.7M tokens of Python sources by default), through scripts/fp8_loss_parity.sh
#      (--tolerance 2:
#      the goal is nvfp4 within 2% of BF16's final validation loss);
#   2. the paper's ablation (its Fig. 4): nvfp4 without stochastic rounding of the gradients
#      (precision.dy_rounding=nearest, tag no_sr), without the random Hadamard transform of the wgrad inputs
#      (precision.wgrad_hadamard=0, tag no_rht) and with 1x16 instead of 16x16 weight blocks
#      (precision.w_granularity=1x16, tag w1x16), and with every block in FP4 (precision.bf16_layers=[], tag all_fp4);
#   3. scripts/repro/fp4_report.py: OUT/nvfp4.md, the table of final validation losses against BF16 and
#      fp8_tensorwise beside the paper's findings, and OUT/nvfp4.png, the loss curves.
# On Hopper the FP4 products run on BF16 tensor cores from operands expanded exactly from the FP4 codes: the losses
# are those of FP4 training, the speed is not FP4's (see README, "FP4 on Hopper").
#
#   usage: bash scripts/repro/nvfp4.sh [--model gpt2-124m|llama-350m|llama-125m] [--steps N] [--batch B]
#                                      [--seed S | --seeds "S ..."] [--out DIR] [--data DIR] [--corpus DIR]
#                                      [--build DIR] [--gpus LIST] [--checkpoint-every N] [--dry] [--report]
#   --dry prints every command and runs nothing; --report writes the tables and plots from the logs already in OUT.
#   --seeds "42 43 44" trains every run once per seed; the report adds each seed's losses and judges the goal on the
#   difference to BF16 paired by seed (the nvfp4 preset on GPT-2 124M over seeds 42-44: +1.19% ± 0.10; the results
#   and the earlier presets are in dev/bench/results/loss_gpt2_124m_100m/).
#   --gpus 0,1,2,3 trains all the runs at once, one per GPU (scripts/repro/gpu_queue.py), then reports.
#   The other options are scripts/fp8_loss_parity.sh's; OUT defaults to runs/nvfp4[_<model>].
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/repro/loss_steps.sh
repro_parse nvfp4 "$@"
repro_step --recipes "bf16 fp8_tensorwise nvfp4" --tolerance 2
repro_step --recipes nvfp4 --tolerance 2 --set precision.dy_rounding=nearest --tag no_sr
repro_step --recipes nvfp4 --tolerance 2 --set precision.wgrad_hadamard=0 --tag no_rht
repro_step --recipes nvfp4 --tolerance 2 --set precision.w_granularity=1x16 --tag w1x16
repro_step --recipes nvfp4 --tolerance 2 --set 'precision.bf16_layers=[]' --tag all_fp4
repro_run_queue
repro_mode --dry && exit 0
python3 scripts/repro/fp4_report.py "$OUT" --paper nvfp4 --base-seed "$BASE_SEED" --goal nvfp4=2 \
  --runs bf16 fp8_tensorwise nvfp4 nvfp4_no_sr nvfp4_no_rht nvfp4_w1x16 nvfp4_all_fp4
