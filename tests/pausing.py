"""Stopping a command of a pipeline at a known point in a test (see pause_hook/sitecustomize.py)."""

import json
import os
import time
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent / "pause_hook"


def pause_env(folder, command, after, pythonpath=None):
    """(environment entries, reached file, release file): ``command`` stops after its first output
    line (stdout or stderr) containing ``after``, writes its pid to ``reached`` and waits for ``release`` to exist."""
    folder = Path(folder)
    reached, release = folder / f"{command}.reached", folder / f"{command}.release"
    spec = {"command": command, "after": after, "reached": str(reached), "release": str(release)}
    path = os.pathsep.join(p for p in (str(HOOK_DIR), pythonpath if pythonpath is not None
                                       else os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "MAN_FAIRSEQ_TEST_PAUSE": json.dumps(spec)}, reached, release


def wait_for(path, proc, timeout=300):
    """Wait until ``path`` exists; fail if ``proc`` ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} ended (exit {proc.returncode}) before reaching the pause point")
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.args} did not reach the pause point within {timeout}s")
        time.sleep(0.05)
