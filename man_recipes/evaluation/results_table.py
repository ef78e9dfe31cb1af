"""Markdown tables laid out like the papers' tables: every row config, the paper's number
(read from the config: one source of truth) beside ours (read from ``RUN/results.json``)."""

import json
import sys
from collections import defaultdict
from pathlib import Path

from man_recipes.config import CONFIG_DIR, REPO, all_configs
from man_recipes.corpora import CORPORA, display_name, standard_test_size
from man_recipes.logging_setup import quiet_logging
from man_recipes.metrics import metric
from man_recipes.tables import markdown_table
from man_recipes.interrupt import one_line_on_ctrl_c

PAPER_TITLES = {
    "man": "Mask Attention Networks",
    "localness": "Modeling Localness for Self-Attention Networks",
    "diffwin": "Differentiable Window for Dynamic Local Attention",
    "calibration": "Attention Calibration for Transformer in NMT",
}
FAIRSEQ_BASELINES = {"transformer", "transformer_iwslt_de_en", "transformer_wmt_en_de",
                     "transformer_vaswani_wmt_en_de_big"}


class ResultsError(ValueError):
    """A results.json that cannot be tabulated; ``main`` prints it as one ``ERROR:`` line."""


def collect_runs(runs_dir):
    """{run directory: results dict} for every ``runs_dir/*/results.json`` (evaluate.sh writes it
    whole, or not at all; a results.previous.json, moved aside by a failed evaluation, is not read)."""
    found = {}
    for path in sorted(Path(runs_dir).glob("*/results.json")):
        try:
            res = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ResultsError(f"{path}: not a readable results file ({e}); rerun scripts/evaluate.sh "
                               f"{path.parent}") from e
        if not isinstance(res, dict) or not isinstance(res.get("scores"), dict):
            raise ResultsError(f"{path}: holds no scores; rerun scripts/evaluate.sh {path.parent}")
        res["_run"] = str(path.parent)
        found[str(path.parent)] = res
    return found


def _same_path(a, b):
    def norm(p):
        p = Path(p)
        return (p if p.is_absolute() else REPO / p).resolve()

    return norm(a) == norm(b)


def deviations(cfg, res):
    """How the run behind ``res`` (a results.json) differs from the config ``cfg``: a list of
    short reasons; empty for a run done as the config says (data, model, schedule, test set)."""
    if "overrides" not in res or "run_config" not in res:
        return ["no provenance (results.json written before data/overrides were recorded)"]
    out = []
    if res.get("overrides"):
        out.append("fairseq options overridden: `" + " ".join(res["overrides"]) + "`")
    if not _same_path(res["data"], cfg["data"]):
        out.append(f"data `{res['data']}` (config: `{cfg['data']}`)")
    run_cfg = res["run_config"]
    for key in ("arch", "model", "train", "batch"):
        if (run_cfg.get(key) or None) != (cfg.get(key) or None):
            out.append(f"config `{key}` changed since the run")
    max_update = (cfg.get("train") or {}).get("max-update")
    updates = res.get("num_updates")
    if max_update and (updates is None or updates < int(max_update)):
        out.append(f"{updates} updates (config: max-update {max_update})")
    max_epoch = (cfg.get("train") or {}).get("max-epoch")
    if max_epoch and not max_update and (res.get("epochs_completed") or 0) < int(max_epoch):
        out.append(f"{res.get('epochs_completed')} epochs (config: max-epoch {max_epoch})")
    if res.get("effective_batch_tokens") != res.get("paper_effective_batch_tokens"):
        out.append(f"effective batch {res.get('effective_batch_tokens')} tokens "
                   f"(paper: {res.get('paper_effective_batch_tokens')})")
    if res.get("subset") != (cfg.get("eval") or {}).get("gen_subset", "test"):
        out.append(f"evaluated on `{res.get('subset')}`")
    details = res.get("details") or {}
    implementation = details.get("rouge_implementation") or ""
    if implementation and details.get("rouge_exception_db") != "files2rouge":
        # the papers' ROUGE is files2rouge's: ROUGE-1.5.5 with its empty WordNet exception database
        # (results.json before the field: ROUGE-1.5.5 ran with the full WordNet database)
        how = ("rouge-score" if not implementation.startswith("ROUGE-1.5.5")
               else f"ROUGE-1.5.5 with the {details.get('rouge_exception_db') or 'wordnet'} exception database")
        out.append(f"ROUGE scored with {how}, not as files2rouge")
    standard_n = standard_test_size(cfg["dataset"])  # what data-prep produces: the papers' standard split
    if not res.get("n_sentences"):
        out.append("scored on no sentence")  # said once, not again as a test set of another size
    elif standard_n and res.get("subset") == "test" and res.get("n_sentences") != standard_n:
        out.append(f"{res.get('n_sentences')} test sentences (standard test set: {standard_n:,})")
    return out


def split_runs(configs, runs):
    """({config name: standard results}, [(cfg or None, results, reasons)] for the other runs)."""
    by_name = {c["name"]: c for c in configs}
    standard, other = {}, []
    for res in (runs.values() if isinstance(runs, dict) else runs):
        cfg = by_name.get(res.get("name"))
        reasons = deviations(cfg, res) if cfg else ["no config of that name"]
        if cfg and not reasons and cfg["name"] not in standard:
            standard[cfg["name"]] = res
        else:
            other.append((cfg, res, reasons))
    return standard, other


