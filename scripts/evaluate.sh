#!/usr/bin/env bash
# Evaluate a run: scripts/evaluate.sh runs/<row> [--avg-last N] [--subset test] [--cpu]
# Averages the last N checkpoints, decodes with the config's beam/lenpen/max-len/ngram blocking,
# writes RUN/results.json and RUN/results.md (another --subset S: RUN/results.S.*, beside them; BLEU or
# ROUGE, see docs/reproducing.md). An error is one
# `ERROR: ...` line with exit status 2; the earlier results.* are then left as results.previous.*.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$python" -m man_recipes.evaluation.evaluate "$@"
