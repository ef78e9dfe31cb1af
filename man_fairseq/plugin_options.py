"""The plugin's options: one declaration of each option's valid values, checked at start-up.

Every option of the four families (and of the calibration criterion) is a field of a
``FairseqDataclass``. Its valid values are declared next to its default and help text:

* a ``ChoiceEnum`` field: its choices (the one list in the code the enum is made from);
* a ``bool`` field: true / false;
* any other field: ``metadata={"valid": Rule}`` (:class:`Number` for ranges, :class:`Parsed`
  for the comma-separated specs).

Checked twice, from the same declaration:

* on the command line, by argparse: :func:`add_option_args` gives each option with a declared rule
  an argparse ``type`` that applies it, so fairseq-train stops with its usual one-line usage error
  (``fairseq-train: error: argument --static-mask-window: invalid value '-1': must be >= 0 and <= 65536``,
  exit status 2) before anything else runs;
* when the model or criterion is built, by :func:`check_options`: values argparse never sees (a
  hydra YAML, ``--model-overrides``) and what depends on other options (layer indices and the
  depth, the criterion and the arch). These raise :class:`PluginOptionError`, which fairseq's
  CLIs print as one line (see :mod:`man_fairseq.patches.option_errors`).

The models call :func:`check_options` in ``build_model`` and the criterion in
``build_criterion``, both of which fairseq-train runs before it reads any data.
``man-options ARCH`` (a console command, beside the plugin) prints the same declarations.
"""

import argparse
import dataclasses
import inspect
import math
from argparse import Namespace
from enum import Enum
from typing import Callable, Iterable, List, Optional, Tuple

from fairseq.dataclass.utils import gen_parser_from_dataclass, interpret_dc_type
from hydra.errors import CompactHydraException

VALID = "valid"  # the dataclass field metadata key of a Rule
# The ceiling of every distance and window option (in tokens): 64 x fairseq's default
# --max-source-positions (1024), far beyond any sequence the recipes train on. Larger ones made the
# DMAN distance table (2K+1 parameters per sublayer) exhaust memory or the int64 distance arithmetic
# overflow before the first update (--dman-max-relative-distance 10^12: 8 TB).
MAX_DISTANCE = 65536
# The ceiling of the fixed fusion's lambda: a + lambda a^c stays within 1 + lambda of the attention
# weights, finite in fp16 (max 65504); 1e300 overflowed to inf and NaN.
MAX_CALIBRATION_LAMBDA = 100


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class PluginOptionError(ValueError, CompactHydraException):
    """A plugin option that is wrong, found when the model or criterion is built.

    A user's mistake, not a defect: fairseq's argparse CLIs print only its message
    (:func:`man_fairseq.patches.option_errors.print_plugin_option_errors`), and hydra prints a
    ``CompactHydraException`` as its message alone (fairseq-hydra-train)."""


class Rule:
    """Valid values of one option. ``problem(value)`` is None or why the value is invalid."""

    text = ""

    def problem(self, value) -> Optional[str]:
        raise NotImplementedError


