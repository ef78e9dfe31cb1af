"""Plugin options: every option declares its valid values, every bad value fails at start-up
naming the option, layer lists behave alike in every family, and `man-options` / docs/options.md
show them."""

import logging
import re
import subprocess
import sys
import time

import pytest
from conftest import REPO, TINY_MODEL, TINY_TRAIN, USER_DIR, call_entry_point, child_env, run_cli
from plugin_parsing import CRITERION, FAMILY_ARCH, parse

import man_fairseq  # noqa: F401  (registers the archs and the criterion)
from man_recipes.cli import options as man_options
from man_fairseq.plugin_options import Choice, Flag, Number, Parsed, PluginOptionError


def build(args):
    from fairseq import tasks

    task = tasks.setup_task(args)
    return task.build_model(args), task


def bad_value(rule):
    """A value outside the rule (what a hydra YAML, which argparse never sees, could hold)."""
    if isinstance(rule, Number):
        return rule.low if rule.low_open else rule.low - 1
    if isinstance(rule, Flag):
        return "yes"
    if isinstance(rule, (Choice, Parsed)):
        return "no_such_value"
    raise AssertionError(f"no bad value for {rule!r}")


def every_arch_option():
    """(family, dest, flag, rule) of every plugin option of every family, read from the code."""
    rules = man_options.declared_rules()
    found = []
    for family, archs in man_options.plugin_models().items():
        from fairseq.models import MODEL_REGISTRY

        for action in man_options._plugin_actions(MODEL_REGISTRY[family]):
            found.append((family, action.dest, action.option_strings[0], rules.get(action.dest)))
    return found


ARCH_OPTIONS = every_arch_option()


def test_every_plugin_option_declares_its_valid_values():
    assert {f for f, *_ in ARCH_OPTIONS} == set(FAMILY_ARCH), "one family without options?"
    missing = [(family, flag) for family, _, flag, rule in ARCH_OPTIONS if rule is None]
    assert not missing, f"declare valid values (metadata={{'valid': ...}} or a ChoiceEnum) for {missing}"
    for name in man_options.plugin_criterions():
        rows = man_options.criterion_options(name)
        assert rows and all(row.valid for row in rows), rows
    # and man-options shows a valid-values text for every one of them
    for family, arch in FAMILY_ARCH.items():
        assert all(row.valid for row in man_options.arch_options(arch))


@pytest.mark.parametrize("family, dest, flag, rule", ARCH_OPTIONS, ids=[o[2] for o in ARCH_OPTIONS])
def test_a_bad_value_of_every_option_fails_at_build_naming_it(tmp_path, family, dest, flag, rule):
    args = parse(tmp_path, FAMILY_ARCH[family], *(["--localness-layers", "0,1"] if family.endswith("localness") else []))
    value = bad_value(rule)
    setattr(args, dest, value)
    with pytest.raises(PluginOptionError, match=re.escape(flag)):
        build(args)


