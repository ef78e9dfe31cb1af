"""List the plugin options of an architecture (or of the plugin's criterion) with their defaults,
valid values and help text.

``fairseq-train --arch transformer_man_small --help`` cannot show them: fairseq builds its help
before ``--user-dir`` has registered the plugin's models. This command reads the same argparse
options fairseq-train gets (the model class's ``add_args``), the arch function's defaults and the
valid values declared on the option dataclasses (:mod:`man_fairseq.plugin_options`), so a new
option appears here by itself::

    man-options transformer_localness_small
    man-options calibrated_label_smoothed_cross_entropy
    man-options                 # the names it knows
    man-options --markdown      # docs/options.md (a test keeps that file equal to this output)
    # or: python -m man_recipes.cli.options ... (same arguments)
"""

import argparse
import dataclasses
import inspect
import sys
from typing import Dict, List, NamedTuple, Optional

from man_recipes.logging_setup import quiet_logging
from man_recipes.tables import markdown_cell, markdown_table
from man_recipes.interrupt import one_line_on_ctrl_c


def plugin_options():
    """:mod:`man_fairseq.plugin_options`, the plugin imported first (it registers the archs and the
    criterion). Imported here, not with this module, so that without torch or fairseq ``man-options``
    says so in the plugin's one line (:mod:`man_fairseq.dependencies`), not in a traceback."""
    import man_fairseq  # noqa: F401
    from man_fairseq import plugin_options as module

    return module


def flag_text(given: bool) -> str:
    """What a flag takes on the command line: no value (fairseq makes a bool option a bare flag that
    sets it ``given``; ``true`` or ``false`` are its values in a hydra config or --model-overrides)."""
    return f"no value: a flag, given it is {str(given).lower()} (in a config: true or false)"


class Option(NamedTuple):
    flag: str
    default: str
    valid: str
    help: str


def plugin_models() -> Dict[str, List[str]]:
    """{model name: its archs} of the plugin's models, in registration order."""
    from fairseq.models import ARCH_MODEL_INV_REGISTRY, MODEL_REGISTRY

    plugin_options()  # registers them
    return {
        name: list(ARCH_MODEL_INV_REGISTRY.get(name, []))
        for name, cls in MODEL_REGISTRY.items() if cls.__module__.startswith("man_fairseq.")
    }


def plugin_criterions() -> Dict[str, type]:
    """{criterion name: its config dataclass} of the plugin's criterions."""
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY

    plugin_options()  # registers them
    return {
        name: CRITERION_DATACLASS_REGISTRY[name]
        for name, cls in CRITERION_REGISTRY.items()
        if cls.__module__.startswith("man_fairseq.") and name in CRITERION_DATACLASS_REGISTRY
    }


def declared_rules() -> Dict[str, object]:
    """{option dest: Rule} from every option dataclass defined in the plugin's model modules."""
    from fairseq.dataclass import FairseqDataclass

    own_fields, rule_of = plugin_options().own_fields, plugin_options().rule_of
    rules = {}
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("man_fairseq.models.") or module is None:
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, FairseqDataclass) and obj.__module__ == module_name:
                for f in own_fields(obj):
                    rule = rule_of(f)
                    if rule is not None:
                        rules[f.name] = rule
    return rules


def _plugin_actions(model_cls) -> List[argparse.Action]:
    """The argparse options of ``model_cls`` that fairseq's own ``transformer`` does not have."""
    from fairseq.models.transformer import TransformerModel

    ours, fairseqs = argparse.ArgumentParser(add_help=False), argparse.ArgumentParser(add_help=False)
    model_cls.add_args(ours)
    TransformerModel.add_args(fairseqs)
    theirs = {a.dest for a in fairseqs._actions}
    return [a for a in ours._actions if a.dest not in theirs]


def _show(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    value = getattr(value, "value", value)  # choice enums
    return repr(value) if value == "" else str(value)


def arch_options(arch: str) -> List[Option]:
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    plugin_options()  # registers the archs
    defaults = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](defaults)  # what an empty command line gets
    rules = declared_rules()
    rows = []
    for action in _plugin_actions(ARCH_MODEL_REGISTRY[arch]):
        rule = rules.get(action.dest)
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            valid = flag_text(action.const)  # "true or false" read as a value to type after it
        elif rule is not None:
            valid = rule.text
        elif action.choices:
            valid = "one of " + ", ".join(map(str, action.choices))
        else:
            valid = ""  # not declared: tests/test_options.py fails on this
        default = getattr(defaults, action.dest, action.default)
        rows.append(Option(action.option_strings[0], _show(default), valid, action.help or ""))
    return rows


