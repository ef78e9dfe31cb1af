#!/usr/bin/env python3
"""Collect the runs of lab/man_training_study.sh into small records, a table and a figure.

    python -m lab.man_training_study [--study man-training-study] [--order T,M,...]

For every finished run folder ``runs/STUDY/NAME``: ``results/STUDY/NAME.json`` (command, validation
loss per epoch, training loss, and the per-sublayer gradient norms: every update of the first 100,
then every 5th, rounded to 4 significant digits). Then, from those records alone:
``results/STUDY.md`` (validation loss per epoch of every run) and ``docs/STUDY.png`` (loss curves;
mean gradient norm of every encoder sublayer per run). STUDY is ``man-training-study`` (docs/man.md)
unless given (``STUDY=diffwin-probe lab/man_training_study.sh ...`` writes ``runs/diffwin-probe``);
``--include OTHER_STUDY/NAME`` shows another study's record first (the baseline a probe is measured against).
"""

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from man_recipes.interrupt import one_line_on_ctrl_c  # noqa: E402

VALID_RE = re.compile(r"valid on 'valid' subset \| loss ([0-9.]+) \| nll_loss ([0-9.]+).*?\| num_updates (\d+)")
TRAIN_RE = re.compile(r"\| epoch (\d+) \| loss ([0-9.]+) \| nll_loss ([0-9.]+).*?\| num_updates (\d+)")
WPS_RE = re.compile(r"train_inner:epoch \d+:.*?wps=([0-9.]+)")
INNER_RE = re.compile(r"train_inner:epoch \d+:.*? loss=([0-9.]+),.*?num_updates=(\d+)")
GRAD_FROM = 100  # the bar chart averages the gradient norms of the updates after this one
TABLE_UPDATES = (250, 375)  # training loss (mean of the 25 updates before) compared at these updates


def sig(x, digits=4):
    return float(f"{x:.{digits}g}")


