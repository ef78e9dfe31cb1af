"""A bad plugin option is one clear line, not a traceback.

A value its option alone makes wrong is an argparse error (``fairseq-train: error: argument
--x: ...``, exit status 2) before anything runs; what only the model or criterion build can see
(layer indices and the depth, the criterion and the arch, fairseq options the plugin does not
implement) is a PluginOptionError, which fairseq-train prints as one line.
"""

import re
import subprocess
import sys

import pytest
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, child_env, run_bounded
from plugin_parsing import CRITERION, FAMILY_ARCH, parse

import man_fairseq  # noqa: F401  (registers the archs and the criterion)
from man_fairseq.patches.install import installed
from man_fairseq.patches.option_errors import print_plugin_option_errors
from man_fairseq.plugin_options import Choice, Flag, Number, Parsed, PluginOptionError, rule_of
from man_recipes.cli import options as man_options


def build(args, criterion=False):
    from fairseq import tasks

    task = tasks.setup_task(args)
    model = task.build_model(args)
    return task.build_criterion(args) if criterion else model


def bad_text(rule):
    """A command-line text outside ``rule``."""
    if isinstance(rule, Number):
        low = rule.low if rule.low_open else rule.low - 1
        return str(int(low) if rule.integer else low)
    if isinstance(rule, (Choice, Parsed)):
        return "no_such_value"
    raise AssertionError(f"no bad text for {rule!r}")


def valued_options():
    """(arch or None, flag, rule) of every plugin option that takes a value (true/false options
    are flags without one), of every family and of the plugin's criterion, read from the code."""
    from fairseq.models import MODEL_REGISTRY

    rules = man_options.declared_rules()
    found = []
    for family, arch in FAMILY_ARCH.items():
        for action in man_options._plugin_actions(MODEL_REGISTRY[family]):
            rule = rules[action.dest]
            if not isinstance(rule, Flag):
                found.append((arch, action.option_strings[0], rule))
    config = man_options.plugin_criterions()[CRITERION]
    for row in man_options.criterion_options(CRITERION):
        field = config.__dataclass_fields__[row.flag[2:].replace("-", "_")]
        found.append((None, row.flag, rule_of(field)))
    return found


VALUED = valued_options()


def test_the_options_are_found():
    flags = {flag for _, flag, _ in VALUED}
    assert {"--static-mask-window", "--encoder-sublayers", "--localness-layers", "--diffwin-segment-size",
            "--diffwin-decoder-mask", "--calibration-lambda", "--perturbation-weight"} <= flags


@pytest.mark.parametrize("arch, flag, rule", VALUED, ids=[f"{a}{f}" for a, f, _ in VALUED])
def test_a_bad_value_of_every_option_is_an_argparse_error(tmp_path, capsys, arch, flag, rule):
    extra = [flag, bad_text(rule)]
    with pytest.raises(SystemExit) as exit_info:
        if arch is None:
            parse(tmp_path, "transformer_calibrated_small", *extra, criterion=CRITERION)
        else:
            parse(tmp_path, arch, *extra)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(rf"error: argument {re.escape(flag)}: invalid (value|choice)", err), err[-500:]
    assert "Traceback" not in err


