# Sourced by scripts/*.sh and data-prep/*.sh: the project's Python (PYTHON, else .venv, else
# python3), its bin folder first on PATH, and the repository importable.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
export PATH="$(dirname "$python"):$PATH"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

# bounded NAME VALUE MAX WHY: a count from the environment, an integer 1..MAX (WHY: what MAX is), or one
# line naming it and exit status 2 (a shell script's counts bounded as the Python options are)
bounded() {
  case $2 in ''|*[!0-9]*) ;; *) [ ${#2} -le 9 ] && [ "$2" -ge 1 ] && [ "$2" -le "$3" ] && return 0;; esac
  echo "$0: $1=$2: must be an integer >= 1 and <= $3 ($4)" >&2
  exit 2
}