class Number(Rule):
    """A finite int or float within ``[low, high]`` (``low_open``: ``> low``)."""

    def __init__(self, low=None, high=None, low_open=False, integer=False):
        self.low, self.high, self.low_open, self.integer = low, high, low_open, integer
        self.kind = "an integer" if integer else "a finite number"
        bounds = []
        if low is not None:
            bounds.append(f"{'>' if low_open else '>='} {low}")
        if high is not None:
            bounds.append(f"<= {high}")
        self.bounds = " and ".join(bounds)
        self.text = ("integer " if integer else "number ") + self.bounds

    def problem(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"must be {self.kind}"
        if self.integer and not float(value).is_integer():
            return f"must be {self.kind}"
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and value > self.high
        if too_low or too_high:
            return f"must be {self.bounds}"
        return None


class Choice(Rule):
    """One of ``choices``; ``why``: the reason the other values are refused (default: unknown)."""

    def __init__(self, choices: Iterable[str], why: str = "unknown value"):
        self.choices = tuple(str(c) for c in choices)
        self.why = why
        self.text = "one of " + ", ".join(self.choices)

    def problem(self, value):
        if isinstance(value, Enum):
            value = value.value
        if value not in self.choices:
            return f"{self.why}; choose one of {list(self.choices)}"
        return None


class Flag(Rule):
    text = "true or false"

    def problem(self, value):
        return None if isinstance(value, bool) else "must be true or false"


class Parsed(Rule):
    """A string that ``parse(value)`` accepts (it raises ValueError with the reason otherwise)."""

    def __init__(self, parse: Callable[[str], object], text: str):
        self.parse, self.text = parse, text

    def problem(self, value):
        if not isinstance(value, str):
            return f"must be a string ({self.text})"
        try:
            self.parse(value)
        except ValueError as e:
            return str(e)
        return None


def rule_of(f: dataclasses.Field) -> Optional[Rule]:
    """The declared valid values of one dataclass field (None: nothing declared)."""
    if VALID in f.metadata:
        return f.metadata[VALID]
    field_type = interpret_dc_type(f.type)
    if inspect.isclass(field_type) and issubclass(field_type, Enum):
        return Choice(e.value for e in field_type)
    if field_type is bool:
        return Flag()
    return None


def own_fields(config_cls, base=None) -> List[dataclasses.Field]:
    """The user options of ``config_cls`` that ``base`` (a parent dataclass) does not have.

    Private fields and fields that only interpolate another config value (``II(...)``, which
    fairseq does not put on the command line) are not options.
    """
    inherited = {f.name for f in dataclasses.fields(base)} if base is not None else set()
    return [
        f for f in dataclasses.fields(config_cls)
        if not f.name.startswith("_") and f.name not in inherited
        and not (isinstance(f.default, str) and f.default.startswith("${"))
    ]


def check_options(args, config_cls, base=None, where: str = "") -> None:
    """Raise PluginOptionError naming the option for the first value outside its declared range."""
    for f in own_fields(config_cls, base):
        rule = rule_of(f)
        if rule is None:
            raise TypeError(f"{config_cls.__name__}.{f.name} declares no valid values")
        value = getattr(args, f.name, None)
        if value is None:
            raise PluginOptionError(f"{where}{option_flag(f.name)} is not set")
        problem = rule.problem(value)
        if problem is not None:
            raise PluginOptionError(f"{where}{option_flag(f.name)} {value!r}: {problem}")


def argparse_type(flag: str, rule: Rule, convert: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse ``type``: ``convert`` (fairseq's int / float / str), then ``rule``.

    A refused value raises ArgumentTypeError, which argparse prints as
    ``prog: error: argument FLAG: invalid value 'TEXT': why`` and exits with status 2. A text
    ``convert`` cannot read keeps argparse's own ``invalid int value: 'TEXT'``.
    """

    def parse(text):
        value = convert(text)
        problem = rule.problem(value)
        if problem is not None:
            # the parsers of the comma-separated specs name the option themselves
            for prefix in (flag + ": ", flag + " "):
                if problem.startswith(prefix):
                    problem = problem[len(prefix):]
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: {problem}")
        return value

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse's "invalid <name> value"
    parse.rule = rule
    return parse


def add_option_args(parser, config, delete_default: bool = True) -> None:
    """fairseq's ``gen_parser_from_dataclass`` for ``config``, with each option's declared rule
    (``metadata={"valid": ...}``) checked by argparse (:func:`argparse_type`).

    Choice enums keep argparse's ``choices`` (``invalid choice: 'x' (choose from ...)``) and
    true/false options are flags, so only declared rules need a ``type``. ``delete_default``:
    the models' arch functions fill the defaults; a criterion keeps them on the parser.
    """
    gen_parser_from_dataclass(parser, config, delete_default=delete_default)
    rules = {option_flag(f.name): f.metadata[VALID] for f in own_fields(type(config)) if VALID in f.metadata}
    # an argument group shares its parser's list of actions
    for action in parser._actions:
        flag = action.option_strings[0] if action.option_strings else None
        if flag in rules and action.type is not None and not hasattr(action.type, "rule"):
            action.type = argparse_type(flag, rules[flag], action.type)


def as_namespace(args):
    """A flat argparse Namespace of the model options, also from a hydra DictConfig.

    fairseq-hydra-train hands ``build_model`` the ``model:`` node of the YAML (after the arch
    function filled its defaults). fairseq's ``TransformerConfig.from_namespace`` copies the
    options it does not know (the plugin's) only from a Namespace, so the plugin models convert
    once, at the top of ``build_model``.
    """
    if isinstance(args, Namespace):
        return args
    from omegaconf import OmegaConf

    if OmegaConf.is_config(args):
        return Namespace(**OmegaConf.to_container(args, resolve=True, enum_to_str=True))
    return args


# ---- layer options -------------------------------------------------------------------------
#
# Two forms, one per option, kept as the papers and every saved config and checkpoint have them:
# --localness-layers is a list of 0-based indices ("0,1,2", "all", ""), --diffwin-layers a count N
# (the lower N layers). A bare number means an index in the one and a count in the other, so
# neither accepts the other's form. What they share is the rule for a model shallower than the
# value (:func:`fit_layers`).


def parse_layer_spec(spec: str) -> Optional[Tuple[int, ...]]:
    """``"0,1,2"`` -> (0, 1, 2); ``"all"`` -> None (every layer); ``""`` -> ()."""
    spec = (spec or "").strip()
    if spec == "":
        return ()
    if spec == "all":
        return None
    try:
        layers = sorted({int(x) for x in spec.split(",") if x.strip() != ""})
    except ValueError:
        raise ValueError(f"expected comma-separated layer indices or 'all', got {spec!r}")
    if any(i < 0 for i in layers):
        raise ValueError(f"layer indices are 0-based and >= 0, got {spec!r}")
    return tuple(layers)


def parse_layer_set(spec: str, num_layers: int, option: str) -> Tuple[int, ...]:
    """``"0,1,2"`` / ``"all"`` / ``""`` -> sorted 0-based layer indices, validated."""
    try:
        layers = parse_layer_spec(spec)
    except ValueError as e:
        raise PluginOptionError(f"{option}: {e}")
    if layers is None:
        return tuple(range(num_layers))
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise PluginOptionError(f"{option}: layer indices {bad} out of range for {num_layers} layers (0-based)")
    return layers


def layers_within(spec: str, num_layers: int):
    """``spec`` without the indices >= num_layers, or None when nothing is cut."""
    layers = parse_layer_spec(spec)
    if layers is None or all(i < num_layers for i in layers):
        return None
    return ",".join(str(i) for i in layers if i < num_layers)


def count_within(count: int, num_layers: int):
    """A layer count (``--diffwin-layers N``: the lower N layers) cut to ``num_layers``, or None when it fits."""
    return num_layers if count > num_layers else None


def fit_layers(option: str, value, default, num_layers: int, within, log):
    """The one rule for a layer option that names more layers than the model has.

    The family's default (the papers' "lower three layers") is cut to the model's depth with a
    logged note; any other value that does not fit is an error naming the option.
    ``within(value, n)`` is ``value`` cut to ``n`` layers, or None when it already fits.
    """
    cut = within(value, num_layers)
    if cut is None:
        return value
    if str(value) == str(default):
        log.warning(
            "%s %s is the default (the paper's lower three layers), the model has %d layers: "
            "using %s %s (pass the option explicitly to choose)", option, value, num_layers, option, cut,
        )
        return cut
    raise PluginOptionError(
        f"{option} {value}: layers out of range, the model has {num_layers} (0-based indices < {num_layers})"
    )


# ---- --model-overrides ----------------------------------------------------------------------


def checkpoint_option_names(state) -> set:
    """Every option name a loaded checkpoint's configuration holds (its model's, task's, criterion's
    ... groups, and the ``args`` of older checkpoints), before any override is applied."""
    names = set()

    def walk(node):
        if isinstance(node, Namespace):
            names.update(vars(node))
        elif isinstance(node, dict) or hasattr(node, "keys"):  # a dict or an omegaconf DictConfig
            for key in list(node.keys()):
                names.add(str(key))
                try:
                    walk(node[key])
                except Exception:  # a mandatory value never given ("???")
                    pass

    walk(state.get("cfg") or {})
    walk(state.get("args") or Namespace())
    return names


def arch_option_names(arch) -> set:
    """The options the model class registered for ``arch`` declares today (empty if unknown): an
    option added after a checkpoint was saved is still read, with its default, when it is loaded."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    cls = ARCH_MODEL_REGISTRY.get(arch)
    if cls is None:
        return set()
    config = getattr(cls, "__dataclass", None)
    if config is not None:
        return {f.name for f in dataclasses.fields(config)}
    parser = argparse.ArgumentParser(add_help=False)
    try:
        cls.add_args(parser)
    except Exception:  # a model whose add_args needs fairseq's full parser
        return set()
    return {action.dest for action in parser._actions}


def chosen_component_option_names(overrides) -> set:
    """The options of the components ``overrides`` choose by name (``bpe="subword_nmt"``,
    ``tokenizer="moses"``): fairseq replaces such a group with the chosen component's, whose
    options (``bpe_codes``, ``moses_no_dash_splits``) it then sets from the same overrides."""
    from fairseq.registry import REGISTRIES

    names = set()
    for key, value in overrides.items():
        chosen = REGISTRIES.get(key, {}).get("dataclass_registry", {}).get(value) if isinstance(value, str) else None
        if chosen is not None:
            names |= {f.name for f in dataclasses.fields(chosen)}
    return names


def check_model_overrides(overrides, state, path, given_as="--model-overrides {key!r}") -> None:
    """Refuse (:class:`PluginOptionError`) an override (``{key: value}``, as the user gave it: the
    command line's ``--model-overrides`` or ``from_pretrained``'s keywords, ``given_as`` naming it)
    that the checkpoint ``path`` (loaded as ``state``) has no option of, its arch does not declare and
    no component the overrides choose reads: fairseq would set it where nothing reads it (another
    family's option, a misspelt name, a plugin option on fairseq's own Transformer) and decode as if
    it had not been given."""
    import difflib

    cfg, args = state.get("cfg") or {}, state.get("args")
    model = cfg.get("model") if hasattr(cfg, "get") else None
    arch = getattr(model, "_name", None) or getattr(model, "arch", None) or getattr(args, "arch", None) or "?"
    known = checkpoint_option_names(state) | arch_option_names(arch) | chosen_component_option_names(overrides)
    unknown = [key for key in overrides if key not in known]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=0.8)  # a misspelling, not a look-alike
    raise PluginOptionError(
        f"{given_as.format(key=unknown[0])}: {path} (arch {arch}) has no option of that name, so it would be ignored"
        + (f"; did you mean {close[0]!r}?" if close else "; `man-options ARCH` lists an arch's options"))
