"""The stamped, resumable steps of the data-preparation recipes and the folders data-prep owns.

Every step is idempotent: it writes its outputs, then a stamp file ``.<step>.done`` in the work
directory that records what the step was built from (options, input sizes and mtimes, the step
before it); a second run skips a step whose stamp still matches and redoes the rest, and an
interrupted step (no stamp) is redone from its inputs; Ctrl-C is :class:`Interrupted`, which the
commands print as one line. Only folders data-prep made (marked with ``.man-fairseq-prep``) or
empty ones are written into or replaced.
"""

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from man_recipes.data.dataprep import PrepError, log
from man_recipes.atomic import write_text
from man_recipes.workdir import try_lock


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the step ``step`` (:meth:`Steps.run`), for the one line the command prints."""

    def __init__(self, step):
        super().__init__(step)
        self.step = step


def interrupted_message(e):
    """The line a data-prep command prints for Ctrl-C (exit status 130): what was interrupted and how to resume."""
    step = f" during step {e.step}" if isinstance(e, Interrupted) else ""
    return (f"interrupted{step}; the finished steps are kept (an unfinished one leaves no stamp and is redone): "
            "run the same command again to resume")


def run_command(prepare):
    """A preparation as a data-prep command's exit status: ``prepare()`` returns the binarized folder,
    logged (0); a :class:`PrepError` is one ``ERROR:`` line (2), Ctrl-C :func:`interrupted_message` (130)."""
    try:
        dest = prepare()
    except PrepError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(interrupted_message(e), file=sys.stderr)
        return 130
    log(f"binarized data: {dest}")
    return 0


# Folders data-prep creates (--work, --dest, their temporary siblings) carry this file; only
# such folders (or empty ones) are ever written into, replaced or removed.
MARKER = ".man-fairseq-prep"
# Part of every stamp: a change in how a step computes its output makes old stamps stale.
# 2: tokenizer.perl-identical tokenization, clean-corpus-n rules, stamps with inputs/options.
RECIPE_VERSION = 2


def claim_folder(path, what):
    """Create ``path`` (marked as ours) or accept it if it is ours or empty; refuse otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PrepError(f"{what} {path} is a file, not a folder")
    if path.is_dir() and not (path / MARKER).is_file() and any(path.iterdir()):
        raise PrepError(f"{what} {path} is not empty and was not made by data-prep (no {MARKER} in it); "
                        "refusing to write into it. Choose another folder or empty it.")
    path.mkdir(parents=True, exist_ok=True)
    if not (path / MARKER).is_file():  # an existing marker is left as it is (a folder in use, a data record)
        (path / MARKER).write_text(f"made by man-fairseq data-prep (pid {os.getpid()})\n")
    return path


@contextlib.contextmanager
def work_lock(work):
    """Own the --work folder while a preparation runs, or refuse: two preparations sharing one (the
    default is one per dataset, whatever --from and --dest) would rewrite each other's intermediate
    files between steps, and one could binarize the other's text with exit status 0."""
    with try_lock(claim_folder(work, "--work") / ".lock") as ours:
        if not ours:
            raise PrepError(f"--work {work} is in use by another preparation still running; wait for it "
                            "to end, or give this one its own --work folder")
        yield


def is_ours(path):
    return (Path(path) / MARKER).is_file()


def signature(path):
    """What a step's input is, cheaply: size and mtime of a file; for a folder, the number,
    total size and latest mtime of the files under it (a changed, added or removed file shows)."""
    path = Path(path)
    if path.is_file():
        st = path.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if path.is_dir():
        n = size = latest = 0
        for root, _, files in os.walk(path):
            for name in files:
                try:
                    st = os.stat(os.path.join(root, name))
                except OSError:
                    continue
                n, size, latest = n + 1, size + st.st_size, max(latest, st.st_mtime_ns)
        return {"files": n, "size": size, "latest_mtime_ns": latest}
    return None


class Steps:
    """Named steps with stamps ``<work>/.<step>.done`` that record what the step was built from.

    A stamp holds the step's options (those that change its output: --from, BPE merges,
    --dest...), the signatures of its ``inputs`` and a digest of the stamp of the step before
    it, so a step reruns when its options or inputs changed, when any earlier step reran, or
    when one of its ``outputs`` is gone; a failed step leaves no stamp and reruns.
    """

    def __init__(self, work_dir):
        self.work = claim_folder(work_dir, "--work")
        self.previous = ""  # digest of the previous step's stamp

    def stamp_path(self, name):
        return self.work / f".{name}.done"

    def done(self, name):
        """Whether ``name`` has a stamp (current or stale: :meth:`run` decides which)."""
        return self.stamp_path(name).is_file()

    def run(self, name, fn, *args, inputs=(), options=None, outputs=(), **kwargs):
        record = {"recipe": RECIPE_VERSION, "after": self.previous,
                  "options": json.loads(json.dumps(options or {}, default=str)),
                  "inputs": {str(p): signature(p) for p in inputs}}
        stamp = self.stamp_path(name)
        old = None
        if stamp.is_file():
            try:
                old = json.loads(stamp.read_text())
            except ValueError:
                old = {}
            why = self._stale(old, record, outputs)
            if not why:
                log(f"skip  {name} (done; delete {stamp} to redo)")
                self.previous = hashlib.sha256(stamp.read_bytes()).hexdigest()
                return None
            log(f"redo  {name}: {why}")
            stamp.unlink()  # our own stamp: the step is not done until it finishes again
        log(f"start {name}")
        t0 = time.time()
        try:
            out = fn(*args, **kwargs)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            raise Interrupted(name) from None
        record["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        write_text(stamp, json.dumps(record, indent=1, sort_keys=True) + "\n")
        self.previous = hashlib.sha256(stamp.read_bytes()).hexdigest()
        log(f"done  {name} ({time.time() - t0:.1f}s)")
        return out

    @staticmethod
    def _stale(old, new, outputs):
        if old.get("recipe") != new["recipe"]:
            return "made by an older version of the recipe"
        if old.get("options") != new["options"]:
            changed = sorted(k for k in set(old.get("options", {})) | set(new["options"])
                             if old.get("options", {}).get(k) != new["options"].get(k))
            return "options changed: " + ", ".join(
                f"{k} {old.get('options', {}).get(k)!r} -> {new['options'].get(k)!r}" for k in changed)
        if old.get("inputs") != new["inputs"]:
            changed = sorted(k for k in set(old.get("inputs", {})) | set(new["inputs"])
                             if old.get("inputs", {}).get(k) != new["inputs"].get(k))
            return "input changed: " + ", ".join(changed)
        if old.get("after") != new["after"]:
            return "an earlier step was redone"
        missing = [str(p) for p in outputs if not Path(p).exists()]
        if missing:
            return "output missing: " + ", ".join(missing)
        return None


def check_paths(args):
    """--work, --dest and --from must not overlap where it could lose data or serve stale data:
    --dest is replaced as a whole, <work>/orig is emptied before staging, and a --from folder
    holding --work would change with every run."""
    work, dest = Path(args.work).absolute().resolve(), Path(args.dest).absolute().resolve()
    pairs = [("--work", work, "--dest", dest, True)]
    if args.from_path:
        src = Path(args.from_path).expanduser().resolve()
        pairs += [("--from", src, "--dest", dest, True), ("--from", src, "--work", work / "orig", True),
                  ("--from", src, "--work", work, False)]
    for name_a, a, name_b, b, both_ways in pairs:
        if a == b or b.is_relative_to(a) or (both_ways and a.is_relative_to(b)):
            raise PrepError(f"{name_a} {a} and {name_b} {b} overlap; use separate folders")
