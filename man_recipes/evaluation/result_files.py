"""``RUN/results.json`` and ``RUN/results.md``: what ``scripts/evaluate.sh RUN`` leaves behind.

A failed evaluation never leaves an earlier result looking current: when an evaluation starts,
the result files are renamed ``results.previous.json`` / ``results.previous.md`` (nothing is lost,
and ``results_table.py`` reads only ``results.json``); the new ones are written whole (temporary
file, then rename) once every score is computed, and only then are the previous ones removed.

The config's subset (``eval.gen_subset``, the test set) is scored into ``results.json`` / ``.md``,
the only ones the tables read; another ``--subset S`` (the dev set) into ``results.S.json`` / ``.md``,
beside them. A result file of another subset (written before this split) is not replaced without
``--force``.
"""

import json
import os
from pathlib import Path

from man_recipes.tables import markdown_table
from man_recipes.atomic import write_text

RESULT_FILES = ("results.json", "results.md")


def result_names(subset, config_subset):
    """The result files of an evaluation of ``subset``: ``results.json`` / ``.md`` for the config's own
    ``config_subset``, ``results.<subset>.json`` / ``.md`` beside them for another."""
    if subset == config_subset:
        return RESULT_FILES
    return tuple(f"results.{subset}.{ext}" for ext in ("json", "md"))


def previous_path(run, name):
    return Path(run) / name.replace("results.", "results.previous.", 1)


def subset_of(path):
    """The subset the result file ``path`` scored, or None (unreadable, or not a result)."""
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return result.get("subset") if isinstance(result, dict) else None


def retire(run, subset, names=RESULT_FILES, force=False):
    """Rename RUN's result files ``names`` to ``results.previous.*``, so that from now on a failure
    leaves no result that looks current; returns the new paths.

    A ``results.previous.*`` beside the file it would replace is not one this module left (a
    success removes them): FileExistsError, and nothing is moved. So is a result of another subset
    than ``subset`` (dev scores are not written over test scores) unless ``force``."""
    json_name = names[0]
    held = subset_of(Path(run) / json_name)  # None: no file, or one that does not say (replaced as before)
    if held not in (None, subset) and not force:
        raise FileExistsError(f"{Path(run) / json_name} holds the scores of `{held}`, not of `{subset}`; "
                              "refusing to replace them: move it away first, or pass --force")
    for name in names:
        if (Path(run) / name).is_file() and previous_path(run, name).exists():
            raise FileExistsError(f"{previous_path(run, name)} exists beside {name}; evaluate.sh keeps one earlier "
                                  "result there: move one of them away first")
    moved = []
    for name in names:
        if (Path(run) / name).is_file():
            os.replace(Path(run) / name, previous_path(run, name))
            moved.append(previous_path(run, name))
    return moved


def write(run, result, names=RESULT_FILES):
    """The result files ``names`` (JSON, Markdown), each written whole (:func:`man_recipes.atomic.write_text`); then
    the previous ones, moved aside by :func:`retire`, are removed."""
    for name, text in zip(names, (json.dumps(result, indent=2) + "\n", to_markdown(result))):
        write_text(Path(run) / name, text)
    for name in names:
        previous_path(run, name).unlink(missing_ok=True)


def config_fields(cfg, run, run_info, data, subset):
    """The result's fields that come from the config and the run's record, not from decoding;
    built before decoding, so a config that cannot be reported stops the evaluation early."""
    return {
        # table / row: a paper row's place; none for an experiment config (`paper: none`, e.g. Multi30k)
        "name": cfg["name"], "config": cfg.get("_path", str(Path(run) / "config.yaml")),
        "paper": cfg["paper"], "table": cfg.get("table"), "row": cfg.get("row"), "dataset": cfg["dataset"],
        "subset": subset, "paper_results": cfg.get("paper_results") or {},
        # provenance: what results_table.py needs to tell a paper-comparable run from another
        "data": str(data), "config_data": str(cfg["data"]),
        "overrides": run_info.get("overrides"), "world_size": run_info.get("world_size"),
        "effective_batch_tokens": run_info.get("effective_batch_tokens"),
        "paper_effective_batch_tokens": run_info.get("paper_effective_batch_tokens"),
        "run_config": {k: cfg.get(k) for k in ("arch", "model", "train", "batch")},
    }


def to_markdown(result):
    lines = [f"# {result['name']}", "", f"- config: `{result['config']}`",
             f"- checkpoint: `{result['checkpoint']}` (average of {len(result['averaged'])}: "
             + ", ".join(Path(p).name for p in result["averaged"]) + ")",
             f"- subset: {result['subset']} ({result['n_sentences']} sentences)",
             f"- data: `{result.get('data')}`; {result.get('num_updates')} updates"
             + (f"; fairseq overrides: `{' '.join(result['overrides'])}`" if result.get("overrides") else ""),
             ""]
    paper = result.get("paper_results") or {}
    lines += markdown_table(["metric", "ours", "paper"],
                            [[key, f"{value}", f"{paper[key]}" if paper.get(key) is not None else "–"]
                             for key, value in result["scores"].items()])
    for key, value in result.get("details", {}).items():
        if isinstance(value, str):
            lines.append(f"\n{key}: {value}")
    return "\n".join(lines) + "\n"
