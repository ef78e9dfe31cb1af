"""``python -m lab.speed MODE ...`` (``scripts/speed.sh MODE ...``): the one speed command.

* ``study EXPERIMENT``: a study's real batches through fairseq-train and fairseq-generate (:mod:`.study`;
  ``scripts/speed.sh EXPERIMENT`` is this mode);
* ``synthetic``: the study mode on random sentences at the papers' widths, each family's paper config against
  the Transformer's (:mod:`.synthetic`);
* ``profile EXPERIMENT``: one update per family by op (torch.profiler) and, ``--passes``, calibration's
  update by phase (:mod:`.profile`).
"""

import sys
from man_recipes.interrupt import one_line_on_ctrl_c

MODES = ("study", "synthetic", "profile")


@one_line_on_ctrl_c("scripts/speed.sh")
def main(argv=None):
    import importlib

    from man_recipes.logging_setup import quiet_logging

    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if not argv or argv[0] not in MODES:
        print(f"usage: python -m lab.speed {{{','.join(MODES)}}} ...\nerror: the first argument is a mode", file=sys.stderr)
        return 2

    return importlib.import_module(f"lab.speed.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
