#!/usr/bin/env bash
# Train one paper-table row: scripts/train.sh configs/<row>.yaml [--gpus N] [--cpu] [--dry-run]
#   [--precision fp16|bf16|fp32] [--launcher torchrun|slurm] [--run-dir DIR] [-- fairseq options]
# --update-freq is derived so the paper's effective batch holds for any number of GPUs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$python" -m man_recipes.training.launch "$@"
