"""Work folders that commands create and may clean again: never anything else.

A command that writes into a folder (``scripts/demo.py --out``, ``make smoke``) records there,
in a marker file, every entry it creates. On a later run it removes only those entries; a
non-empty folder without the marker is someone else's and is refused, and the command's input
may not lie inside it. ``try_lock`` lets one process at a time own a folder a long job writes into.
"""

import contextlib
import fcntl
import shutil
from pathlib import Path

from man_recipes.paths import output_folder_problem

MARKER = ".man-fairseq-created"


def prepare_out_dir(out, inputs=(), command="this command"):
    """Make ``out`` ready for a run and return it (resolved); see the module docstring."""
    out = Path(out).resolve()
    for given in inputs:
        if given is None:
            continue
        given = Path(given).resolve()
        if given == out or out in given.parents:
            raise SystemExit(f"{command}: the input {given} lies inside the output folder {out}; "
                             "choose another output folder (nothing is written next to your data)")
    marker = out / MARKER
    if out.exists() and not out.is_dir():
        raise SystemExit(f"{command}: {out} exists and is not a folder")
    if problem := output_folder_problem(out):  # read-only: one line now, not a traceback after the work
        raise SystemExit(f"{command}: {out}: {problem}")
    if out.is_dir() and any(out.iterdir()):
        if not marker.is_file():
            raise SystemExit(f"{command}: {out} is not empty and was not created by {command} "
                             f"(no {MARKER} in it); pass an empty or new folder")
        for name in marker.read_text().split():
            target = out / name
            if name in (".", "..") or "/" in name or not (target.exists() or target.is_symlink()):
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text("")
    return out


def created(out, *names):
    """Record in ``out``'s marker that these entries (direct children) were written by us."""
    marker = Path(out) / MARKER
    known = marker.read_text().split()
    marker.write_text("".join(n + "\n" for n in dict.fromkeys(known + [str(n) for n in names])))


@contextlib.contextmanager
def try_lock(path):
    """Take the lock file ``path`` (created if missing) for the block without waiting; yields whether
    this process holds it. The lock goes with the file's close, also when the process dies."""
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
