"""Shared plotting setup of the analysis commands: a headless matplotlib without log noise.

matplotlib's font manager, Pillow's PNG plugin and fontTools log at DEBUG/INFO level; when a
command (or fairseq) configures the root logger at a low level, one figure prints about 150 such
lines. Every command imports pyplot through :func:`pyplot` and sets up logging through
:func:`setup_logging`, so no command prints them.
"""

import logging
import sys

# loggers of the plotting stack that are noisy below WARNING
NOISY_LOGGERS = ("matplotlib", "PIL", "fontTools")


def silence_plotting_loggers():
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def setup_logging(level=logging.INFO):
    """fairseq's log format on stdout, with the plotting libraries held at WARNING."""
    logging.basicConfig(
        level=level, stream=sys.stdout,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
        force=True,  # fairseq may have configured the root logger at import (at DEBUG level)
    )
    silence_plotting_loggers()


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend, plotting loggers silenced."""
    silence_plotting_loggers()  # before the import: the font manager logs while it loads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
