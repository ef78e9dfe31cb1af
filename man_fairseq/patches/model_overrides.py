"""``--model-overrides`` is a dict of options the checkpoint has and that leave its model as trained, and
``--path`` a checkpoint.

fairseq's CLIs read ``--model-overrides`` with ``ast.literal_eval`` (``eval`` in fairseq-eval-lm and
-validate) when they load the model: an unclosed brace was a ``SyntaxError`` traceback, a list an
``AttributeError`` one. The option's text is now read when the arguments are parsed
(:func:`parse_model_overrides`, the argparse ``type`` of ``--model-overrides`` in every parser built from
fairseq's ``CommonEvalConfig``): anything but a literal dict of names is argparse's one line, exit 2.

fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` (behind fairseq-generate, -interactive, -validate)
set any key it was given: another family's option or a misspelt name was ignored without a word, and an
option that defines the model (``{'encoder_embed_dim': 64}``) built another model than the parameters'
(a traceback of size mismatches, or, where the shapes agree, another model decoding). Such a key, as
given on the command line (or as a keyword of ``from_pretrained``: :func:`requested_overrides`), is now
refused in one line naming it (:func:`man_fairseq.plugin_options.check_model_overrides`,
:func:`check_model_defining_overrides`, one rule for both); bad values of known keys were refused
already, when the model is built. A ``--path`` that is not a checkpoint at all (a text file) is one line
saying so, not torch's ``KeyError: 101``.
"""

import argparse
import ast
import contextlib
import contextvars
import os
import sys

from fairseq import checkpoint_utils, options
from fairseq.dataclass.configs import CommonEvalConfig

from .install import install

EXAMPLE = "\"{'attention_backend': 'flex'}\""


def parse_model_overrides(text) -> dict:
    """``--model-overrides`` as a dict, read as a Python literal (never evaluated as code); anything but a
    dict of option names raises ValueError saying what it must be."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"must be a literal dict of option names to values, e.g. {EXAMPLE}; got {text!r}")
    return value


def model_overrides_type(text):
    """The argparse ``type`` of ``--model-overrides``: its text as given, once it reads as a dict."""
    try:
        parse_model_overrides(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def command_line_model_overrides():
    """The keys of ``--model-overrides`` on this process's command line (the text fairseq's CLIs
    read it from), or () when it is not there or not a literal dict (refused when parsed)."""
    argv, text = sys.argv[1:], None
    for i, arg in enumerate(argv):
        if arg == "--model-overrides" and i + 1 < len(argv):
            text = argv[i + 1]
        elif arg.startswith("--model-overrides="):
            text = arg.split("=", 1)[1]
    try:
        return tuple(parse_model_overrides(text)) if text else ()
    except ValueError:
        return ()


def check_model_defining_overrides(overrides, state, path, given_as="--model-overrides {key!r}") -> None:
    """Refuse (PluginOptionError) an override in ``overrides`` (a dict) of an option that defines the model
    (:mod:`man_fairseq.model_options`) with another value than the checkpoint ``path`` (``state``) holds;
    the key is named as ``given_as`` formats it."""
    from ..model_options import differing_options, option_value, saved_model_options
    from ..plugin_options import PluginOptionError

    saved = saved_model_options(state)
    if saved is None:
        return
    arch = option_value(saved, "arch") or option_value(saved, "_name")
    changed = differing_options(saved, overrides, arch)
    if changed:
        name, old, new = changed[0]
        raise PluginOptionError(
            f"{given_as.format(key=name)}: {new!r} would change the model {path} was trained as ({name} {old!r}); "
            "an option that defines the model cannot be overridden (dropout, attention_backend and the like can)")


def checking_the_text(fairseq_gen_parser_from_dataclass):
    def gen_parser_from_dataclass(parser, dataclass_instance, *args, **kwargs):
        """fairseq's ``gen_parser_from_dataclass`` as ``fairseq.options`` calls it; a
        ``CommonEvalConfig``'s ``--model-overrides`` gets :func:`model_overrides_type`."""
        fairseq_gen_parser_from_dataclass(parser, dataclass_instance, *args, **kwargs)
        if isinstance(dataclass_instance, CommonEvalConfig):
            for action in parser._actions:  # an argument group shares its parser's list of actions
                if "--model-overrides" in action.option_strings:
                    action.type = model_overrides_type

    return gen_parser_from_dataclass


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
            given = {k: arg_overrides[k] for k in keys if k in arg_overrides}
            check_model_overrides(given, state, path, given_as)
            check_model_defining_overrides(given, state, path, given_as)
            if state.get("args") is not None:  # as fairseq applies them
                for name, value in arg_overrides.items():
                    setattr(state["args"], name, value)
            if state.get("cfg") is not None:
                overwrite_args_by_name(state["cfg"], arg_overrides)
        return state

    return load_checkpoint_to_cpu


def apply():
    install(options, "gen_parser_from_dataclass", checking_the_text)
    install(checkpoint_utils, "load_checkpoint_to_cpu", checking_overrides)
