"""The MAN paper's Table 5 locality measure (``man-attention-locality``): per model, layer and sublayer,
the share of encoder self-attention within |t-s| <= w over a split's sentences, beside attention spread
uniformly over the real keys; its table, JSON and figure, and the check of the output folder. What it
measures in full and the options: :mod:`man_recipes.cli.attention_locality`."""

import json
import logging
import os
from collections import defaultdict
from typing import List

import torch

from man_recipes.analysis.locality import AttentionRecorder, LocalityStats, uniform_shares
from man_recipes.analysis.utils import check_output_dir, load_checkpoint, model_labels
from man_recipes import tables

logger = logging.getLogger("man_fairseq.attention_locality")


def parse_windows(spec: str) -> List[int]:
    try:
        windows = [int(w) for w in spec.split(",") if w.strip()]
    except ValueError:
        raise ValueError(f"--windows: expected comma-separated non-negative integers, got {spec!r}")
    if not windows or any(w < 0 for w in windows):
        raise ValueError(f"--windows: expected comma-separated non-negative integers, got {spec!r}")
    return windows


def sentence_batches(task, subset, model, max_sentences, batch_size, max_tokens):
    """Batches of the first ``max_sentences`` sentences (by id) that fit the model; + #skipped."""
    import numpy as np
    from fairseq import utils

    dataset = task.dataset(subset)
    indices = dataset.ordered_indices()
    if max_sentences is not None:
        # the size-ordered order would take the shortest sentences; cap by id instead
        indices = indices[indices < max_sentences]
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    indices, ignored = dataset.filter_indices_by_size(indices, max_positions)
    batches = dataset.batch_by_size(np.asarray(indices), max_tokens=max_tokens, max_sentences=batch_size)
    return dataset, batches, len(ignored)


def analyse_model(path, args, windows, use_cuda):
    from fairseq import utils

    model, cfg, task = load_checkpoint(path, args.data, args.source_lang, args.target_lang)
    if use_cuda:
        model.cuda()
    task.load_dataset(args.gen_subset)
    dataset, batches, skipped = sentence_batches(
        task, args.gen_subset, model, args.max_sentences, args.batch_size, args.max_tokens)
    recorder = AttentionRecorder(model, windows)
    uniform = LocalityStats(len(windows))
    pad = task.source_dictionary.pad()
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", "model")
    logger.info("%s (%s): %d encoder self-attentions, %d batches of split %s",
                path, arch, len(recorder.attentions), len(batches), args.gen_subset)
    try:
        for i, batch in enumerate(batches, 1):
            sample = dataset.collater([dataset[int(j)] for j in batch])
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            src_tokens = sample["net_input"]["src_tokens"]
            recorder.padding_mask = src_tokens.eq(pad)
            with torch.no_grad():
                model.encoder(src_tokens, src_lengths=sample["net_input"]["src_lengths"])
            uniform.add(uniform_shares(recorder.padding_mask, windows), recorder.padding_mask)
            if i % args.log_interval == 0 or i == len(batches):
                logger.info("%s: %d/%d batches, %d sentences", arch, i, len(batches), uniform.sentences)
    finally:
        recorder.remove()
    return {"path": path, "arch": arch, "skipped": skipped, "stats": recorder.stats, "uniform": uniform}


def build_rows(results, labels):
    rows = []
    for label, r in zip(labels, results):
        for (layer, sublayer), stats in r["stats"].items():
            sentence_mean, token_mean = stats.means()
            rows.append({"model": label, "layer": layer, "sublayer": sublayer, "share": sentence_mean,
                         "share_token_pooled": token_mean, "sentences": stats.sentences,
                         "query_tokens": stats.tokens})
        sentence_mean, token_mean = r["uniform"].means()
        rows.append({"model": label, "layer": None, "sublayer": "uniform", "share": sentence_mean,
                     "share_token_pooled": token_mean, "sentences": r["uniform"].sentences,
                     "query_tokens": r["uniform"].tokens})
    return rows


def markdown_table(rows, windows, subset):
    lines = [
        f"Share of encoder self-attention on keys with |t-s| <= w (split `{subset}`; mean over heads "
        "and real query tokens per sentence, then over sentences; layers 0-based; `uniform` = an "
        "attention spread evenly over the real keys).",
        "",
    ] + tables.markdown_table(
        ["model", "layer", "sublayer", *(f"w={w}" for w in windows), "sentences"],
        [[f"{r['model']}", "all" if r["layer"] is None else str(r["layer"]), f"{r['sublayer']}",
          *(f"{s:.3f}" for s in r["share"]), f"{r['sentences']}"] for r in rows])
    return "\n".join(lines) + "\n"


