"""The learned windows of a differentiable-window model (Nguyen et al. 2020, P4; docs/diffwin.md).

Every sentence of a data split (or of ``--input-pairs``) is run teacher-forced on its reference.
For every attention with a differentiable window (encoder self ``encoder_self``, decoder self
``decoder_self``, encoder-decoder ``cross``; layers 0-based) and every real query ``t`` it reads
the module's own boundary distributions ``phi_L``, ``phi_R`` (B, T, S) and soft mask ``m`` and
measures, with key positions ``j`` counted from the first real key:

* ``expected_left = E[l] = Σ_j j phi_L[t, j]`` and ``expected_right = E[r]`` (positions);
* ``expected_width = E|r - l| + 1`` with ``l ~ phi_L``, ``r ~ phi_R`` independent, as the mask
  formula assumes: the expected number of tokens from one boundary to the other, inclusive;
* ``mask_sum = Σ_j m[t, j]`` over the real keys: the soft count of keys inside the window (with
  the paper's mask a pointer pair with ``l = r`` counts its key twice; segment masks count every
  key of a covered segment);
* ``mask_at_query = m[t, t]`` in self-attention: how much the window keeps of the query's own
  token (a multiplicative window scales that token's attention weight by it); ``nan`` in
  cross-attention, where no key is the query's own.

Writes to ``--output-dir``:

* ``windows.tsv``: one row per (sentence, attention, layer, real query) with the values above;
* ``windows.md`` / ``windows.json``: per attention and layer the number of queries and the mean,
  median and standard deviation of ``expected_width`` and the mean ``mask_sum``;
* ``widths.png``: the distribution of ``expected_width`` per layer, one panel per attention;
* ``heatmaps/<sentence id>_<attention>.png`` for the first ``--num-heatmaps`` sentences (by id):
  one row per layer, columns ``phi_L``, ``phi_R`` and ``m`` over (query token, key token).
  Decoder positions are labelled with their input token (the previous target token; ``</s>`` first).

With several checkpoints (``--path A,B``) each model's files go to ``<output-dir>/<label>/`` and
``widths.png`` in ``--output-dir`` compares them (one colour per model).

Usage::

    man-diffwin-windows DATA_BIN --path diffwin/checkpoint_best.pt --gen-subset test \\
        --output-dir diffwin_windows --num-heatmaps 3
    # or: man-analyze diffwin ... / python -m man_recipes.cli.diffwin_windows ...
"""

import sys
from typing import List, Optional

from man_recipes.analysis.utils import analysis_parser, check_counts, check_output_dir
from man_recipes.logging_setup import setup_logging
from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.analysis.diffwin_windows import main


def get_parser():
    p = analysis_parser(__doc__, "valid", path_help="checkpoint, or comma-separated checkpoints to compare",
                        data_help="fairseq binarized data directory (dictionaries; the split unless --input-pairs)")
    p.add_argument("--max-sentences", type=int, default=None, help="only sentences with id < N")
    p.add_argument("--num-heatmaps", type=int, default=3, help="heat maps for sentences with id < N")
    return p


@one_line_on_ctrl_c("man-diffwin-windows")
def cli_main(argv: Optional[List[str]] = None):
    setup_logging()
    args = get_parser().parse_args(argv)
    check_counts(args, batch_size=1, max_sentences=1, num_heatmaps=0, log_interval=1)
    check_output_dir(args.output_dir)
    main(args)


if __name__ == "__main__":
    sys.exit(cli_main())
