"""``--model-overrides`` refuses a key the checkpoint has no option of, and ``--path`` a file that is no
checkpoint.

fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` (behind fairseq-generate, -interactive, -validate)
set any key it was given: another family's option or a misspelt name was ignored without a word. Such
a key, as given on the command line (or as a keyword of ``from_pretrained``: :func:`requested_overrides`),
is now refused in one line naming it (:func:`man_fairseq.plugin_options.check_model_overrides`, one
rule for both); bad values of known keys were refused
already, when the model is built. A ``--path`` that is not a checkpoint at all (a text file) is one line
saying so, not torch's ``KeyError: 101``.
"""

import ast
import contextlib
import contextvars
import os
import sys

from fairseq import checkpoint_utils

from .install import install


def command_line_model_overrides():
    """The keys of ``--model-overrides`` on this process's command line (the text fairseq's CLIs
    read it from), or () when it is not there or not a literal dict (fairseq then stops on it)."""
    argv, text = sys.argv[1:], None
    for i, arg in enumerate(argv):
        if arg == "--model-overrides" and i + 1 < len(argv):
            text = argv[i + 1]
        elif arg.startswith("--model-overrides="):
            text = arg.split("=", 1)[1]
    try:
        value = ast.literal_eval(text) if text else {}
    except (ValueError, SyntaxError):
        return ()
    return tuple(value) if isinstance(value, dict) else ()


# the overrides a Python caller gave (from_pretrained's keywords) and how to name one, while it loads
_REQUESTED = contextvars.ContextVar("requested_overrides", default=None)


@contextlib.contextmanager
def requested_overrides(keys, given_as):
    """Within it, the overrides checked are ``keys`` (named as ``given_as``, a format string of
    ``key``), not the command line's: the arguments of a Python call such as ``from_pretrained``."""
    token = _REQUESTED.set((tuple(keys), given_as))
    try:
        yield
    finally:
        _REQUESTED.reset(token)


def checking_overrides(fairseq_load):
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        """fairseq's ``load_checkpoint_to_cpu``, the overrides applied after a check that each key of the
        command line's ``--model-overrides`` is an option of the checkpoint (the state read before it)."""
        from fairseq.dataclass.utils import overwrite_args_by_name

        from ..checkpoint_errors import is_torch_file, load_error
        from ..plugin_options import PluginOptionError, check_model_overrides

        try:
            state = fairseq_load(path, None, load_on_all_ranks)
        except Exception as e:
            if os.path.isfile(path) and not is_torch_file(path):
                raise PluginOptionError(load_error(path, e)) from None
            raise
        if arg_overrides:
            keys, given_as = _REQUESTED.get() or (command_line_model_overrides(), "--model-overrides {key!r}")
            check_model_overrides({k: arg_overrides[k] for k in keys if k in arg_overrides}, state, path, given_as)
            if state.get("args") is not None:  # as fairseq applies them
                for name, value in arg_overrides.items():
                    setattr(state["args"], name, value)
            if state.get("cfg") is not None:
                overwrite_args_by_name(state["cfg"], arg_overrides)
        return state

    return load_checkpoint_to_cpu


def apply():
    install(checkpoint_utils, "load_checkpoint_to_cpu", checking_overrides)