def collect(run):
    log = (run / "train.log").read_text(errors="replace")
    grads_file = run / "sublayer_grads.json"  # written every 25 updates; absent if stopped before
    grads = json.loads(grads_file.read_text())["updates"] if grads_file.is_file() else []
    keep = [r for r in grads if r["update"] <= 100 or r["update"] % 5 == 0]
    command = (run / "command.txt").read_text().strip().splitlines()
    return {"name": run.name, "command": command[0], "provenance": command[1:],
            "state": next((w for w in ("finished", "stopped") if any(l.startswith(w) for l in command)), "running"),
            "train_inner": [{"updates": int(u), "loss": float(l)} for l, u in INNER_RE.findall(log)],
            "valid": [{"updates": int(u), "loss": float(l), "nll_loss": float(n)} for l, n, u in VALID_RE.findall(log)],
            "train": [{"epoch": int(e), "loss": float(l), "updates": int(u)} for e, l, _, u in TRAIN_RE.findall(log)],
            "median_wps": sorted(map(float, WPS_RE.findall(log)))[len(WPS_RE.findall(log)) // 2] if WPS_RE.search(log) else None,
            "sublayer_grads": [{"update": r["update"], "lr": sig(r["lr"]),
                                "norms": {g: sig(v) for g, v in sorted(r["norms"].items())}} for r in keep]}


def table(records, notes):
    from man_recipes.tables import markdown_table

    epochs = max(len(r["valid"]) for r in records)
    rows = []
    for r in records:
        cells = [f"{v['loss']:.3f}" for v in r["valid"]] + ["–"] * (epochs - len(r["valid"]))
        inner = {p["updates"]: p["loss"] for p in r["train_inner"]}
        cells += [f"{inner[u]:.3f}" if u in inner else "–" for u in TABLE_UPDATES]
        name = r["name"] + ("" if r["state"] == "finished" else f" ({r['state']})")
        rows.append([name, notes.get(r["name"], ""), *cells])
    return "\n".join(markdown_table(["run", "model and options"] + [f"valid loss ep. {i + 1}" for i in range(epochs)]
                                    + [f"train loss @{u}" for u in TABLE_UPDATES], rows))


def figure(records, png):
    from man_recipes.logging_setup import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(15, 5), gridspec_kw={"width_ratios": [1, 1.4]})
    ax = axes[0]
    colors = plt.get_cmap("tab10")
    for i, r in enumerate(records):
        ax.plot([p["updates"] for p in r["train_inner"]], [p["loss"] for p in r["train_inner"]], color=colors(i),
                lw=1, alpha=0.6)
        ax.plot([v["updates"] for v in r["valid"]], [v["loss"] for v in r["valid"]], "o-", color=colors(i),
                lw=2, label=r["name"])
    ax.set_xlabel("updates (127 per epoch)")
    ax.set_ylabel("loss (label-smoothed CE, bits)")
    ax.set_title("Multi30k: valid (dots) and train (thin) loss")
    ax.set_ylim(5, 10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    order = {"dman": 0, "sman2": 0, "san": 1, "ffn": 2}
    groups = sorted({g for r in records for row in r["sublayer_grads"] for g in row["norms"]
                     if g.startswith("enc") and not g.endswith(".mask")},
                    key=lambda g: (int(g[3]), order.get(g.split(".")[1], 1), g))
    width = 0.8 / max(1, len(records))
    for i, r in enumerate(records):
        late = [row for row in r["sublayer_grads"] if row["update"] > GRAD_FROM]
        means = [sum(row["norms"].get(g, 0.0) for row in late) / len(late) if late else 0.0 for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], means, width, color=colors(i), label=r["name"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels(groups, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(f"mean gradient L2 norm, updates {GRAD_FROM + 1}+")
    ax.set_title("encoder sublayer gradients (lower layers first)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


@one_line_on_ctrl_c("python -m lab.man_training_study")
def main(argv=None):
    from man_recipes.logging_setup import quiet_logging

    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", default="man-training-study",
                   help="runs/STUDY -> results/STUDY/*.json, results/STUDY.md, docs/STUDY.png")
    p.add_argument("--title", default="MAN against the Transformer at the same budget (Multi30k, CPU)")
    p.add_argument("--see", default="docs/man.md", help="the doc that explains the study")
    p.add_argument("--order", default="", help="comma-separated run names for the table and figure, in order "
                   "(default: every record)")
    p.add_argument("--notes", default="", help="JSON {run: what differs}")
    p.add_argument("--include", default="", help="comma-separated OTHER_STUDY/NAME: records of another study "
                   "shown first in the table and figure, e.g. the Transformer a probe is measured against "
                   "(read from results/OTHER_STUDY/NAME.json; nothing is copied)")
    args = p.parse_args(argv)
    records_dir = REPO / "results" / args.study
    records_dir.mkdir(parents=True, exist_ok=True)
    for run in sorted((REPO / "runs" / args.study).glob("*")):
        if (run / "train.log").is_file() and (run / "command.txt").is_file():
            (records_dir / f"{run.name}.json").write_text(json.dumps(collect(run), indent=0) + "\n")
    records = {r.stem: json.loads(r.read_text()) for r in records_dir.glob("*.json")}
    included = []
    for ref in filter(None, args.include.split(",")):
        path = REPO / "results" / f"{ref}.json"
        if not path.is_file():
            p.error(f"--include {ref}: no record {path}")
        name = Path(ref).name
        if name in records:
            p.error(f"--include {ref}: {args.study} has a run of that name too")
        records[name] = json.loads(path.read_text())
        included.append(name)
    # --order picks the runs of the table and figure (every record stays on disk); default: all
    order = [n for n in args.order.split(",") if n in records] if args.order else sorted(records)
    order = included + [n for n in order if n not in included]
    records = [records[n] for n in order]
    md = table(records, json.loads(args.notes) if args.notes else {})
    (records_dir.parent / f"{args.study}.md").write_text(
        f"# {args.title}\n\n"
        f"Written by python -m lab.man_training_study from results/{args.study}/*.json; see {args.see}.\n\n"
        + md + "\n")
    figure(records, REPO / "docs" / f"{args.study}.png")
    print(md)


if __name__ == "__main__":
    sys.exit(main())
