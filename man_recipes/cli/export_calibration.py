"""Attention-calibration analysis (Lu et al. 2021, P3: Figures 2, 6, 7 and Table 5; docs/calibration.md).

Every sentence of a data split is run teacher-forced on its reference translation, as in the
paper's analysis. For each checkpoint of ``--path`` (a ``transformer_calibrated_*`` model, or any
other encoder-decoder model, e.g. a Transformer baseline, for the Kendall-τ part only) it measures
per decoder layer (``layer`` 1-based in tables and plots, as in the paper):

* **JSD / entropy** (calibrated models; Figure 6, Table 5): the Jensen-Shannon divergence
  (base 2, in [0, 1]) between the original cross-attention ``a`` and the fused calibrated weights
  ``a_cal``, the entropies (bits) of both and ``ΔEnt = H(a_cal) - H(a)`` (``+``: calibrated
  attention more disperse, the paper's sign), and the mean mask ``m``. Averages run over every real
  (sentence, target token, head) row. The ``All`` row of the Table-5 layout is the mean over all
  layers' rows (the paper does not define its ``All`` row; its value is not the mean of its layer
  rows). Fusions whose output is not a distribution (``anneal`` and the default ``fixed``, the authors' ``a + lambda a^c``) are
  renormalised over the real source keys first.
* **JSD against the original attention's shape** (Figure 7): the same JSD averaged in bins of the
  entropy of ``a`` (0.4-bit bins; the paper quotes ``> 3.2`` bits) and of the maximum weight of
  ``a`` (0.1 bins; the paper quotes ``[0, 0.8]``), one curve per layer.
* **Kendall-τ against gradient-based importance** (Figure 2), for the sentences with id below
  ``--kendall-sentences``. The importance of source token ``s`` for target token ``t``
  is gradient × input on the source token embeddings ``e_s`` (the embedding lookup output, before
  scaling and positions): ``|Σ_c ∂log p(y_t | y_<t, x)/∂e_{s,c} · e_{s,c}|``
  (``--importance grad_norm``: ``‖∂log p(y_t)/∂e_s‖_2``). For every real target token, Kendall's
  τ-b (scipy's definition) is taken over the real source tokens between that importance vector and
  the head-averaged row of (i) the cross-attention ``a`` of each layer, for calibrated models also
  (ii) the fused ``a_cal`` and (iii) the mask ``m``. τ is averaged over all such target tokens of
  the sentences (token-pooled; undefined τ, e.g. a one-token source, are left out and counted).

Writes to ``--output-dir``: ``calibration_stats.md`` (also printed) and ``calibration_stats.json``
with all tables; ``calibration_stats.png`` (JSD and entropies per layer); ``jsd_by_entropy.png``
(Figure 7); ``kendall_tau.png`` (Figure 2, one group of bars per layer, one bar per model and
series); and per calibrated model ``masks.pt`` -- ``{sentence id: {"mask": m (layers, heads,
tgt_len, src_len) float32, "src": [tokens], "tgt": [tokens]}}``, pads removed -- and
``heatmaps/<id>.png`` for the first ``--num-heatmaps`` sentences (head-averaged ``m`` per layer).
With several checkpoints these per-model files go to ``<output-dir>/<label>/``.

Usage::

    man-export-calibration DATA_BIN --path calibrated/checkpoint_best.pt,transformer/checkpoint_best.pt \\
        --labels ACN,Transformer --gen-subset test --output-dir calib_analysis --num-heatmaps 20
    # or: man-analyze calibration ... / python -m man_recipes.cli.export_calibration ...
"""

import sys
from typing import List, Optional

from man_recipes.analysis.utils import analysis_parser, check_counts, check_output_dir
from man_recipes.analysis.calibration_stats import IMPORTANCE
from man_recipes.logging_setup import setup_logging
from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.analysis.calibration_export import main


def get_parser():
    p = analysis_parser(__doc__, "test", data_help="fairseq binarized data directory",
                        path_help="checkpoint, or comma-separated checkpoints to compare (calibrated models get "
                                  "all analyses, other encoder-decoder models the Kendall-τ of their cross-attention)")
    p.add_argument("--max-sentences", type=int, default=None, help="stop after this many sentences")
    p.add_argument("--num-heatmaps", type=int, default=10, help="PNG heat maps for the first N sentences")
    p.add_argument("--kendall-sentences", type=int, default=200,
                   help="Kendall-τ on the sentences with id < N (one backward pass per target position; "
                        "0 = skip; default 200)")
    p.add_argument("--importance", choices=IMPORTANCE, default="grad_input",
                   help="gradient-based source importance: gradient x input (default) or gradient norm")
    return p


@one_line_on_ctrl_c("man-export-calibration")
def cli_main(argv: Optional[List[str]] = None):
    setup_logging()
    args = get_parser().parse_args(argv)
    check_counts(args, batch_size=1, max_sentences=1, num_heatmaps=0, kendall_sentences=0, log_interval=1)
    check_output_dir(args.output_dir)
    main(args)


if __name__ == "__main__":
    sys.exit(cli_main())
