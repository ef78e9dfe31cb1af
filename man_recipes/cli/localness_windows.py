"""Dump the predicted localness centres and window sizes of a trained model on a data set.

For every attention with a localness bias (encoder self, decoder self, encoder-decoder), every
layer, head and real query token of the chosen subset, with teacher forcing on the reference,
writes to ``--windows-output-dir``:

* ``windows.tsv``: ``sample_id attention layer head query_position length centre window``
  (positions 0-based from the first real token; ``length`` is ``I``, the key length the query
  sees; ``window`` is ``D``, so ``sigma = D/2``);
* ``windows.md``: a Markdown table of window-size statistics per attention type and layer;
* ``windows_<attention>.png``: the localness paper's (P2) Figure 3 per layer: upper row the
  predicted centre ``P`` against the window size ``D`` (one point per real query and head, at most
  4000 random points per layer), lower row the histogram of ``D``;
* ``heads_<attention>.png``: P2 Figure 2, the window of each head per layer, one colour per head
  (the learned ``D^m`` for ``--localness-window head``; for the other strategies the mean ``D`` of
  the head with its standard deviation over queries); ``heads.md`` has the mean ``D`` per head.

Layers and heads are 0-based. Progress is logged every ``--log-interval`` batches.

``--path a.pt,b.pt`` analyses several checkpoints, each into ``<output dir>/<checkpoint folder>/``.
``--output-dir`` is another name of ``--windows-output-dir``. Takes fairseq-generate's data/model
options::

    man-localness-windows data-bin/wmt14 --path ckpt.pt --gen-subset test \\
        --batch-size 64 --windows-output-dir windows/
    # or: python -m man_recipes.cli.localness_windows ... (same options)
"""

import sys

import man_fairseq  # noqa: F401  (registers the archs before the checkpoint is loaded)
from man_recipes.logging_setup import setup_logging
from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.analysis.localness_windows import main


@one_line_on_ctrl_c("man-localness-windows")
def cli_main(argv=None):
    from fairseq import options

    setup_logging()
    parser = options.get_generation_parser()
    group = parser.add_argument_group("localness windows")
    group.add_argument("--windows-output-dir", "--output-dir", required=True,
                       help="folder for windows.tsv, windows.md, heads.md, windows_<attention>.png, heads_<attention>.png")
    args = options.parse_args_and_arch(parser, input_args=argv)
    from man_recipes.analysis.utils import check_output_dir

    check_output_dir(args.windows_output_dir)
    main(args)


if __name__ == "__main__":
    sys.exit(cli_main())
