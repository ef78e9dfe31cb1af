"""Test-only: stop one command of a pipeline at a known point, so a test need not race it.

With this folder on PYTHONPATH and ``MAN_FAIRSEQ_TEST_PAUSE`` set to JSON
``{"command": "fairseq-train", "after": "| train_inner |", "reached": FILE, "release": FILE}``,
the Python process whose program is ``command`` (``sys.argv[0]``'s name; every other process
is left alone) stops right after its first write to stdout or stderr that contains ``after``
(fairseq's commands log to one or the other, depending on which import set up logging first): it flushes, writes its pid to ``reached`` and waits until ``release`` exists, at
most ``timeout`` seconds (default 600), then goes on. A test sees the pipeline's state at that
point, or kills it there. Python imports ``sitecustomize`` at start-up by itself.
"""

import json
import os
import sys
import time


class _PauseAfter:
    """A standard stream that pauses the process once, after the first write holding the marker."""

    paused = False  # once per process, whichever stream saw it

    def __init__(self, stream, spec):
        self._stream, self._spec = stream, spec

    def write(self, text):
        n = self._stream.write(text)
        if not _PauseAfter.paused and self._spec["after"] in text:
            _PauseAfter.paused = True
            self._stream.flush()
            with open(self._spec["reached"], "w") as f:
                f.write(f"{os.getpid()}\n")
            deadline = time.monotonic() + float(self._spec.get("timeout", 600))
            while not os.path.exists(self._spec["release"]) and time.monotonic() < deadline:
                time.sleep(0.02)
        return n

    def __getattr__(self, name):
        return getattr(self._stream, name)


_SPEC = os.environ.get("MAN_FAIRSEQ_TEST_PAUSE")
if _SPEC:
    _SPEC = json.loads(_SPEC)
    if sys.argv and os.path.basename(sys.argv[0]) == _SPEC["command"]:
        sys.stdout = _PauseAfter(sys.stdout, _SPEC)
        sys.stderr = _PauseAfter(sys.stderr, _SPEC)
