"""The environment the recipes run fairseq's command-line tools in."""

import os
import sys
from pathlib import Path


def tool_env(**extra):
    """``os.environ`` with this interpreter's bin folder first on PATH, so that ``fairseq-train``,
    ``fairseq-generate`` and ``fairseq-preprocess`` are the ones installed beside the running
    man_fairseq (a venv not activated in the shell, another fairseq earlier on PATH), plus ``extra``."""
    env = dict(os.environ, **extra)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env