@pytest.mark.parametrize("arch, extra, message", [
    ("transformer_man_small", ["--encoder-sublayers", "dman,foo,ffn"],
     "argument --encoder-sublayers: invalid value 'dman,foo,ffn': unknown sublayer(s) ['foo']; allowed: "),
    ("transformer_man_small", ["--decoder-sublayers", "dman,san,ffn"],
     "argument --decoder-sublayers: invalid value 'dman,san,ffn': must contain 'cross'"),
    ("transformer_man_small", ["--static-mask-window", "1.5"], "argument --static-mask-window: invalid int value: '1.5'"),
    ("transformer_localness_small", ["--localness-layers", "0,-1"],
     "argument --localness-layers: invalid value '0,-1': layer indices are 0-based and >= 0"),
    ("transformer_localness_small", ["--localness-attention-types", "encoder_self,decoder"],
     "argument --localness-attention-types: invalid value 'encoder_self,decoder': unknown attention type(s) "
     "['decoder']"),
    ("transformer_diffwin_small", ["--diffwin-decoder-mask", "segment"],
     "argument --diffwin-decoder-mask: invalid value 'segment': decoder self-attention supports token masks only"),
    ("transformer_calibrated_small", ["--calibration-lambda", "nan"],
     "argument --calibration-lambda: invalid value 'nan': must be a finite number"),
    # the ceilings (issue #72): each value once allocated terabytes, overflowed int64 or ended in NaN
    ("transformer_man_small", ["--dman-max-relative-distance", str(10 ** 12)],
     "argument --dman-max-relative-distance: invalid value '1000000000000': must be >= 0 and <= 65536"),
    ("transformer_man_small", ["--static-mask-window", str(10 ** 21)],
     "argument --static-mask-window: invalid value '1000000000000000000000': must be >= 0 and <= 65536"),
    ("transformer_localness_small", ["--max-relative-position", "65537"],
     "argument --max-relative-position: invalid value '65537': must be >= 1 and <= 65536"),
    ("transformer_diffwin_small", ["--diffwin-segment-size", "65537"],
     "argument --diffwin-segment-size: invalid value '65537': must be >= 1 and <= 65536"),
    ("transformer_calibrated_small", ["--calibration-lambda", "1e300"],
     "argument --calibration-lambda: invalid value '1e300': must be >= 0 and <= 100"),
])
def test_argparse_errors_say_what_is_wrong(tmp_path, capsys, arch, extra, message):
    with pytest.raises(SystemExit):
        parse(tmp_path, arch, *extra)
    assert message in capsys.readouterr().err


def test_good_values_still_parse_as_their_type(tmp_path):
    args = parse(tmp_path, "transformer_man_small", "--static-mask-window", "0", "--encoder-sublayers", "san,ffn")
    assert args.static_mask_window == 0 and args.encoder_sublayers == "san,ffn"
    args = parse(tmp_path, "transformer_localness_small", "--localness-layers", "", "--localness-fixed-window", "2.5")
    assert args.localness_layers == "" and args.localness_fixed_window == 2.5


@pytest.mark.parametrize("arch, extra, criterion, message", [
    ("transformer_localness_small", ["--localness-layers", "0,5"], False,
     "--localness-layers 0,5: layers out of range, the model has 2"),
    ("transformer_diffwin_small", ["--diffwin-layers", "4"], False, "--diffwin-layers 4: layers out of range"),
    ("transformer_calibrated_small", ["--checkpoint-activations"], False,
     "transformer_calibrated does not support --checkpoint-activations"),
    ("transformer_calibrated_small", ["--no-cross-attention"], False, "needs the encoder-decoder attention"),
    ("transformer_calibrated_small", ["--criterion", "label_smoothed_cross_entropy"], False,
     f"--arch transformer_calibrated_* trains with --criterion {CRITERION} (its mask perturbation model learns "
     "only from that joint loss); got --criterion label_smoothed_cross_entropy (a checkpoint trained so loads "
     f"with --model-overrides \"{{'criterion': '{CRITERION}'}}\")"),
    ("transformer_man_small", ["--no-cross-attention"], False, "transformer_man does not support --no-cross-attention"),
    ("transformer_man_small", ["--cross-self-attention"], False,
     "transformer_man does not support --cross-self-attention"),
    ("transformer_localness_small", ["--localness-layers", "0,1", "--cross-self-attention"], False,
     "--cross-self-attention is not supported"),
    ("transformer_man_small", [], True, "needs a calibrated model (--arch transformer_calibrated_small/_base/_big, "
                                        "or transformer_masked_* with --calibration-layers), "
                                        "got --arch transformer_man_small"),
])
def test_what_only_the_build_can_see_is_a_plugin_option_error(tmp_path, arch, extra, criterion, message):
    args = parse(tmp_path, arch, *extra, criterion=CRITERION if criterion else None)
    with pytest.raises(PluginOptionError, match=re.escape(message)):
        build(args, criterion=criterion)


