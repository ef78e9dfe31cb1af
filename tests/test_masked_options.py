"""The composed arch's options (issue 78): each option of each mechanism changes the combined
model, the checks between mechanisms fail at start-up in one line, and the arch trains and
generates through fairseq-train / fairseq-generate and is listed by man-options."""

import dataclasses
import logging
import re

import pytest
import torch
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, build_fairseq_model, call_entry_point, run_cli
from model_families import tokens

from man_fairseq.models.transformer_masked import MaskedConfig
from man_fairseq.plugin_options import PluginOptionError
from man_recipes.cli import options as man_options

CRITERION = ["--criterion", "calibrated_label_smoothed_cross_entropy"]
# every mechanism on, each option at a value its neighbours' options leave readable
EVERY = ["--encoder-sublayers", "dman,san,sman2,ffn", "--decoder-sublayers", "dman,cross,ffn",
         "--localness-attention-types", "encoder_self,decoder_self,cross", "--localness-layers", "all",
         "--relative-positions", "--diffwin-encoder", "aw", "--diffwin-decoder", "mw", "--diffwin-cross", "mw",
         "--diffwin-cross-mask", "segment", "--diffwin-layers", "2", "--calibration-layers", "all", *CRITERION]
NO_DIFFWIN = EVERY[:EVERY.index("--diffwin-encoder")] + EVERY[EVERY.index("--calibration-layers"):]

# option -> (the options it is read under, the option and another value); each case's model must
# differ from the same model without the change (same seed)
REACH = {
    "encoder_sublayers": (EVERY, ["--encoder-sublayers", "san,dman,sman2,ffn"]),
    "decoder_sublayers": (EVERY, ["--decoder-sublayers", "san,cross,ffn"]),
    "dman_max_relative_distance": (EVERY, ["--dman-max-relative-distance", "1"]),
    "dman_init": (EVERY, ["--dman-init", "zeros"]),
    "static_mask_window": (EVERY, ["--static-mask-window", "1"]),
    "man_norm": (EVERY, ["--man-norm", "pre"]),
    "attention_head_activation": (EVERY, ["--attention-head-activation", "relu"]),
    "localness_window": (EVERY, ["--localness-window", "head"]),
    "localness_fixed_window": (EVERY + ["--localness-window", "fixed"], ["--localness-fixed-window", "2"]),
    "localness_head_window_max": (EVERY + ["--localness-window", "head"], ["--localness-head-window-max", "3"]),
    "localness_layers": (EVERY, ["--localness-layers", "0"]),
    "localness_attention_types": (EVERY, ["--localness-attention-types", "encoder_self"]),
    "relative_positions": (EVERY[:EVERY.index("--relative-positions")] + EVERY[EVERY.index("--relative-positions") + 1:],
                           ["--relative-positions"]),
    "max_relative_position": (EVERY, ["--max-relative-position", "1"]),
    "relative_position_attention_types": (EVERY, ["--relative-position-attention-types", "encoder_self"]),
    "diffwin_preset": (NO_DIFFWIN, ["--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw"]),
    "diffwin_encoder": (EVERY, ["--diffwin-encoder", "mw"]),
    "diffwin_decoder": (EVERY, ["--diffwin-decoder", "aw"]),
    "diffwin_cross": (EVERY, ["--diffwin-cross", "aw"]),
    "diffwin_encoder_mask": (EVERY, ["--diffwin-encoder-mask", "segment"]),
    "diffwin_cross_mask": (EVERY, ["--diffwin-cross-mask", "token"]),
    "diffwin_segment_size": (EVERY, ["--diffwin-segment-size", "2"]),
    "diffwin_layers": (EVERY, ["--diffwin-layers", "1"]),
    "diffwin_temperature": (EVERY, ["--diffwin-temperature", "0.5"]),
    "diffwin_mw_renormalize": (EVERY, ["--diffwin-mw-renormalize"]),
    "diffwin_mask_union": (EVERY, ["--diffwin-mask-union"]),
    "calibration_fusion": (EVERY, ["--calibration-fusion", "gate"]),
    "calibration_lambda": (EVERY, ["--calibration-lambda", "0.5"]),
    "calibration_anneal_steps": (EVERY + ["--calibration-fusion", "anneal"], ["--calibration-anneal-steps", "10"]),
    "calibration_layers": (EVERY, ["--calibration-layers", "1"]),
    "mechanism_sublayers": (EVERY, ["--mechanism-sublayers", "dman"]),
}
# options with one valid value in this model: nothing to change
FIXED = {"diffwin_decoder_mask": "decoder self-attention takes token masks only"}


def outputs(options, seed=0):
    torch.manual_seed(seed)
    model, task, _ = build_fairseq_model("transformer_masked_base", TINY_MODEL + ["--dropout", "0", *options],
                                         dict_size=40)
    model.set_num_updates(7)
    model.eval()
    d = task.source_dictionary
    with torch.no_grad():
        return model(tokens(d, (7, 5), True, 0), torch.tensor([7, 5]), tokens(d, (6, 4), False, 1))[0]


def test_every_option_of_every_mechanism_changes_the_combined_model():
    options = {f.name for f in dataclasses.fields(MaskedConfig) if not f.name.startswith("_")}
    assert options == set(REACH) | set(FIXED), "an option without a reach case"
    for dest, (before, change) in REACH.items():
        base, changed = outputs(before), outputs(before + change)
        assert base.shape == changed.shape
        assert not torch.allclose(base, changed), f"{change[0]} changes nothing"


