"""Which dataset and options made a data folder (``--dest``), and whether a run may replace it.

A finished data folder's marker (:data:`~.steps.MARKER`) holds its making record: the dataset
and the options that change its contents (``--from``, BPE merges, cleaning and cutting lengths,
languages). :func:`check_dest` runs before any step, so that a ``--dest`` this run must not
replace, or a ``--dest`` or ``--work`` it cannot write, is refused in one line before minutes or
hours of work: a file; a read-only folder; a non-empty folder data-prep did not make; a data folder made for another dataset or with other options, unless
``--force``. The same command run again finds the same record and resumes or skips as before.
"""

import json
from pathlib import Path

from man_recipes.paths import output_folder_problem
from man_recipes.data.dataprep import PrepError
from man_recipes.data.steps import MARKER, is_ours


def add_force_option(parser):
    """A data-prep command's ``--force``: what :func:`check_dest` reads."""
    parser.add_argument("--force", action="store_true",
                        help="replace a --dest that data-prep made for another dataset or with other options "
                             "(default: refused before any step)")

MADE_BY = "man-fairseq data-prep"


def making_record(dataset, **options):
    """The record of a data folder made for ``dataset`` with ``options`` (JSON values)."""
    return {"made_by": MADE_BY, "dataset": dataset, "options": json.loads(json.dumps(options, default=str))}


def read_record(folder):
    """The making record in ``folder``'s marker, or None (no marker, or one written before data
    folders recorded what made them: a line of text)."""
    try:
        record = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "dataset" in record else None


def write_record(folder, record):
    (Path(folder) / MARKER).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def made_by_work(work, dest):
    """Whether the binarize step of the ``--work`` folder ``work`` last wrote ``dest`` (its stamp)."""
    try:
        stamp = json.loads((Path(work) / ".binarize.done").read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("options") or {}).get("dest") == str(Path(dest).absolute())


def _options(record):
    return ", ".join(f"{k} {v}" for k, v in sorted(record["options"].items())) or "no options"


def differences(old, new):
    """What differs between two making records, in words; None when they agree."""
    if old["dataset"] != new["dataset"]:
        return f"it holds {old['dataset']} data, this run prepares {new['dataset']}"
    a, b = old.get("options") or {}, new["options"]
    changed = [f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return f"it holds {old['dataset']} data made with other options ({'; '.join(changed)})" if changed else None


def refuse_replacing(dest, old, new):
    """Raise the one-line refusal to replace ``dest`` (made as ``old`` says) by ``new``'s data."""
    raise PrepError(f"--dest {dest} is a finished data folder and {differences(old, new)}; refusing to "
                    "replace it. Choose another --dest, or pass --force to replace it.")


def _dataset_of_manifest(path):
    """The dataset a data record ``<dataset>.json`` (:mod:`.manifest`) names, or None."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest.get("dataset") if isinstance(manifest, dict) else None


def check_dest(dest, record, force=False, work=None):
    """Refuse a ``--dest`` this run must not replace, before any step (see the module's doc).

    A folder made by a data-prep that did not record what made it is accepted when the ``--work``
    folder ``work`` made it (its binarize stamp names it) and no record of another dataset
    (``<dataset>.json``) is in it; otherwise it is refused unless ``force``."""
    dest = Path(dest).absolute()
    for flag, folder in (("--dest", dest), ("--work", work)):
        problem = folder is not None and output_folder_problem(folder)
        if problem:  # checked before the first step: binarizing came after the tokenization and BPE
            raise PrepError(f"{flag} {folder}: {problem}; nothing was prepared")
    if not dest.exists():
        return
    if not any(dest.iterdir()):
        return
    if not is_ours(dest):
        raise PrepError(f"--dest {dest} exists, is not empty and was not made by data-prep (no {MARKER}); "
                        "refusing to replace it. Choose another --dest or remove it yourself.")
    if force:
        return
    old = read_record(dest)
    if old is not None:
        if differences(old, record):
            refuse_replacing(dest, old, record)
        return
    others = sorted(d for d in map(_dataset_of_manifest, dest.glob("*.json")) if d and d != record["dataset"])
    if others:
        refuse_replacing(dest, {"dataset": others[0], "options": {}}, record)
    only_marker = {p.name for p in dest.iterdir()} <= {MARKER}
    if not only_marker and not (work is not None and made_by_work(work, dest)):
        raise PrepError(f"--dest {dest} holds data made by an older data-prep, which did not record its "
                        f"dataset and options, and not by --work {work}; refusing to replace it with "
                        f"{record['dataset']} data ({_options(record)}). Choose another --dest, or pass "
                        "--force to replace it.")
