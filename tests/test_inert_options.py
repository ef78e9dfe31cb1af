"""An option the built model does not read (``PluginModel.inert_options``) is one warning when the
user gave it a value other than its default: a flag that silently changes nothing is a mistake the
user should see. Every committed config is free of them."""

import logging
import subprocess

import pytest
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, child_env, run_bounded

import man_fairseq  # noqa: F401  (registers the archs)
from man_recipes.config import all_configs
from man_recipes.training import launch

INERT = "changes nothing"


def inert_warnings(tmp_path, caplog, argv):
    """The plugin's 'changes nothing' warnings for fairseq-train's ``argv`` (parsed as fairseq-train
    parses it; the plan is made as the model build makes it, no layer is built)."""
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    args = options.parse_args_and_arch(options.get_training_parser(), [str(tmp_path), *map(str, argv)])
    family = ARCH_MODEL_REGISTRY[args.arch]
    if not hasattr(family, "warn_inert_options"):
        return []  # fairseq's own Transformer
    family.fill_defaults(args)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="man_fairseq.models.family"):
        family.warn_inert_options(args, family.make_plan(args))
    return [r.getMessage() for r in caplog.records if INERT in r.getMessage()]


def model_argv(arch, *extra):
    criterion = ["--criterion", "calibrated_label_smoothed_cross_entropy"] if "calibrated" in arch else []
    return ["--user-dir", USER_DIR, "--arch", arch, *TINY_MODEL, *criterion, *extra]


@pytest.mark.parametrize("arch, extra, warning", [
    ("transformer_man_small", ["--static-mask-window", "8"],
     "--static-mask-window 8 changes nothing: no sman2 sublayer in --encoder-sublayers or --decoder-sublayers"),
    ("transformer_man_small", ["--encoder-sublayers", "dman,sman2,ffn", "--static-mask-window", "8",
                               "--dman-init", "zeros"], None),
    ("transformer_man_base", ["--encoder-sublayers", "sman2,ffn", "--decoder-sublayers", "san,cross,ffn",
                              "--dman-init", "zeros"],
     "--dman-init zeros changes nothing: no dman sublayer in --encoder-sublayers or --decoder-sublayers"),
    ("transformer_localness_small", ["--localness-fixed-window", "5"],
     "--localness-fixed-window 5.0 changes nothing: only the 'fixed' window strategy reads it"),
    ("transformer_localness_small", ["--localness-window", "fixed", "--localness-fixed-window", "5"], None),
    ("transformer_localness_small", ["--localness-window", "head", "--localness-layers", ""],
     "--localness-window head changes nothing: no attention gets the Gaussian bias (--localness-layers, "
     "--localness-attention-types)"),
    ("transformer_localness_small", ["--max-relative-position", "8"],
     "--max-relative-position 8 changes nothing: without --relative-positions"),
    ("transformer_localness_small", ["--relative-positions", "--relative-position-attention-types", ""],
     "--relative-positions True changes nothing: --relative-position-attention-types names no self-attention"),
    ("transformer_diffwin_small", ["--diffwin-preset", "none", "--diffwin-temperature", "0.5"],
     "--diffwin-temperature 0.5 changes nothing: no attention gets a window (--diffwin-encoder, -decoder and "
     "-cross are none)"),
    ("transformer_diffwin_small", ["--diffwin-layers", "0", "--diffwin-mask-union"],
     "--diffwin-mask-union True changes nothing: no attention gets a window (--diffwin-layers 0)"),
    ("transformer_diffwin_small", ["--diffwin-segment-size", "3"], None),  # the default preset's cross segments
    ("transformer_diffwin_small", ["--diffwin-preset", "enc_aw-dec_mw", "--diffwin-segment-size", "3"],
     "--diffwin-segment-size 3 changes nothing: no window uses a segment mask"),
    ("transformer_diffwin_small", ["--diffwin-preset", "enc_aw-dec_mw", "--diffwin-cross-mask", "segment"],
     "--diffwin-cross-mask segment changes nothing: --diffwin-cross none"),
    ("transformer_diffwin_small", ["--diffwin-preset", "cr_aw_seg", "--diffwin-mw-renormalize"],
     "--diffwin-mw-renormalize True changes nothing: no multiplicative (mw) window"),
    ("transformer_calibrated_small", ["--calibration-fusion", "gate", "--calibration-lambda", "0.2"],
     "--calibration-lambda 0.2 changes nothing: only the fixed fusions read it (--calibration-fusion gate)"),
    ("transformer_calibrated_small", ["--calibration-lambda", "0.2"], None),
    ("transformer_calibrated_small", ["--calibration-anneal-steps", "10"],
     "--calibration-anneal-steps 10.0 changes nothing: only the anneal fusion reads it (--calibration-fusion fixed)"),
    ("transformer_calibrated_small", ["--calibration-fusion", "anneal", "--calibration-anneal-steps", "10"], None),
])
def test_an_option_the_model_does_not_read_is_one_warning(tmp_path, caplog, arch, extra, warning):
    assert inert_warnings(tmp_path, caplog, model_argv(arch, *extra)) == ([warning] if warning else [])


@pytest.mark.parametrize("arch", ["transformer_man_small", "transformer_man_base", "transformer_localness_big",
                                  "transformer_diffwin_base", "transformer_calibrated_base"])
def test_the_defaults_warn_of_nothing(tmp_path, caplog, arch):
    assert inert_warnings(tmp_path, caplog, model_argv(arch)) == []


def test_the_warning_reaches_fairseq_train_s_log(toy_data_bin, tmp_path):
    cmd = ["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--share-all-embeddings", *TINY_MODEL,
           *TINY_TRAIN, "--arch", "transformer_man_small", "--static-mask-window", "8",
           "--save-dir", tmp_path / "save", "--max-update", "1"]
    proc = run_bounded(cmd, 300, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "WARNING | man_fairseq.models.family | --static-mask-window 8 changes nothing" in proc.stdout


CONFIGS = all_configs(include_no_paper=True)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c["name"] for c in CONFIGS])
def test_no_config_sets_an_option_its_model_does_not_read(tmp_path, caplog, cfg):
    argv = launch.train_args(cfg, tmp_path / "save", device="cpu", precision="fp32", data=tmp_path)[1:]
    assert inert_warnings(tmp_path, caplog, argv) == []
