#!/usr/bin/env bash
# Evaluate a run: scripts/evaluate.sh runs/<row> [--avg-last N] [--subset test] [--cpu]
# Averages the last N checkpoints, decodes with the config's beam/lenpen/max-len/ngram blocking,
# writes RUN/results.json and RUN/results.md (BLEU or ROUGE, see README.md).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
export PATH="$(dirname "$python"):$PATH"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m man_fairseq.recipes.evaluate "$@"
