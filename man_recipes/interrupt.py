"""Ctrl-C in every command: one line on stderr and exit status 130 (128 + SIGINT, what a shell reports
for it), never a KeyboardInterrupt traceback.

Every entry point (the console scripts, ``scripts/*.sh``, ``scripts/*.py``, ``data-prep``) is wrapped
in :func:`one_line_on_ctrl_c`; data-prep and ``scripts/reproduce.sh`` print their own line first (which
step was interrupted, how to resume) with the same status. Standard library only: data-prep imports it
without fairseq.
"""

import functools
import sys

EXIT_INTERRUPTED = 130


def interrupted_line(prog, detail=""):
    """The line a command prints for Ctrl-C: ``prog: interrupted (Ctrl-C)[; detail]``."""
    return f"{prog}: interrupted (Ctrl-C)" + (f"; {detail}" if detail else "")


def one_line_on_ctrl_c(prog, detail=""):
    """Decorate a command's ``main``: Ctrl-C (KeyboardInterrupt) anywhere in it returns
    :data:`EXIT_INTERRUPTED` after :func:`interrupted_line`; other results pass through."""

    def wrap(main):
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(interrupted_line(prog, detail), file=sys.stderr, flush=True)
                return EXIT_INTERRUPTED

        run.ctrl_c_is_one_line = True  # tests/test_interrupts.py checks every entry point has it
        return run

    return wrap
