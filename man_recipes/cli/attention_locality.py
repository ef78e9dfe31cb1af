"""Attention locality of the encoder self-attentions (MAN paper, Table 5).

For every encoder layer and every self-attention sublayer of one or more trained models (e.g.
a ``transformer_man_*`` model and a ``transformer`` baseline) it measures the share of
attention a query gives to keys within ``|t - s| <= w``
(docs/analysis.md#locality-attention-within-a-window-man-table-5):

    share_w(t) = sum_{s real, |t-s| <= w} p[t, s] / sum_{s real} p[t, s]

(the denominator is 1 for softmax attention; it renormalises attentions whose rows do not sum to
one, such as an unrenormalised multiplicative window). Positions count real tokens from the
first real token, so left padding (fairseq's default for sources) does not move them. The share
is averaged over heads and real query tokens of a sentence, then over sentences (every sentence
weighs the same); ``locality.json`` also has the token-pooled average.

A ``uniform`` row per model gives the share an attention spread evenly over the real keys
would have on the same sentences: the chance level the learned values compare with.

Works for MAN layers (``layer.sublayers`` / ``layer.blocks``: dman, san, sman1, sman2), for
fairseq's ``transformer`` (``layer.self_attn``) and for the families that build on it
(localness, differentiable window, calibration; their label names the bias module).

Writes ``locality.md`` (also printed), ``locality.json`` and ``locality.png`` (share vs layer,
one panel per ``w``, one line per model and sublayer) to ``--output-dir``; files of those names that
it did not write (no locality.json of its own beside them) are refused before any checkpoint is read,
unless ``--overwrite``::

    man-attention-locality DATA_BIN --path man/checkpoint_best.pt,transformer/checkpoint_best.pt \\
        --gen-subset valid --windows 1,2,4 --output-dir locality/
    # or: python -m man_recipes.cli.attention_locality ... (same options)
"""

import argparse
import json
import logging
import os
import sys
from collections import defaultdict
from typing import List

import torch

from man_recipes.analysis.locality import (  # noqa: F401  (the measurements, by their names here too)
    AttentionRecorder, LocalityStats, encoder_self_attentions, locality_shares, real_positions, self_attention_label,
    uniform_shares,
)
from man_recipes.analysis.utils import check_counts, check_output_dir, load_checkpoint, model_labels
from man_recipes import tables
from man_recipes.interrupt import one_line_on_ctrl_c

logger = logging.getLogger("man_fairseq.attention_locality")


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="fairseq binarized data directory")
    p.add_argument("--path", required=True,
                   help="checkpoint, or comma-separated checkpoints to compare (e.g. MAN,Transformer)")
    p.add_argument("--labels", default=None,
                   help="comma-separated model names for the table (default: the architecture names)")
    p.add_argument("--gen-subset", default="valid", help="data split (default: valid)")
    p.add_argument("--windows", default="1,2,4", help="comma-separated windows w (default: 1,2,4)")
    p.add_argument("--output-dir", required=True, help="folder for locality.md / .json / .png")
    p.add_argument("--overwrite", action="store_true",
                   help="replace locality.md / .json / .png in --output-dir that this command did not write")
    p.add_argument("--source-lang", default=None)
    p.add_argument("--target-lang", default=None)
    p.add_argument("--user-dir", default=None, help="an extra fairseq --user-dir to import")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    p.add_argument("--max-tokens", type=int, default=None, help="source tokens per batch")
    p.add_argument("--max-sentences", type=int, default=None,
                   help="use only the first N sentences of the split (by sentence id)")
    p.add_argument("--log-interval", type=int, default=10, help="log progress every N batches")
    p.add_argument("--cpu", action="store_true")
    return p


def parse_windows(spec: str) -> List[int]:
    try:
        windows = [int(w) for w in spec.split(",") if w.strip()]
    except ValueError:
        raise ValueError(f"--windows: expected comma-separated non-negative integers, got {spec!r}")
    if not windows or any(w < 0 for w in windows):
        raise ValueError(f"--windows: expected comma-separated non-negative integers, got {spec!r}")
    return windows


# ----------------------------------------------------------------------------- running

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


@one_line_on_ctrl_c("man-attention-locality")
def cli_main(argv=None):
    from man_recipes.logging_setup import setup_logging

    setup_logging()
    args = get_parser().parse_args(argv)
    try:
        parse_windows(args.windows)  # fail before loading anything
    except ValueError as e:
        raise SystemExit(str(e))
    check_counts(args, batch_size=1, max_tokens=1, max_sentences=1, log_interval=1)
    check_outputs(args.output_dir, args.overwrite)
    main(args)


if __name__ == "__main__":
    sys.exit(cli_main())
