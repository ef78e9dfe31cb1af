"""Durable per-run records of a study (``scripts/reproduce.sh``): one small JSON file per run.

A record is written when a run has trained *and* been scored, under ``RESULTS/<experiment>/``:
``<family>-seed<N>.json`` (scores on every test set, validation loss per epoch, the exact
commands, the config fingerprint, commit, seconds, CPU model, threads) and
``<family>-seed<N>.<subset>.hyp`` (the detokenized hypotheses, which the paired bootstrap reads).
They are small enough to commit run by run, so a study advances across machines and restarts;
the table (:mod:`study_table`) is rebuilt from them alone.

The **fingerprint** is a hash of everything that decides what a run trains and how it is scored:
the resolved config (architecture, model, training and evaluation options), the extra fairseq
options, the seed and the data's dictionaries. A record whose fingerprint differs from what
today's config gives is *stale*: it is never mixed into the table and never stops a retrain.
"""

import hashlib
import json
import os
from pathlib import Path

RECORD_VERSION = 1
# the config keys that decide training and scoring (not name, notes, paths)
FINGERPRINT_KEYS = ("arch", "task", "source_lang", "target_lang", "model", "train", "batch", "eval")


class RecordError(ValueError):
    pass


def config_fingerprint(cfg, fairseq_args, seed, data=None):
    """sha256 (16 hex digits) of the config's training/scoring content, the extra options, the
    seed and, when ``data`` is given, the data-bin's dictionaries."""
    content = {k: cfg.get(k) for k in FINGERPRINT_KEYS}
    content["fairseq_args"] = [str(a) for a in fairseq_args]
    content["seed"] = int(seed)
    if data is not None:
        content["dictionaries"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                   for p in sorted(Path(data).glob("dict.*.txt"))}
    blob = json.dumps(content, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def run_id(family, seed):
    return f"{family}-seed{seed}"


def record_path(records_dir, family, seed):
    return Path(records_dir) / f"{run_id(family, seed)}.json"


def hypothesis_path(records_dir, family, seed, subset):
    return Path(records_dir) / f"{run_id(family, seed)}.{subset}.hyp"


def _write_atomic(path, text):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_record(records_dir, record, hypotheses):
    """Write ``record`` and its hypotheses ({subset: [lines]}); the JSON last, so a record on disk
    always has its hypothesis files."""
    records_dir = Path(records_dir)
    records_dir.mkdir(parents=True, exist_ok=True)
    missing = [k for k in ("family", "seed", "fingerprint", "test_sets") if k not in record]
    if missing:
        raise RecordError(f"record lacks {missing}")
    if set(hypotheses) != set(record["test_sets"]):
        raise RecordError(f"hypotheses for {sorted(hypotheses)}, scores for {sorted(record['test_sets'])}")
    for subset, lines in hypotheses.items():
        n = record["test_sets"][subset]["n_sentences"]
        if len(lines) != n:
            raise RecordError(f"{subset}: {len(lines)} hypotheses for {n} sentences")
        _write_atomic(hypothesis_path(records_dir, record["family"], record["seed"], subset), "\n".join(lines) + "\n")
    path = record_path(records_dir, record["family"], record["seed"])
    _write_atomic(path, json.dumps(dict(record, version=RECORD_VERSION), indent=1) + "\n")
    return path


def read_record(path):
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not a readable record ({e})") from e
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        raise RecordError(f"{path}: not a version-{RECORD_VERSION} run record")
    return record


def read_records(records_dir):
    """Every record in ``records_dir`` (sorted by family, seed); a missing folder has none."""
    records_dir = Path(records_dir)
    if not records_dir.is_dir():
        return []
    records = [read_record(p) for p in sorted(records_dir.glob("*-seed*.json"))]
    return sorted(records, key=lambda r: (r["family"], r["seed"]))


def read_hypotheses(records_dir, record, subset):
    path = hypothesis_path(records_dir, record["family"], record["seed"], subset)
    if not path.is_file():
        raise RecordError(f"{path}: missing (the record {record_path(records_dir, record['family'], record['seed'])} "
                          "refers to it)")
    return path.read_text(encoding="utf-8").splitlines()


def matching_record(records_dir, family, seed, fingerprint):
    """The record of (family, seed) if it exists and has ``fingerprint``; else None."""
    path = record_path(records_dir, family, seed)
    if not path.is_file():
        return None
    record = read_record(path)
    return record if record.get("fingerprint") == fingerprint else None


def partition(records, expected):
    """(current, stale): ``expected`` maps (family, seed) to today's fingerprint. A record is current
    only when its (family, seed) is expected and its fingerprint matches."""
    current, stale = [], []
    for r in records:
        fp = expected.get((r["family"], r["seed"]))
        (current if fp is not None and r.get("fingerprint") == fp else stale).append(r)
    return current, stale