def _scores_text(res):
    return ", ".join(f"{k} {_fmt(v)}" for k, v in (res.get("scores") or {}).items()) or "–"


def _fmt(value, unverified=False):
    if value is None:
        return "–"
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return text + ("\\*" if unverified else "")


def build_tables(configs, runs, all_configs=None):
    """Markdown text with one table per (paper, table). Only runs done as their config says
    stand beside the paper's number; any other run (other data, overrides, fewer updates, a
    test set of another size, ...) is listed in a separate "Non-standard runs" table."""
    standard, other = split_runs(all_configs or configs, runs)
    groups = defaultdict(list)
    for cfg in configs:
        groups[(cfg["paper"], str(cfg["table"]))].append(cfg)
    order = list(PAPER_TITLES)
    datasets = list(CORPORA)

    def row_key(cfg):
        # like the papers: per dataset, base before big, the baseline Transformer before the method
        arch = cfg["arch"]
        baseline = arch in FAIRSEQ_BASELINES
        return (datasets.index(cfg["dataset"]) if cfg["dataset"] in datasets else 99,
                "big" in arch, not baseline, cfg["_path"])

    out = []
    for (paper, table) in sorted(groups, key=lambda k: (order.index(k[0]), k[1])):
        rows = sorted(groups[(paper, table)], key=row_key)
        rouge = all(metric(c["eval"]["metric"]).is_rouge for c in rows)
        wmt = any(metric(c["eval"]["metric"]).sacrebleu_column for c in rows)
        if rouge:
            head = ["row", "data", "R-1 paper", "R-1 ours", "R-2 paper", "R-2 ours", "R-L paper", "R-L ours", "config"]
        else:
            head = ["row", "data", "BLEU paper", "BLEU ours"] + (["sacreBLEU ours"] if wmt else []) + ["config"]
        body = []
        for cfg in rows:
            paper_res = cfg.get("paper_results") or {}
            unverified = paper_res.get("verified") is False
            ours = (standard.get(cfg["name"]) or {}).get("scores", {})
            data = display_name(cfg["dataset"])
            rel = Path(cfg["_path"]).resolve()
            rel = rel.relative_to(REPO) if rel.is_relative_to(REPO) else rel
            if rouge:
                scores = [cell for key in ("rouge1", "rouge2", "rougeL")
                          for cell in (_fmt(paper_res.get(key), unverified), _fmt(ours.get(key)))]
            else:
                scores = ([_fmt(paper_res.get("bleu"), unverified), _fmt(ours.get("bleu"))]
                          + ([_fmt(ours.get("sacrebleu"))] if wmt else []))
            body.append([cfg["row"], data, *scores, f"`{rel}`"])
        out += [f"### {PAPER_TITLES[paper]} — Table {table}", ""] + markdown_table(head, body) + [""]
    if other:
        out += ["### Non-standard runs (not comparable with the papers' numbers)", ""] + markdown_table(
            ["run", "config row", "ours", "differs from the config"],
            [[f"`{res.get('_run', '?')}`", f"{cfg['row']} (`{cfg['name']}`)" if cfg else f"`{res.get('name')}`",
              _scores_text(res), "; ".join(reasons)] for cfg, res, reasons in other]) + [""]
    out += ["BLEU: IWSLT14 case-insensitive tokenized; WMT14 tokenized with compound splitting "
            "(sacreBLEU column: detokenized, signature in each run's results.json). ROUGE: F1; the "
            "implementation (ROUGE-1.5.5 as files2rouge runs it, or rouge-score when asked for) and argument order are recorded per run. "
            "\\* paper number not confirmed against the paper (see the config's notes); – not available."]
    return "\n".join(out) + "\n"


@one_line_on_ctrl_c("scripts/results_table.py")
def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    import argparse

    p = argparse.ArgumentParser(description="Gather finished runs into Markdown tables like the papers'.")
    p.add_argument("--runs", default=str(REPO / "runs"), help="folder of run directories (default runs/)")
    p.add_argument("--configs", default=str(CONFIG_DIR))
    p.add_argument("--paper", choices=sorted(PAPER_TITLES), default=None)
    p.add_argument("--only-finished", action="store_true",
                   help="only rows with a finished standard run (non-standard runs are listed apart)")
    p.add_argument("--out", default=None, help="also write the Markdown here")
    args = p.parse_args(argv)
    configs = all_configs(args.configs)
    try:
        runs = collect_runs(args.runs)
    except ResultsError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    if args.paper:
        configs = [c for c in configs if c["paper"] == args.paper]
        names = {c["name"] for c in configs}
        runs = {k: r for k, r in runs.items() if r.get("name") in names}
    if args.only_finished:
        standard, _ = split_runs(configs, runs)
        # rows with a run done as the config says; the other runs still get their own table
        text = build_tables([c for c in configs if c["name"] in standard], runs, all_configs=configs)
    else:
        text = build_tables(configs, runs)
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0
