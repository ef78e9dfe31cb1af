#!/usr/bin/env bash
# Prepare cnndm for fairseq (download or --from PATH; see "Reproducing the papers" in README.md). Usage:
#   data-prep/prepare-cnndm.sh [--from ARCHIVE_OR_DIR] [--workers N] [--dest DIR] [--work DIR] [--allow-nonstandard-splits]
# Re-running skips the steps whose inputs and options are unchanged and redoes the rest (docs/data-prep.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$python" "$repo/data-prep/_prepare.py" cnndm "$@"