def test_the_backend_reaches_every_attention():
    from man_fairseq.modules.biased_attention import BiasedMultiheadAttention

    model, _, _ = build_fairseq_model("transformer_masked_base", TINY_MODEL + EVERY + ["--attention-backend", "sdpa"],
                                      dict_size=40)
    backends = {m.attention_backend for m in model.modules() if isinstance(m, BiasedMultiheadAttention)}
    assert backends == {"sdpa"}


@pytest.mark.parametrize("extra, message", [
    (["--calibration-layers", "all"], "--calibration-layers trains with --criterion "
                                      "calibrated_label_smoothed_cross_entropy"),
    (CRITERION, "--criterion calibrated_label_smoothed_cross_entropy needs a calibrated cross-attention "
                "(--calibration-layers"),
    (["--calibration-layers", "all", "--checkpoint-activations", *CRITERION],
     "--calibration-layers does not work with --checkpoint-activations"),
    (["--calibration-layers", "5", *CRITERION], "--calibration-layers: layer indices [5] out of range"),
    (["--encoder-sublayers", "dman,ffn", "--localness-attention-types", "encoder_self", "--mechanism-sublayers",
      "san"], "--mechanism-sublayers san: no sublayer of --encoder-sublayers dman,ffn takes the mechanisms"),
    (["--no-cross-attention"], "does not support --no-cross-attention"),
])
def test_checks_between_mechanisms_fail_at_build_naming_the_option(extra, message):
    with pytest.raises(PluginOptionError, match=re.escape(message)):
        build_fairseq_model("transformer_masked_base", TINY_MODEL + extra, dict_size=20)


def test_an_option_its_mechanism_leaves_unread_is_one_warning(caplog):
    with caplog.at_level(logging.WARNING):
        build_fairseq_model("transformer_masked_base", TINY_MODEL + ["--localness-layers", "1",
                                                                     "--calibration-fusion", "gate"], dict_size=20)
    text = caplog.text
    assert "--localness-layers 1 changes nothing" in text
    assert "--calibration-fusion gate changes nothing: no cross-attention is calibrated" in text


def test_man_options_lists_the_composed_arch():
    proc = call_entry_point(man_options.cli_main, ["transformer_masked_small"], prog="man-options")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag, default in (("--encoder-sublayers", "san,ffn"), ("--localness-attention-types", "''"),
                          ("--diffwin-preset", "none"), ("--calibration-layers", "''"),
                          ("--mechanism-sublayers", "dman,san,sman1,sman2"), ("--attention-backend", "auto")):
        assert f"{flag}  (default: {default})" in proc.stdout


def test_man_encoder_with_calibrated_cross_attention_trains_and_generates(toy_data_bin, tmp_path):
    save = tmp_path / "ckpt"
    out = run_cli([
        "fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_masked_small",
        *TINY_MODEL, *TINY_TRAIN, *CRITERION, "--save-dir", save, "--encoder-sublayers", "dman,san,ffn",
        "--calibration-layers", "all", "--calibration-fusion", "anneal", "--calibration-anneal-steps", "4",
        "--max-update", "3",
    ]).stdout
    assert "perturbed_loss" in out and "transformer_masked cross layers 0: calibration(anneal)" in out
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    names = list(state["model"])
    assert any(".bias_module." in n for n in names if n.startswith("encoder."))  # DMAN
    assert any(".post_softmax.perturbation." in n for n in names)
    gen = run_cli([
        "fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
        "--beam", "3", "--batch-size", "8", "--gen-subset", "valid", "--cpu", "--max-len-b", "12",
    ]).stdout
    assert len([line for line in gen.splitlines() if line.startswith("H-")]) == 40


def test_the_multi30k_man_calibration_config_is_man_s_encoder_with_calibration_s_cross_attention():
    """configs/multi30k-cpu/man-calibration.yaml: for the same seed its encoder is the man row's,
    parameter for parameter, and its decoder calibrates every cross-attention as the calibration row
    does (same fusion, same perturbation parameters), trained with the joint criterion."""
    from man_fairseq.modules.calibration import calibration_modules
    from man_recipes.config import CONFIG_DIR, load_config, option_args
    from man_recipes.studies.experiments import parse_families

    def build(family):
        cfg = load_config(CONFIG_DIR / "multi30k-cpu" / f"{family}.yaml")
        torch.manual_seed(3)
        extra = option_args(cfg["model"]) + ["--dropout", "0.3", "--criterion", cfg["train"]["criterion"]]
        return cfg, build_fairseq_model(cfg["arch"], extra, dict_size=300)[0]

    cfg, composed = build("man-calibration")
    _, man = build("man")
    _, calibrated = build("calibration")
    assert cfg["train"]["criterion"] == "calibrated_label_smoothed_cross_entropy"
    assert parse_families("multi30k-cpu", "man-calibration")[1] == ["transformer", "man-calibration"]
    want = man.encoder.state_dict()
    got = composed.encoder.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    ours, theirs = calibration_modules(composed), calibration_modules(calibrated)
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert (a.fusion, a.anneal_steps) == (b.fusion, b.anneal_steps) == ("anneal", 1270.0)
        assert [p.shape for p in a.parameters()] == [p.shape for p in b.parameters()]