@pytest.mark.parametrize("arch, extra, message", [
    ("transformer_calibrated_small", ["--calibration-lambda", "-1"], "--calibration-lambda: invalid value '-1': must be >= 0"),
    ("transformer_calibrated_small", ["--calibration-anneal-steps", "0"],
     "--calibration-anneal-steps: invalid value '0': must be > 0"),
    ("transformer_calibrated_small", ["--calibration-lambda", "inf"],
     "--calibration-lambda: invalid value 'inf': must be a finite number"),
    ("transformer_man_small", ["--static-mask-window", "-2"], "--static-mask-window: invalid value '-2': must be >= 0"),
    ("transformer_man_small", ["--dman-max-relative-distance", "-1"],
     "--dman-max-relative-distance: invalid value '-1': must be >= 0"),
    ("transformer_localness_small", ["--localness-head-window-max", "0"],
     "--localness-head-window-max: invalid value '0': must be > 0"),
    ("transformer_localness_small", ["--max-relative-position", "0"], "--max-relative-position: invalid value '0': must be >= 1"),
    ("transformer_diffwin_small", ["--diffwin-temperature", "0"], "--diffwin-temperature: invalid value '0': must be > 0"),
    ("transformer_diffwin_small", ["--diffwin-layers", "-1"], "--diffwin-layers: invalid value '-1': must be >= 0"),
])
def test_range_errors_through_the_command_line_are_argparse_errors(tmp_path, capsys, arch, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        parse(tmp_path, arch, *extra)
    assert exit_info.value.code == 2
    assert f"error: argument {message}" in capsys.readouterr().err


def test_perturbation_weight_is_checked_on_the_command_line_and_when_the_criterion_is_built(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse(tmp_path, "transformer_calibrated_small", "--perturbation-weight", "-0.5", criterion=CRITERION)
    assert "argument --perturbation-weight: invalid value '-0.5': must be >= 0" in capsys.readouterr().err
    args = parse(tmp_path, "transformer_calibrated_small", "--perturbation-weight", "0.5", criterion=CRITERION)
    model, task = build(args)
    assert task.build_criterion(args).perturbation_weight == 0.5
    args.perturbation_weight = -0.5  # a value argparse never saw (a hydra YAML)
    with pytest.raises(ValueError, match=re.escape("--perturbation-weight -0.5: must be >= 0")):
        task.build_criterion(args)


def test_calibrated_criterion_refuses_other_archs_when_built(tmp_path):
    for arch in ("transformer_man_small", "transformer_localness_small", "transformer_iwslt_de_en"):
        from fairseq import tasks

        args = parse(tmp_path, arch, criterion=CRITERION)
        with pytest.raises(ValueError, match=f"needs a calibrated model .* got --arch {arch}"):
            tasks.setup_task(args).build_criterion(args)


def test_calibrated_criterion_with_another_arch_exits_at_start_up(toy_data_bin, tmp_path):
    """Through the real fairseq-train: a clear message, before any data is read, no crash.pt."""
    start = time.monotonic()
    proc = run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_man_small",
                    "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, "--criterion", CRITERION,
                    "--save-dir", tmp_path / "save", "--max-update", "2"], check=False, timeout=300)
    elapsed = time.monotonic() - start
    assert proc.returncode not in (0, 134, -6), proc.stdout[-3000:]
    assert "needs a calibrated model" in proc.stdout and "got --arch transformer_man_small" in proc.stdout
    assert not re.search(r"loaded \d+ examples", proc.stdout), "data was read before the check"
    assert "num_updates" not in proc.stdout
    assert not list(tmp_path.rglob("crash.pt"))
    print(f"refused in {elapsed:.1f}s")


# ------------------------------------------------------------------ layer lists: one behaviour


def localness_layers_of(model):
    return sorted({int(re.search(r"layers\.(\d+)\.", n)[1]) for n, m in model.named_modules()
                   if type(m).__name__ == "LocalnessBias"})


def diffwin_layers_of(model):
    from man_fairseq.modules.diff_window import WindowPointers

    return sorted({int(re.search(r"layers\.(\d+)\.", n)[1]) for n, m in model.named_modules()
                   if isinstance(m, WindowPointers)})


def test_default_layer_lists_are_cut_to_the_depth_with_a_note(tmp_path, caplog):
    # 2-layer TINY_MODEL; the defaults name the paper's lower three layers
    with caplog.at_level(logging.WARNING):
        model, _ = build(parse(tmp_path, "transformer_localness_small"))
    assert localness_layers_of(model) == [0, 1]
    assert "--localness-layers 0,1,2 is the default" in caplog.text and "using --localness-layers 0,1" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        model, _ = build(parse(tmp_path, "transformer_diffwin_small"))
    assert diffwin_layers_of(model) == [0, 1]
    assert "--diffwin-layers 3 is the default" in caplog.text and "using --diffwin-layers 2" in caplog.text


