"""A wrong plugin option found when the model or criterion is built is one line, not a traceback.

An index beyond ``--encoder-layers``, the calibration criterion with another ``--arch``: fairseq's
CLIs printed a 40-line traceback for such a user mistake. ``sys.excepthook`` now prints a
:class:`~man_fairseq.plugin_options.PluginOptionError` as ``fairseq-train: error: MESSAGE`` (exit status
1), also when it was raised in one of the processes fairseq spawns per GPU (torch hands the parent
only that process's formatted traceback); every other exception keeps its traceback.
"""

import os
import re
import sys

from .install import install


def plugin_option_message(exc):
    """The message of a PluginOptionError ``exc``, or None when ``exc`` is not one.

    Under ``torch.multiprocessing.spawn`` (fairseq's ``distributed_utils.call_main`` on several
    GPUs) the error is raised in a child, and the parent receives a ProcessRaisedException whose
    text is the child's traceback: its last line is ``...PluginOptionError: MESSAGE``."""
    from torch.multiprocessing import ProcessRaisedException

    from ..plugin_options import PluginOptionError

    if isinstance(exc, PluginOptionError):
        return str(exc)
    if isinstance(exc, ProcessRaisedException):
        lines = [line for line in str(exc).splitlines() if line.strip()]
        found = re.fullmatch(r"(?:\w+\.)*PluginOptionError: (.*)", lines[-1]) if lines else None
        if found:
            return found.group(1)
    return None


def print_plugin_option_errors(previous):
    """A ``sys.excepthook`` that prints an uncaught PluginOptionError (:func:`plugin_option_message`)
    as one line, like argparse's usage errors, and hands every other exception to ``previous``."""

    def hook(exc_type, exc, tb):
        message = plugin_option_message(exc)
        if message is not None:
            prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
            sys.stderr.write(f"{prog}: error: {message}\n")
            sys.stderr.flush()
            return
        previous(exc_type, exc, tb)

    return hook


def apply():
    install(sys, "excepthook", print_plugin_option_errors)
