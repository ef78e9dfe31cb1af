#!/usr/bin/env bash
''':'
# Runs with the project's Python like train.sh and evaluate.sh (no activated venv needed).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$python" "$0" "$@"
'''
"""Gather finished runs (runs/*/results.json) into Markdown tables laid out like the papers'
tables, the papers' numbers (from configs/) beside ours. See --help."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from man_recipes.evaluation.results_table import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
