"""Durable per-run records of a study (``scripts/reproduce.sh``): one small JSON file per run.

A record is written when a run has trained *and* been scored, under ``RESULTS/<experiment>/``:
``<family>-seed<N>.json`` (scores on every test set, validation loss per epoch, the exact
commands, the config fingerprint, commit, seconds, CPU model, threads) and
``<family>-seed<N>.<subset>.hyp`` (the detokenized hypotheses, which the paired bootstrap reads).
They are small enough to commit run by run, so a study advances across machines and restarts;
the table (:mod:`study_table`) is rebuilt from them alone.

The **fingerprint** is a hash of everything that decides what a run trains and how it is scored:
the resolved config (architecture, model, training and evaluation options), the extra fairseq
options, the seed, the data's dictionaries and the options of ``scripts/reproduce.sh`` that change
a score (:func:`run_options`). A record whose fingerprint differs from what today's config and
options give is *stale*: it is never mixed into the table and never stops a retrain.
"""

import hashlib
import json
import math
from pathlib import Path

from man_recipes.rouge155 import DEFAULT_EXCEPTION_DB
from man_recipes.atomic import write_text as record_file
from man_recipes.studies.convergence import stop_fields_disagreement

RECORD_VERSION = 1
# the config keys that decide training and scoring (not name, notes, paths)
FINGERPRINT_KEYS = ("arch", "task", "source_lang", "target_lang", "model", "train", "batch", "eval")
# what a run folder's fingerprint hashes: what is trained (the config's `eval` only changes the scoring,
# so a run trained alike is rescored, not retrained, when it changes)
TRAINING_KEYS = tuple(k for k in FINGERPRINT_KEYS if k != "eval")
# The options of scripts/reproduce.sh that change a score without being in the config, at the values
# every record before they were fingerprinted was made with (avg_last: the config's eval.avg_last,
# itself fingerprinted; precision: fp32, what CPU training and decoding use whatever --precision
# says). A fingerprint carries only the options that differ from these, so such a record keeps the
# hash it was written with and any other value gives another fingerprint.
DEFAULT_RUN_OPTIONS = {"batch_size": 128, "device": "cpu", "precision": "fp32"}
# options that change the scores but not the training: a trained run is rescored, not retrained
SCORING_OPTIONS = ("avg_last", "batch_size")
# what the table reads of a record (study_table.py) and of each of its test sets
RECORD_FIELDS = ("family", "seed", "fingerprint", "arch", "params", "train_seconds", "updates", "valid_curve",
                 "test_sets")
TEST_SET_FIELDS = ("name", "n_sentences", "sacrebleu", "bleu_tok_ci", "sacrebleu_signature")
# ... of a ROUGE study's test set (summarization_table.py), told apart by its rouge1
ROUGE_TEST_SET_FIELDS = ("name", "n_sentences", "rouge1", "rouge2", "rougeL", "rouge_order", "exception_db",
                         "rouge_implementation")
# the fields the tables compute with, and whether each must be a whole number: a record edited or damaged
# by hand (a score as text, a NaN, null seconds) is refused by name, never a traceback or a table of nan
NUMBER_FIELDS = {"params": True, "train_seconds": False, "updates": True}
TEST_SET_NUMBER_FIELDS = {"n_sentences": True, "sacrebleu": False, "bleu_tok_ci": False, "rouge1": False,
                          "rouge2": False, "rougeL": False}


# How --no-repeat-ngram-size was applied in decoding, in the fingerprint of every record whose config
# blocks n-grams: records decoded before the plugin (patches/ngram_blocking) restored the blocking on CPU (fairseq's Python
# fallback blocked nothing) lack it, so they are stale and rescored from their checkpoints.
NGRAM_BLOCKING = "as fairseq's CUDA kernel"


class RecordError(ValueError):
    pass


def run_options(cfg, avg_last=None, batch_size=128, device="cpu", precision="fp16"):
    """The resolved options of scripts/reproduce.sh that decide a run's scores: the epoch checkpoints
    averaged (``--avg-last``, default the config's), fairseq-generate's ``--batch-size``, the
    ``--device`` and the precision it really runs in (fp32 on CPU)."""
    return {"avg_last": int(avg_last or (cfg.get("eval") or {}).get("avg_last", 5)), "batch_size": int(batch_size),
            "device": device, "precision": "fp32" if device == "cpu" else precision}


def training_options(options):
    """The part of :func:`run_options` that changes what is trained (the run folder's fingerprint)."""
    return {k: v for k, v in options.items() if k not in SCORING_OPTIONS}