def criterion_options(name: str) -> List[Option]:
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY

    options = plugin_options()
    config_cls = CRITERION_DATACLASS_REGISTRY[name]
    # only the fields the plugin adds to fairseq's parent criterion config
    parent = next((b for b in config_cls.__mro__[1:] if dataclasses.is_dataclass(b)), None)
    rows = []
    for f in options.own_fields(config_cls, base=parent):
        rule = options.rule_of(f)
        valid = flag_text(not f.default) if isinstance(rule, options.Flag) else rule.text if rule else ""
        rows.append(Option(options.option_flag(f.name), _show(f.default), valid, f.metadata.get("help", "")))
    return rows


def options_of(name: str) -> List[Option]:
    if name in plugin_criterions():
        return criterion_options(name)
    archs = [a for archs in plugin_models().values() for a in archs]
    if name not in archs:
        raise KeyError(name)
    return arch_options(name)


def format_text(name: str, rows: List[Option]) -> str:
    lines = [f"{name}: {len(rows)} plugin options (fairseq's own: fairseq-train --help)"]
    for row in rows:
        lines.append(f"\n{row.flag}  (default: {row.default})")
        lines.append(f"    valid: {row.valid or '(not declared)'}")
        if row.help:
            lines.append(f"    {row.help}")
    return "\n".join(lines) + "\n"


COLUMNS = ["option", "default", "valid values", "meaning"]  # of docs/options.md's tables


def markdown() -> str:
    """docs/options.md: one table per model (defaults of each arch where they differ)."""
    out = [
        "# Plugin options",
        "",
        "Generated by `man-options --markdown` (`python -m man_recipes.cli.options --markdown > "
        "docs/options.md`); `tests/test_options.py` fails when this file and the code disagree. "
        "fairseq's own options: `fairseq-train --help`. Every value is checked at start-up, "
        "before any data is read; a value other than the default of an option the built model does not "
        "read (e.g. `--static-mask-window` without an `sman2` sublayer) is a logged warning.",
    ]
    for model, archs in plugin_models().items():
        per_arch = {arch: arch_options(arch) for arch in archs}
        first = per_arch[archs[0]]
        cells = []
        for i, row in enumerate(first):
            others = {a: rows[i].default for a, rows in per_arch.items() if rows[i].default != row.default}
            default = f"`{row.default}`" + "".join(f" (`{a}`: `{d}`)" for a, d in others.items())
            cells.append([f"`{row.flag}`", markdown_cell(default), markdown_cell(row.valid), markdown_cell(row.help)])
        out += ["", f"## `{model}`", "", "archs: " + ", ".join(f"`{a}`" for a in archs), ""]
        out += markdown_table(COLUMNS, cells)
    for name in plugin_criterions():
        out += ["", f"## `--criterion {name}`", ""] + markdown_table(
            COLUMNS, [[f"`{row.flag}`", f"`{row.default}`", markdown_cell(row.valid), markdown_cell(row.help)]
                      for row in criterion_options(name)])
    return "\n".join(out) + "\n"


@one_line_on_ctrl_c("man-options")
def cli_main(argv: Optional[List[str]] = None) -> int:
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    parser = argparse.ArgumentParser(
        prog="man-options", description="List the plugin options of an arch or criterion.")
    parser.add_argument("name", nargs="?", help="an --arch of the plugin, or its criterion")
    parser.add_argument("--markdown", action="store_true", help="print docs/options.md (every arch and criterion)")
    args = parser.parse_args(argv)
    try:
        plugin_options()
    except ImportError as e:  # torch or fairseq missing, too old or broken: the plugin's one line
        print(f"man-options: {e}", file=sys.stderr)
        return 2
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    names = [a for archs in plugin_models().values() for a in archs] + list(plugin_criterions())
    if args.name is None:
        print("plugin archs and criterions:\n  " + "\n  ".join(names))
        return 0
    try:
        rows = options_of(args.name)
    except KeyError:
        print(f"man-options: unknown arch or criterion {args.name!r}; choose one of: {', '.join(names)}",
              file=sys.stderr)
        return 2
    sys.stdout.write(format_text(args.name, rows))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
