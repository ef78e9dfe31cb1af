"""How the recipes run fairseq's command-line tools: the environment, and the one runner that
streams a tool's output into its log as it comes (``fairseq-train``, ``fairseq-generate``, the
demo's ``fairseq-preprocess``)."""

import os
import subprocess
import sys
from pathlib import Path

from man_recipes.interrupt import child_process


def tool_env(**extra):
    """``os.environ`` with this interpreter's bin folder first on PATH, so that ``fairseq-train``,
    ``fairseq-generate`` and ``fairseq-preprocess`` are the ones installed beside the running
    man_fairseq (a venv not activated in the shell, another fairseq earlier on PATH), plus ``extra``."""
    env = dict(os.environ, **extra)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def run_tool(cmd, log_path, on_line=None, append=False, env=None):
    """Run ``cmd`` with its stdout and stderr, line by line as they arrive, written (and flushed)
    to ``log_path`` (appended with ``append``) and handed to ``on_line``; returns the exit code.

    The tool runs unbuffered in :func:`tool_env` unless ``env`` says otherwise: into a pipe, Python
    would block-buffer its output (tens of seconds of lag in a log someone follows). On Ctrl-C the tool
    is stopped, and waited for, before the KeyboardInterrupt goes on (:func:`..interrupt.child_process`)."""
    env = tool_env(PYTHONUNBUFFERED="1") if env is None else env
    with open(log_path, "a" if append else "w") as log, \
            child_process(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if on_line:
                on_line(line)
        return proc.wait()


def echo(line):
    """An ``on_line`` for :func:`run_tool`: the line to stdout as it comes."""
    sys.stdout.write(line)
    sys.stdout.flush()
