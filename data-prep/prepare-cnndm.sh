#!/usr/bin/env bash
# Prepare cnndm for fairseq (download or --from PATH; see "Reproducing the papers" in README.md). Usage:
#   data-prep/prepare-cnndm.sh [--from ARCHIVE_OR_DIR] [--workers N] [--dest DIR] [--work DIR]
# Re-running skips finished steps; an interrupted step is redone.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" "$here/_prepare.py" cnndm "$@"
