"""Average the parameters of the last N checkpoints of a fairseq run.

fairseq's ``scripts/average_checkpoints.py`` is not installed by pip; this is the same
command (same flags), installed as ``man-average-checkpoints`` and runnable as
``python -m man_recipes.cli.average_checkpoints``; the work is :mod:`man_recipes.averaging`'s.

    man-average-checkpoints --inputs checkpoints/run --num-epoch-checkpoints 5 --output avg.pt

``--output`` must be a new file (``--overwrite`` replaces an existing one); it is checked before
any checkpoint is read, and never a checkpoint fairseq keeps beside the inputs.
"""

import argparse
import sys

from man_recipes.averaging import AverageError, average_files, select_inputs
from man_recipes.logging_setup import quiet_logging
from man_recipes.interrupt import one_line_on_ctrl_c


def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", required=True, nargs="+",
                   help="checkpoint files, or one directory with --num-*-checkpoints")
    p.add_argument("--output", required=True, help="where to write the averaged checkpoint (a new file)")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointE.pt")
    g.add_argument("--num-update-checkpoints", type=int, help="average the last N checkpoint_E_U.pt")
    p.add_argument("--checkpoint-upper-bound", type=int,
                   help="ignore checkpoints after this epoch / update")
    args = p.parse_args(argv)
    inputs = select_inputs(args.inputs, args.num_epoch_checkpoints, args.num_update_checkpoints,
                           args.checkpoint_upper_bound)
    average_files(inputs, args.output, args.overwrite)


@one_line_on_ctrl_c("man-average-checkpoints")
def cli_main(argv=None):
    """The console command: main(), with an AverageError as one line ``ERROR: ...`` and exit status 2.
    ``argv`` lets tests and scripts/demo.py run it in-process (no second interpreter to import
    torch and fairseq)."""
    try:
        main(argv)
    except AverageError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    sys.exit(cli_main())
