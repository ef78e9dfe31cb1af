#!/usr/bin/env bash
# Check this checkout on a GPU: pytest tests/gpu, a short benchmark of every family against
# fairseq's transformer (recipes' precision), a few hundred --bf16 Multi30k updates per config if
# data-bin/multi30k.de-en exists. Writes gpu-check-<date>/gpu-check.md (+ logs) to attach to a bug
# report. Usage: scripts/gpu_check.sh [--out DIR] [--precision fp16|bf16] [--updates N] [--skip ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$repo"
exec "$python" -m lab.gpu_check "$@"
