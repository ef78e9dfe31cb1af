"""``RUN/results.json`` and ``RUN/results.md``: what ``scripts/evaluate.sh RUN`` leaves behind.

A failed evaluation never leaves an earlier result looking current: when an evaluation starts,
the result files are renamed ``results.previous.json`` / ``results.previous.md`` (nothing is lost,
and ``results_table.py`` reads only ``results.json``); the new ones are written whole (temporary
file, then rename) once every score is computed, and only then are the previous ones removed.
"""

import json
import os
from pathlib import Path

from ...tables import markdown_table
from .steps import record

RESULT_FILES = ("results.json", "results.md")


def previous_path(run, name):
    return Path(run) / name.replace("results.", "results.previous.", 1)


def retire(run):
    """Rename RUN's result files to ``results.previous.*``, so that from now on a failure leaves
    no result that looks current; returns the new paths.

    A ``results.previous.*`` beside the file it would replace is not one this module left (a
    success removes them): FileExistsError, and nothing is moved."""
    for name in RESULT_FILES:
        if (Path(run) / name).is_file() and previous_path(run, name).exists():
            raise FileExistsError(f"{previous_path(run, name)} exists beside {name}; evaluate.sh keeps one earlier "
                                  "result there: move one of them away first")
    moved = []
    for name in RESULT_FILES:
        if (Path(run) / name).is_file():
            os.replace(Path(run) / name, previous_path(run, name))
            moved.append(previous_path(run, name))
    return moved


def write(run, result):
    """``results.json`` and ``results.md``, each written whole (:func:`.steps.record`); then the
    previous ones, moved aside by :func:`retire`, are removed."""
    for name, text in (("results.json", json.dumps(result, indent=2) + "\n"), ("results.md", to_markdown(result))):
        record(Path(run) / name, text)
    for name in RESULT_FILES:
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
