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
import sys

from man_recipes.analysis.utils import check_counts
from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.analysis.attention_locality import check_outputs, main, parse_windows


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
