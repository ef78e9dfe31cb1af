"""A prepared data folder's record (``<dest>/<dataset>.json``): what the studies read.

Written by data-prep next to the binarized data: the dataset, its test sets (binarized split name
-> the release's name), the pair counts after preparation and as read from the release, the
standard counts and whether these differ (a sample or subset, named when it is a known one), the
subword model and the preparation options. ``scripts/reproduce.sh`` reads it to know what to decode and score.
"""

import json
from pathlib import Path

from man_recipes.corpora import CORPORA
from man_recipes.data.dataprep import PrepError


def manifest_path(dest, dataset):
    return Path(dest) / f"{dataset}.json"


def write_manifest(dest, dataset, src, tgt, counts, release_counts, standard_counts, test_sets, subword=None,
                   dev_sets=None, **options):
    """Write ``<dest>/<dataset>.json``; returns its path. ``subword``: the folder's subword model
    (:func:`.subword.subword_record`). ``dev_sets`` (binarized split name -> what it is): dev sets
    whose raw references and sources data-prep also copied, to score a checkpoint on them; the
    studies decode the ``test_sets`` only."""
    # a subset the corpus knows by name (its release counts: train, valid, test, as read before cleaning)
    known = CORPORA[dataset].known_subsets if dataset in CORPORA else {}
    key = tuple(release_counts.get(s) for s in ("train", "valid", "test"))
    nonstandard = any(release_counts.get(k) != v for k, v in standard_counts.items() if v is not None)
    manifest = {
        "dataset": dataset, "source_lang": src, "target_lang": tgt, "test_sets": dict(test_sets),
        "counts": counts, "release_counts": release_counts, "standard_counts": standard_counts,
        "nonstandard": nonstandard,
        "subset": known.get(key, "a nonstandard sample" if nonstandard else "the standard splits"),
        "references": {split: f"{split}.raw.{tgt}" for split in [*test_sets, *(dev_sets or {})]},
        "sources": {split: f"{split}.raw.{src}" for split in [*test_sets, *(dev_sets or {})]},
        "options": options,
    }
    if subword is not None:
        manifest["subword"] = subword
    if dev_sets:
        manifest["dev_sets"] = dict(dev_sets)
    path = manifest_path(dest, dataset)
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def read_manifest(data, dataset, prepare_command):
    """The record of the data folder ``data``; a clear error naming ``prepare_command``, the command
    that makes it (``--dest`` included)."""
    path = manifest_path(data, dataset)
    if not path.is_file():
        raise PrepError(f"{data}: no {path.name}; prepare the data first: {prepare_command}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PrepError(f"{path}: not a readable data record ({e}); prepare the data again") from e
