#!/usr/bin/env bash
# Prepare wmt14 for fairseq (download or --from PATH; see docs/reproducing.md). Usage:
#   data-prep/prepare-wmt14en2de.sh [--from ARCHIVE_OR_DIR] [--workers N] [--dest DIR] [--work DIR] [--allow-nonstandard-splits] [--force]
#       [--subword sentencepiece [--spm-model-type unigram] [--spm-vocab-size 8000]]  (default: BPE; docs/data-prep.md)
# Re-running skips the steps whose inputs and options are unchanged and redoes the rest; a --dest made for
# another dataset or with other options is replaced only with --force (docs/data-prep.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$python" -m man_recipes.data.prepare wmt14 "$@"
