"""The one logging setup of every command: no library debug noise, a headless matplotlib.

Importing fairseq sets the root logger to DEBUG (``fairseq/models/wav2vec/wav2vec2_classification.py``
calls ``logging.basicConfig(level=logging.DEBUG)``). matplotlib's font manager, Pillow's PNG plugin
and fontTools then print about 150 DEBUG lines per figure (2,000 for a loss plot). Every command
calls :func:`quiet_logging` (recipes, scripts) or :func:`setup_logging` (the analysis commands,
which log through fairseq's format) first thing in its entry point, and imports pyplot through
:func:`pyplot`; ``tests/test_quiet.py`` checks every command.
"""

import logging
import os
import sys

# loggers of the plotting stack that are noisy below WARNING
NOISY_LOGGERS = ("matplotlib", "PIL", "fontTools")


def silence_plotting_loggers():
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _requested_level():
    """fairseq's own knob: ``LOGLEVEL`` (default INFO)."""
    return logging.getLevelName(os.environ.get("LOGLEVEL", "INFO").upper())


def quiet_logging():
    """Undo fairseq's import-time DEBUG root level (back to ``LOGLEVEL``, default INFO) and hold
    the plotting libraries at WARNING. Handlers are left as they are."""
    level = _requested_level()
    root = logging.getLogger()
    if isinstance(level, int) and root.level < level:
        root.setLevel(level)
    silence_plotting_loggers()


def setup_logging(level=None):
    """fairseq's log format on stdout at ``LOGLEVEL`` (INFO), plotting libraries held at WARNING."""
    logging.basicConfig(
        level=_requested_level() if level is None else level, stream=sys.stdout,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
        force=True,  # fairseq configured the root logger at import (at DEBUG level)
    )
    silence_plotting_loggers()


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend, plotting loggers silenced."""
    silence_plotting_loggers()  # before the import: the font manager logs while it loads
    try:
        import matplotlib
    except ImportError:
        # matplotlib is the `analysis` extra, not a dependency: one line, not a traceback
        raise SystemExit("error: drawing a figure needs matplotlib, which is not installed: "
                         "pip install 'man-fairseq[analysis]' (or pip install matplotlib)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
