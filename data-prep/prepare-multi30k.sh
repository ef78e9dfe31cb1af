#!/usr/bin/env bash
# Prepare Multi30k (WMT16 multimodal task 1, text only) for fairseq; see docs/results-multi30k.md
# and results/multi30k-cpu/README.md. Usage:
#   data-prep/prepare-multi30k.sh [--from FOLDER] [--src de --tgt en] [--bpe-merges 10000]
#                                 [--workers N] [--dest DIR] [--work DIR] [--allow-nonstandard-splits] [--force]
#       [--subword sentencepiece [--spm-model-type unigram] [--spm-vocab-size 8000]]  (default: BPE; docs/data-prep.md)
# Re-running skips finished steps; an interrupted step is redone; a --dest made for another dataset or
# with other options is replaced only with --force (docs/data-prep.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$python" -m man_recipes.data.multi30k "$@"
