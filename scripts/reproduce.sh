#!/usr/bin/env bash
# Every family against the Transformer on real text, several seeds, with significance:
#   scripts/reproduce.sh multi30k|multi30k-cpu|gigaword-cpu|cnndm-cpu|STUDY-converge [--seeds N|LIST] [--families transformer,man,...]
#       [--device cpu|cuda] [--force] [--table-only] [--data DIR] [--runs-dir DIR] [--results-dir DIR]
#       [-- fairseq options]
# Needs data-prep/prepare-multi30k.sh first. Each finished run writes its record to
# results/EXPERIMENT/; a run whose record matches today's config is not retrained; an interrupted
# run resumes. The table results/EXPERIMENT.md (+ .json, figure) is rebuilt from the records;
# STUDY-converge trains to convergence (results/gigaword-cpu/README.md) and rebuilds STUDY's table.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$python" -m man_recipes.studies.reproduce "$@"
