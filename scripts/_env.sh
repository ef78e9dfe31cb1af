# Sourced by scripts/*.sh and data-prep/*.sh: the project's Python (PYTHON, else .venv, else
# python3), its bin folder first on PATH, and the repository importable.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
export PATH="$(dirname "$python"):$PATH"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
