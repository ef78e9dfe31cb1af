"""Markdown tables laid out like the papers' tables: every row config, the paper's number
(read from the config: one source of truth) beside ours (read from ``RUN/results.json``)."""

import json
from collections import defaultdict
from pathlib import Path

from .config import CONFIG_DIR, REPO, all_configs

PAPER_TITLES = {
    "man": "Mask Attention Networks",
    "localness": "Modeling Localness for Self-Attention Networks",
    "diffwin": "Differentiable Window for Dynamic Local Attention",
    "calibration": "Attention Calibration for Transformer in NMT",
}
FAIRSEQ_BASELINES = {"transformer", "transformer_iwslt_de_en", "transformer_wmt_en_de",
                     "transformer_vaswani_wmt_en_de_big"}
DATASET_NAMES = {"iwslt14": "IWSLT14 De-En", "wmt14": "WMT14 En-De", "cnndm": "CNN/DM", "gigaword": "Gigaword"}


def collect_runs(runs_dir):
    """{config name: results dict} for every ``runs_dir/*/results.json``."""
    found = {}
    for path in sorted(Path(runs_dir).glob("*/results.json")):
        res = json.loads(path.read_text())
        res["_run"] = str(path.parent)
        found[res["name"]] = res
    return found


def _fmt(value, unverified=False):
    if value is None:
        return "–"
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return text + ("\\*" if unverified else "")


def build_tables(configs, runs):
    """Markdown text with one table per (paper, table)."""
    groups = defaultdict(list)
    for cfg in configs:
        groups[(cfg["paper"], str(cfg["table"]))].append(cfg)
    order = list(PAPER_TITLES)
    datasets = list(DATASET_NAMES)

    def row_key(cfg):
        # like the papers: per dataset, base before big, the baseline Transformer before the method
        arch = cfg["arch"]
        baseline = arch in FAIRSEQ_BASELINES
        return (datasets.index(cfg["dataset"]) if cfg["dataset"] in datasets else 99,
                "big" in arch, not baseline, cfg["_path"])

    out = []
    for (paper, table) in sorted(groups, key=lambda k: (order.index(k[0]), k[1])):
        rows = sorted(groups[(paper, table)], key=row_key)
        rouge = all(c["eval"]["metric"] == "rouge" for c in rows)
        wmt = any(c["eval"]["metric"] == "bleu_wmt" for c in rows)
        out += [f"### {PAPER_TITLES[paper]} — Table {table}", ""]
        if rouge:
            out += ["| row | data | R-1 paper | R-1 ours | R-2 paper | R-2 ours | R-L paper | R-L ours | config |",
                    "|---|---|---|---|---|---|---|---|---|"]
        else:
            head = "| row | data | BLEU paper | BLEU ours |" + (" sacreBLEU ours |" if wmt else "") + " config |"
            out += [head, "|---" * (head.count("|") - 1) + "|"]
        for cfg in rows:
            paper_res = cfg.get("paper_results") or {}
            unverified = paper_res.get("verified") is False
            ours = (runs.get(cfg["name"]) or {}).get("scores", {})
            data = DATASET_NAMES.get(cfg["dataset"], cfg["dataset"])
            rel = Path(cfg["_path"]).resolve()
            rel = rel.relative_to(REPO) if rel.is_relative_to(REPO) else rel
            if rouge:
                cells = []
                for key in ("rouge1", "rouge2", "rougeL"):
                    cells += [_fmt(paper_res.get(key), unverified), _fmt(ours.get(key))]
                out.append(f"| {cfg['row']} | {data} | " + " | ".join(cells) + f" | `{rel}` |")
            else:
                line = f"| {cfg['row']} | {data} | {_fmt(paper_res.get('bleu'), unverified)} | {_fmt(ours.get('bleu'))} |"
                if wmt:
                    line += f" {_fmt(ours.get('sacrebleu'))} |"
                out.append(line + f" `{rel}` |")
        out.append("")
    out += ["BLEU: IWSLT14 case-insensitive tokenized; WMT14 tokenized with compound splitting "
            "(sacreBLEU column: detokenized, signature in each run's results.json). ROUGE: F1; the "
            "implementation (files2rouge or rouge-score) is recorded per run. "
            "\\* paper number not confirmed against the paper (see the config's notes); – not available."]
    return "\n".join(out) + "\n"


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description="Gather finished runs into Markdown tables like the papers'.")
    p.add_argument("--runs", default=str(REPO / "runs"), help="folder of run directories (default runs/)")
    p.add_argument("--configs", default=str(CONFIG_DIR))
    p.add_argument("--paper", choices=sorted(PAPER_TITLES), default=None)
    p.add_argument("--only-finished", action="store_true", help="only rows with a finished run")
    p.add_argument("--out", default=None, help="also write the Markdown here")
    args = p.parse_args(argv)
    configs = all_configs(args.configs)
    runs = collect_runs(args.runs)
    if args.paper:
        configs = [c for c in configs if c["paper"] == args.paper]
    if args.only_finished:
        configs = [c for c in configs if c["name"] in runs]
    text = build_tables(configs, runs)
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0