@pytest.mark.parametrize("arch, extra, message", [
    ("transformer_localness_small", ["--localness-layers", "0,3"], "--localness-layers 0,3: layers out of range"),
    ("transformer_localness_small", ["--localness-layers", "2"], "--localness-layers 2: layers out of range"),
    ("transformer_diffwin_small", ["--diffwin-layers", "4"], "--diffwin-layers 4: layers out of range"),
])
def test_explicit_layers_beyond_the_depth_are_errors_naming_the_option(tmp_path, arch, extra, message):
    with pytest.raises(ValueError, match=re.escape(message) + ".*the model has 2"):
        build(parse(tmp_path, arch, *extra))


def test_explicit_layers_within_the_depth_are_used_as_given(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        model, _ = build(parse(tmp_path, "transformer_localness_small", "--localness-layers", "1"))
        assert localness_layers_of(model) == [1]
        model, _ = build(parse(tmp_path, "transformer_diffwin_small", "--diffwin-layers", "1"))
        assert diffwin_layers_of(model) == [0]
    assert "is the default" not in caplog.text


# ------------------------------------------------------------------ discovery


def test_man_options_lists_each_arch_with_defaults_and_help():
    printed = {}
    for arch in ("transformer_man_small", "transformer_localness_base", "transformer_diffwin_big",
                 "transformer_calibrated"):
        # `python -m man_recipes.cli.options ARCH`, in this process: a new interpreter per arch
        # would pay the torch/fairseq import each time
        proc = call_entry_point(man_options.cli_main, [arch], prog="man-options")
        assert proc.returncode == 0, proc.stderr[-2000:]
        for row in man_options.arch_options(arch):
            assert f"{row.flag}  (default: {row.default})" in proc.stdout
            assert row.help.split(";")[0] in proc.stdout
        printed[arch] = proc.stdout
    man = printed["transformer_man_small"]
    # an arch's own default, not the family's
    assert "--decoder-sublayers  (default: san,cross,ffn)" in man
    assert "valid: integer >= 0" in man


def test_a_flag_is_said_to_take_no_value():
    # "valid: true or false" read as a value to type after the flag (issue 82); fairseq makes it a bare flag
    proc = call_entry_point(man_options.cli_main, ["transformer_localness_small"], prog="man-options")
    assert ("--relative-positions  (default: false)\n    valid: no value: a flag, given it is true (in a config: "
            "true or false)\n") in proc.stdout and "valid: true or false" not in proc.stdout
    flags = [row for arch in ("transformer_localness_small", "transformer_diffwin_base", "transformer_man_small",
                              "transformer_calibrated") for row in man_options.arch_options(arch)
             if row.default in ("false", "true")]
    assert flags and all(row.valid.startswith("no value: a flag") for row in flags)


HIDE_TORCH = """
import sys

class HideTorch:  # as if torch were not installed
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, HideTorch())
from man_recipes.cli.options import cli_main  # the console command's entry point
sys.argv = ["man-options", "transformer_man_small"]
sys.exit(cli_main())
"""


def test_without_torch_man_options_is_one_line():
    proc = subprocess.run([sys.executable, "-c", HIDE_TORCH], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    assert proc.stderr.startswith("man-options: torch is not installed: man-fairseq needs torch >= ") and \
        proc.stderr.count("\n") == 1, proc.stderr[-2000:]


def test_man_options_unknown_name_is_a_clear_error():
    proc = call_entry_point(man_options.cli_main, ["transformer_mann"], prog="man-options")
    assert proc.returncode == 2
    assert "unknown arch or criterion 'transformer_mann'" in proc.stderr and "transformer_man_small" in proc.stderr


def test_docs_options_table_is_in_sync_with_the_code():
    assert (REPO / "docs" / "options.md").read_text() == man_options.markdown(), (
        "regenerate: python -m man_recipes.cli.options --markdown > docs/options.md")
    text = man_options.markdown()
    for _, _, flag, _ in ARCH_OPTIONS:
        assert f"| `{flag}` |" in text
    assert "| `--perturbation-weight` |" in text
