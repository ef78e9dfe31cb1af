#!/usr/bin/env bash
# Reproduce every family against the Transformer on real text, several seeds, with significance:
#   scripts/reproduce.sh multi30k [--seeds N] [--families transformer,man,...] [--device cpu|cuda]
#                                 [--data DIR] [--runs-dir DIR] [--results-dir DIR] [-- fairseq options]
# Needs data-prep/prepare-multi30k.sh first. Finished runs are skipped on a rerun; an interrupted
# run resumes. Writes results/multi30k.md, results/multi30k.json and results/multi30k-valid-loss.png.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$python" -m man_fairseq.recipes.reproduce "$@"
