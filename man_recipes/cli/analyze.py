"""``man-analyze SUBCOMMAND ...``: one entry point for the attention analyses (docs/analysis.md).

Subcommands (each also installed under its own name, same options)::

    locality     man-attention-locality   MAN paper Table 5: attention share within |t-s| <= w
    localness    man-localness-windows    localness paper Figures 2-3: centres P, windows D, per head
    calibration  man-export-calibration   calibration paper Figures 2, 6, 7 and Table 5
    diffwin      man-diffwin-windows      differentiable window: phi_L, phi_R, m heat maps, widths

``man-analyze SUBCOMMAND --help`` lists a subcommand's options; ``python -m
man_recipes.cli.analyze`` works without the installed script.
"""

import sys
from typing import List, Optional

from man_recipes.logging_setup import quiet_logging
from man_recipes.interrupt import one_line_on_ctrl_c

SUBCOMMANDS = {
    "locality": ("man_recipes.cli.attention_locality", "attention share within |t-s| <= w (MAN Table 5)"),
    "localness": ("man_recipes.cli.localness_windows", "localness centres / windows (localness Fig. 2-3)"),
    "calibration": ("man_recipes.cli.export_calibration", "calibration JSD, ΔEnt, Kendall-τ (ACN Fig. 2, 6, 7, Table 5)"),
    "diffwin": ("man_recipes.cli.diffwin_windows", "differentiable-window boundaries, masks and widths"),
}


def usage() -> str:
    lines = ["usage: man-analyze SUBCOMMAND [options]   (man-analyze SUBCOMMAND --help)", "", "subcommands:"]
    lines += [f"  {name:<12} {what}" for name, (_, what) in SUBCOMMANDS.items()]
    return "\n".join(lines)


@one_line_on_ctrl_c("man-analyze")
def cli_main(argv: Optional[List[str]] = None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    import importlib

    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        raise SystemExit(f"man-analyze: unknown subcommand {name!r}\n{usage()}")
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sys.argv = [f"man-analyze {name}"] + rest  # fairseq's parser reads sys.argv for its program name
    module.cli_main(rest)


if __name__ == "__main__":
    sys.exit(cli_main())
