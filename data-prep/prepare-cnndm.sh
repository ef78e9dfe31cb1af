#!/usr/bin/env bash
# Prepare cnndm for fairseq (download or --from PATH; see docs/reproducing.md). Usage:
#   data-prep/prepare-cnndm.sh [--from ARCHIVE_OR_DIR] [--workers N] [--dest DIR] [--work DIR] [--allow-nonstandard-splits] [--force]
#       [--subword sentencepiece [--spm-model-type unigram] [--spm-vocab-size 8000]]  (default: BPE; docs/data-prep.md)
#                              [--max-source-tokens N (400)] [--max-target-tokens N (keep all)] [--bpe-merges N (32000)]
# --from: story archives + URL lists, See et al.'s {split}.article.txt / {split}.abstract.tagged.txt[.gz]
# (train/val/test, or cnndm-see's train/dev/val), their finished_files/*.bin or chunked/*.bin, or
# {train,val,test}.source/.target (docs/data-prep.md, "CNN/DailyMail").
# Re-running skips the steps whose inputs and options are unchanged and redoes the rest; a --dest made for
# another dataset or with other options is replaced only with --force (docs/data-prep.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$python" -m man_recipes.data.prepare cnndm "$@"
