"""Files written whole or not at all: the one writer of the recipes, the scripts and the lab.

The text goes to a temporary file of its own beside the destination (a name no one else's file has:
the process id and a random part, created with "x" so an existing file is never written into), which
is renamed over the destination when complete and removed when the write fails or is interrupted: a
reader sees the old file or the new one, never half of one."""

import contextlib
import os
import secrets
from pathlib import Path


@contextlib.contextmanager
def replacing(path, mode="w"):
    """A file opened for writing (``mode`` "w" text in UTF-8, or "wb") that becomes ``path`` when the
    ``with`` block ends without an exception."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    f = open(tmp, mode.replace("w", "x"), **({} if "b" in mode else {"encoding": "utf-8"}))
    try:
        with f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path, text):
    """``text`` as the UTF-8 file ``path``, written whole."""
    with replacing(path) as f:
        f.write(text)