def config_fingerprint(cfg, fairseq_args, seed, data=None, options=None, keys=FINGERPRINT_KEYS):
    """sha256 (16 hex digits) of the config's ``keys`` (its training and scoring content), the extra
    options, the seed, when ``data`` is given the data-bin's dictionaries, and those of ``options``
    (:func:`run_options`) that differ from :data:`DEFAULT_RUN_OPTIONS`."""
    content = {k: cfg.get(k) for k in keys}
    content["fairseq_args"] = [str(a) for a in fairseq_args]
    content["seed"] = int(seed)
    defaults = dict(DEFAULT_RUN_OPTIONS, avg_last=(cfg.get("eval") or {}).get("avg_last", 5))
    changed = {k: v for k, v in (options or {}).items() if k not in defaults or v != defaults[k]}
    if changed:  # absent at the defaults: the hash of every record made before this key existed
        content["run_options"] = changed
    if "eval" in keys and (cfg.get("eval") or {}).get("no_repeat_ngram_size"):
        content["ngram_blocking"] = NGRAM_BLOCKING
    if data is not None:
        content["dictionaries"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                   for p in sorted(Path(data).glob("dict.*.txt"))}
    blob = json.dumps(content, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def record_fingerprint(cfg, args, seed, training=False):
    """The fingerprint of the (config, seed) run under scripts/reproduce.sh's ``args``: of its record,
    or with ``training`` of its run folder (without the config's ``eval`` and the options that change
    scores only: a run trained alike is rescored, not retrained)."""
    options = run_options(cfg, args.avg_last, args.batch_size, args.device, args.precision)
    if training:
        return config_fingerprint(cfg, args.fairseq_args, seed, args.data, training_options(options), TRAINING_KEYS)
    return config_fingerprint(cfg, args.fairseq_args, seed, args.data, options)


def legacy_training_fingerprint(cfg, args, seed):
    """A run folder's fingerprint as written before it left out the config's ``eval``: such a folder
    of today's config is the same training (its stamp is rewritten), not another config's."""
    options = run_options(cfg, args.avg_last, args.batch_size, args.device, args.precision)
    return config_fingerprint(cfg, args.fairseq_args, seed, args.data, training_options(options))


def option_flags(args, default_device=None):
    """scripts/reproduce.sh's flags in ``args`` that change a score, where not at their default."""
    flags = [f"--avg-last {args.avg_last}"] if args.avg_last else []
    flags += [f"--batch-size {args.batch_size}"] if args.batch_size != DEFAULT_RUN_OPTIONS["batch_size"] else []
    flags += [f"--device {args.device}"] if args.device != (default_device or "cpu") else []
    flags += [f"--precision {args.precision}"] if args.device != "cpu" else []
    flags += [f"--test-sample {args.test_sample}"] if getattr(args, "test_sample", None) is not None else []
    exception_db = getattr(args, "rouge_exception_db", None)
    flags += [f"--rouge-exception-db {exception_db}"] if exception_db not in (None, DEFAULT_EXCEPTION_DB) else []
    return "".join(" " + f for f in flags)


def run_id(family, seed):
    return f"{family}-seed{seed}"


def record_path(records_dir, family, seed):
    return Path(records_dir) / f"{run_id(family, seed)}.json"


def hypothesis_path(records_dir, family, seed, subset):
    return Path(records_dir) / f"{run_id(family, seed)}.{subset}.hyp"


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
        record_file(hypothesis_path(records_dir, record["family"], record["seed"], subset), "\n".join(lines) + "\n")
    path = record_path(records_dir, record["family"], record["seed"])
    record_file(path, json.dumps(dict(record, version=RECORD_VERSION), indent=1) + "\n")
    return path


def read_record(path):
    """The record in ``path``; RecordError naming the file and what is wrong with it."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not a readable record ({e}); truncated? restore it (git checkout) "
                          "or remove it and rerun that run") from e
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        raise RecordError(f"{path}: not a version-{RECORD_VERSION} run record")
    missing = [k for k in RECORD_FIELDS if k not in record]
    if missing:
        raise RecordError(f"{path}: the record lacks {', '.join(missing)}")
    if not isinstance(record["seed"], int) or not isinstance(record["test_sets"], dict):
        raise RecordError(f"{path}: seed {record['seed']!r} or test_sets is not what a record holds")
    if path.name != f"{run_id(record['family'], record['seed'])}.json":
        raise RecordError(f"{path}: holds the record of {run_id(record['family'], record['seed'])}, "
                          "not of the run its name says")
    disagreement = stop_fields_disagreement(record)
    if disagreement:  # edited by hand: caught like an edited score (check_score)
        raise RecordError(f"{path}: {disagreement}; restore it (git checkout) or rerun that run (--force)")
    for subset, result in record["test_sets"].items():
        fields = ROUGE_TEST_SET_FIELDS if isinstance(result, dict) and "rouge1" in result else TEST_SET_FIELDS
        missing = [k for k in fields if not isinstance(result, dict) or k not in result]
        if missing:
            raise RecordError(f"{path}: test set {subset} lacks {', '.join(missing)}")
    for where, fields, values in [("", NUMBER_FIELDS, record)] + [
            (f"test set {subset}: ", TEST_SET_NUMBER_FIELDS, result) for subset, result in record["test_sets"].items()]:
        for key, whole in fields.items():
            if key in values and not _number(values[key], whole):
                raise RecordError(f"{path}: {where}its {key} is {values[key]!r}, not a {'whole' if whole else 'finite'} "
                                  "number >= 0; restore it (git checkout) or rerun that run (--force)")
    return record


def _number(value, whole):
    """Whether ``value`` is a finite number >= 0 (an int where ``whole``), as JSON gives it."""
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return False
    return math.isfinite(value) and value >= 0


def read_records(records_dir):
    """Every record in ``records_dir`` (sorted by family, seed); a missing folder has none."""
    records_dir = Path(records_dir)
    if not records_dir.is_dir():
        return []
    records = [read_record(p) for p in sorted(records_dir.glob("*-seed*.json"))]
    return sorted(records, key=lambda r: (r["family"], r["seed"]))


def read_hypotheses(records_dir, record, subset):
    """The hypotheses of ``record`` on ``subset``, as many as the record scored."""
    path = hypothesis_path(records_dir, record["family"], record["seed"], subset)
    json_path = record_path(records_dir, record["family"], record["seed"])
    if not path.is_file():
        raise RecordError(f"{path}: missing (the record {json_path} refers to it)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: not readable ({e})") from e
    n = record["test_sets"][subset]["n_sentences"]
    if len(lines) != n:
        raise RecordError(f"{path}: {len(lines)} hypotheses, but its record {json_path} scored {n} sentences "
                          "(cut short?); restore it (git checkout) or rerun that run")
    return lines


# how far a record's score may be from the score its hypotheses give again (both rounded to 2 decimals)
SCORE_TOLERANCE = 0.011


def check_score(records_dir, record, subset, key, rescored):
    """RecordError unless ``record``'s ``key`` score on ``subset`` is ``rescored``, what its stored
    hypotheses score again: a record edited by hand (or a hypothesis file swapped) never reaches a table."""
    stored = record["test_sets"][subset][key]
    if abs(stored - rescored) > SCORE_TOLERANCE:
        raise RecordError(
            f"{record_path(records_dir, record['family'], record['seed'])}: its {key} on {subset} is {stored:.2f}, but its "
            f"hypotheses ({hypothesis_path(records_dir, record['family'], record['seed'], subset).name}) score "
            f"{rescored:.2f}; restore both (git checkout) or rerun that run (--force)")


def data_identity(data):
    """What a run's scores were made on, kept in its record (``data_identity``) beside the fingerprint,
    which hashes it with the config: the data folder's subword model and a digest of its dictionaries."""
    from man_recipes.data.subword import read_subword

    dictionaries = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(data).glob("dict.*.txt"))}
    return {"subword": read_subword(data)["kind"],
            "dictionaries": hashlib.sha256(json.dumps(dictionaries, sort_keys=True).encode()).hexdigest()[:16]}


def record_data_identity(record):
    """A record's ``data_identity``; for one written before it, the subword model its decoding undid
    (fairseq-generate's ``--post-process sentencepiece`` or ``--remove-bpe``), its dictionaries unknown."""
    if isinstance(record.get("data_identity"), dict):
        return record["data_identity"]
    commands = [[str(w) for w in result.get("generate_command") or []] for result in record["test_sets"].values()]
    spm = any(c[i + 1:i + 2] == ["sentencepiece"] for c in commands for i, w in enumerate(c) if w == "--post-process")
    return {"subword": "sentencepiece" if spm else "bpe"}


def other_data(record, today):
    """How the data ``record`` was made on differs from ``today``'s (:func:`data_identity`), in words;
    None when nothing it records differs."""
    held = record_data_identity(record)
    changed = [f"{key} {held[key]}, this run's {today[key]}" for key in sorted(held)
               if key in today and held[key] != today[key]]
    return "; ".join(changed) or None


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
