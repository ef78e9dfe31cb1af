#!/usr/bin/env bash
# Learning-rate stability probe of one recipe config: its model, optimiser and peak lr (reached after
# a short warm-up) on real text for a few hundred updates; reports whether the loss falls and gnorm
# stays finite, and writes runs/lr-probe/<row>-<norm>/{probe.json,loss.png}.
#   scripts/lr_probe.sh configs/man/t1-iwslt14-man-small.yaml [--norm pre|post|config]
#       [--updates 300] [--warmup 40] [--max-tokens 1536 | --paper-batch] [--device cpu|cuda]
#       [--time-limit MINUTES] [--text PREFIX | --data DATA_BIN] [--out DIR] [--overwrite]
# --out may be a folder of yours: files there that a probe did not write (train.log, probe.json,
# loss.png, checkpoints, data-bin) are replaced only with --overwrite.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$python" -m lab.lr_probe "$@"