def save_plot(path, rows, windows, subset="valid"):
    from man_recipes.logging_setup import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(windows), figsize=(4.2 * len(windows), 3.6), squeeze=False, sharey=True)
    series = defaultdict(list)  # (model, sublayer) -> rows in layer order
    for r in rows:
        if r["layer"] is not None:
            series[(r["model"], r["sublayer"])].append(r)
    uniform = {r["model"]: r["share"] for r in rows if r["layer"] is None}
    # zoomed to the largest share: on 400-token articles every share is near 0.01 and a 0-1 axis hid them
    top = min(1.02, 1.15 * max([max(r["share"]) for r in rows] + [0.01]))
    for wi, (ax, w) in enumerate(zip(axes[0], windows)):
        for (model, sublayer), rs in series.items():
            rs = sorted(rs, key=lambda r: r["layer"])
            ax.plot([r["layer"] for r in rs], [r["share"][wi] for r in rs], "o-", label=f"{model} {sublayer}")
        for model, share in uniform.items():
            ax.axhline(share[wi], linestyle=":", color="grey", linewidth=1)
        ax.set_title(f"w = {w}")
        ax.set_xlabel("encoder layer")
        ax.set_ylim(0, top)
        layers = sorted({r["layer"] for r in rows if r["layer"] is not None})
        ax.set_xticks(layers)
    axes[0][0].set_ylabel("attention share within |t-s| <= w")
    axes[0][-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"Encoder self-attention share within |t-s| <= w, split {subset}: mean over heads and real query "
                 "tokens per sentence, then over sentences\nlayers 0-based; dotted: attention spread uniformly "
                 "over the real keys (chance level)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


OUTPUTS = ("locality.md", "locality.json", "locality.png")


LOCALITY_FIELDS = {"split", "windows", "averaging", "models", "rows"}  # what main() writes to locality.json


def written_here(path):
    """Whether ``path`` is a locality.json this command wrote (its fields)."""
    try:
        with open(path, encoding="utf-8") as f:
            held = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(held, dict) and LOCALITY_FIELDS <= set(held)


def check_outputs(output_dir, overwrite=False):
    """Refuse, before any checkpoint is read, an ``--output-dir`` that cannot be written or whose
    locality.md / .json / .png this command did not write (no locality.json of its own there),
    unless ``overwrite``: a rerun replaces its own table, never a user's files of those names."""
    check_output_dir(output_dir)
    present = [name for name in OUTPUTS if os.path.lexists(os.path.join(output_dir, name))]
    if present and not overwrite and not written_here(os.path.join(output_dir, "locality.json")):
        raise SystemExit(f"--output-dir {output_dir}: {', '.join(present)} exist there and were not written by "
                         "man-attention-locality; pass --overwrite to replace them, or choose another folder")


def main(args):
    import man_fairseq  # noqa: F401  (registers the archs before the checkpoints are read)
    from fairseq import utils

    check_outputs(args.output_dir, getattr(args, "overwrite", False))
    utils.import_user_module(args)
    windows = parse_windows(args.windows)
    use_cuda = torch.cuda.is_available() and not args.cpu
    paths = utils.split_paths(args.path, separator=",")
    results = [analyse_model(p, args, windows, use_cuda) for p in paths]
    # the same architecture twice: told apart by checkpoint path
    labels = model_labels([r["path"] for r in results], [r["arch"] for r in results], args.labels)
    rows = build_rows(results, labels)

    os.makedirs(args.output_dir, exist_ok=True)
    table = markdown_table(rows, windows, args.gen_subset)
    with open(os.path.join(args.output_dir, "locality.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.output_dir, "locality.json"), "w") as f:
        json.dump({
            "split": args.gen_subset, "windows": windows,
            "averaging": "share: mean over heads and real query tokens per sentence, then over sentences; "
                         "share_token_pooled: mean over heads, then over all real query tokens",
            "models": [{"label": lab, "path": r["path"], "arch": r["arch"], "skipped_too_long": r["skipped"]}
                       for lab, r in zip(labels, results)],
            "rows": rows,
        }, f, indent=2)
    save_plot(os.path.join(args.output_dir, "locality.png"), rows, windows, args.gen_subset)
    print(table)
    return rows