def test_the_plugin_prints_its_option_errors_as_one_line(capsys, monkeypatch):
    assert installed(sys, "excepthook"), "installed when the plugin is imported"
    seen = []
    hook = print_plugin_option_errors(lambda *exc_info: seen.append(exc_info[1]))
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/fairseq-train", "data-bin"])
    try:
        raise PluginOptionError("--localness-layers 0,5: layers out of range")
    except PluginOptionError as e:
        hook(type(e), e, e.__traceback__)
    assert capsys.readouterr().err == "fairseq-train: error: --localness-layers 0,5: layers out of range\n"
    assert seen == []
    other = ValueError("a defect, not a user's mistake")
    hook(ValueError, other, None)
    assert seen == [other] and capsys.readouterr().err == ""  # every other exception keeps its traceback


SPAWNED = """
import torch.multiprocessing as mp

import man_fairseq  # noqa: F401  (as --user-dir does: installs the excepthook)
from man_fairseq.plugin_options import PluginOptionError


def build(rank):  # what each process of fairseq's call_main does when the model is built
    raise PluginOptionError("--localness-layers 0,5: layers out of range, the model has 2")


if __name__ == "__main__":
    mp.spawn(build, nprocs=1, join=True)
"""


def test_an_option_error_in_a_spawned_process_is_one_line_too(tmp_path, capsys):
    # fairseq-train on several GPUs builds the model in processes torch.multiprocessing.spawn
    # starts (distributed_utils.call_main); the parent only gets their formatted traceback
    script = tmp_path / "fairseq-train"
    script.write_text(SPAWNED)
    proc = run_bounded([sys.executable, script], 300, env=child_env({"PYTHONPATH": str(USER_DIR + "/..")}),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    assert proc.stderr == "fairseq-train: error: --localness-layers 0,5: layers out of range, the model has 2\n"
    # any other exception of a spawned process keeps its traceback
    from torch.multiprocessing import ProcessRaisedException

    seen = []
    hook = print_plugin_option_errors(lambda *exc_info: seen.append(exc_info[1]))
    trace = "Traceback (most recent call last):\n  File \"x.py\", line 1, in build\nRuntimeError: a defect\n"
    other = ProcessRaisedException("\n\n-- Process 0 terminated with the following error:\n" + trace, 0, 1)
    hook(ProcessRaisedException, other, None)
    assert seen == [other] and capsys.readouterr().err == ""


@pytest.mark.parametrize("extra, status, last_line", [
    (["--arch", "transformer_man_small", "--static-mask-window", "-1"], 2,
     "fairseq-train: error: argument --static-mask-window: invalid value '-1': must be >= 0 and <= 65536"),
    (["--arch", "transformer_calibrated_small", "--criterion", CRITERION, "--perturbation-weight", "-1"], 2,
     "fairseq-train: error: argument --perturbation-weight: invalid value '-1': must be >= 0"),
    (["--arch", "transformer_localness_small", "--localness-layers", "0,5"], 1,
     "fairseq-train: error: --localness-layers 0,5: layers out of range, the model has 2 (0-based indices < 2)"),
    (["--arch", "transformer_calibrated_small"], 1,  # TINY_TRAIN's label_smoothed_cross_entropy
     f"fairseq-train: error: --arch transformer_calibrated_* trains with --criterion {CRITERION} (its mask "
     "perturbation model learns only from that joint loss); got --criterion label_smoothed_cross_entropy (a "
     f"checkpoint trained so loads with --model-overrides \"{{'criterion': '{CRITERION}'}}\")"),
    (["--arch", "transformer_man_small", "--criterion", CRITERION], 1,
     f"fairseq-train: error: --criterion {CRITERION} needs a calibrated model "
     "(--arch transformer_calibrated_small/_base/_big, or transformer_masked_* with --calibration-layers), "
     "got --arch transformer_man_small"),
])
def test_fairseq_train_prints_one_line_and_no_traceback(toy_data_bin, tmp_path, extra, status, last_line):
    # (a --criterion in ``extra`` comes after TINY_TRAIN's: the last one counts)
    cmd = ["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--share-all-embeddings", *TINY_MODEL,
           *TINY_TRAIN, *extra, "--save-dir", tmp_path / "save", "--max-update", "2"]
    proc = run_bounded(cmd, 300, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.returncode == status, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.rstrip("\n").splitlines()[-1] == last_line
    assert (proc.stderr + proc.stdout).count(" error: ") == 1
    assert not re.search(r"loaded \d+ examples", proc.stdout), "data was read before the check"
    assert not (tmp_path / "save").exists() or not any((tmp_path / "save").iterdir())
