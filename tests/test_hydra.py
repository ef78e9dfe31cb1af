"""fairseq-hydra-train with a YAML per family: it trains, and builds the model argparse builds."""

import re

import pytest
import yaml
from conftest import TINY_MODEL, USER_DIR, run_cli

# per family: arch, plugin options given in the YAML (also as --flags for the argparse build), criterion
FAMILIES = {
    "man": ("transformer_man_small", {"decoder_sublayers": "dman,san,cross,ffn", "static_mask_window": 3},
            "label_smoothed_cross_entropy"),
    "localness": ("transformer_localness_small",
                  {"localness_layers": "0,1", "localness_attention_types": "encoder_self,decoder_self",
                   "relative_positions": True, "max_relative_position": 4},
                  "label_smoothed_cross_entropy"),
    # diffwin's default --diffwin-layers 3 on the 2-layer model: cut to 2 in both paths
    "diffwin": ("transformer_diffwin_small", {"diffwin_preset": "enc_aw-dec_mw", "diffwin_temperature": 0.5},
                "label_smoothed_cross_entropy"),
    "calibrated": ("transformer_calibrated_small", {"calibration_fusion": "gate"},
                   "calibrated_label_smoothed_cross_entropy"),
    # the composed arch: MAN's encoder, localness on it, calibrated cross-attention (issue 78)
    "masked": ("transformer_masked_small",
               {"encoder_sublayers": "dman,san,ffn", "localness_attention_types": "encoder_self",
                "localness_layers": "0", "calibration_layers": "all", "calibration_fusion": "anneal"},
               "calibrated_label_smoothed_cross_entropy"),
}


def tiny_model_options():
    return {TINY_MODEL[i].lstrip("-").replace("-", "_"): int(TINY_MODEL[i + 1]) for i in range(0, len(TINY_MODEL), 2)}


def write_yaml(path, data_bin, save_dir, arch, model_options, criterion, max_update=2):
    config = {
        "common": {"user_dir": USER_DIR, "cpu": True, "seed": 1, "no_progress_bar": True, "log_interval": 1},
        "task": {"_name": "translation", "data": str(data_bin), "source_lang": "src", "target_lang": "tgt"},
        "model": {"_name": arch, **tiny_model_options(), "share_all_embeddings": True, "dropout": 0.1,
                  **model_options},
        "criterion": {"_name": criterion, "label_smoothing": 0.1},
        "optimizer": {"_name": "adam"},
        "lr_scheduler": {"_name": "inverse_sqrt", "warmup_updates": 10},
        "optimization": {"lr": [0.003], "max_update": max_update},
        "dataset": {"max_tokens": 1000, "num_workers": 0},
        "checkpoint": {"save_dir": str(save_dir), "no_epoch_checkpoints": True},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def hydra_train(tmp_path, config_name, check=True):
    # hydra writes its outputs/ under the working directory: keep it in tmp_path
    return run_cli(["fairseq-hydra-train", "--config-dir", tmp_path, "--config-name", config_name],
                   cwd=tmp_path, check=check, timeout=600)


def argparse_model(data_bin, arch, model_options, criterion):
    from fairseq import options, tasks

    flags = []
    for key, value in model_options.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--user-dir", USER_DIR, "--task", "translation", "-s", "src", "-t", "tgt",
        "--arch", arch, "--share-all-embeddings", "--dropout", "0.1", *TINY_MODEL, *flags, "--criterion", criterion,
    ])
    return tasks.setup_task(args).build_model(args)


def plugin_option_dests(arch):
    from fairseq.models import ARCH_MODEL_REGISTRY

    from man_recipes.cli.options import _plugin_actions

    return [a.dest for a in _plugin_actions(ARCH_MODEL_REGISTRY[arch])]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hydra_yaml_trains_and_builds_the_argparse_model(family, toy_data_bin, tmp_path):
    from fairseq import checkpoint_utils

    arch, model_options, criterion = FAMILIES[family]
    save = tmp_path / "save"
    write_yaml(tmp_path / f"{family}.yaml", toy_data_bin, save, arch, model_options, criterion)
    out = hydra_train(tmp_path, family).stdout
    assert re.search(r"num_updates 2\b", out), out[-3000:]
    assert (save / "checkpoint_last.pt").exists()

    # the model hydra trained against the one fairseq-train's argparse path builds
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    reference = argparse_model(toy_data_bin, arch, model_options, criterion)
    assert {k: tuple(v.shape) for k, v in state["model"].items()} == \
        {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    hydra_params = sum(v.numel() for k, v in state["model"].items() if k in dict(reference.named_parameters()))
    assert hydra_params == sum(p.numel() for p in reference.parameters())

    # the same effective options: rebuild the model from the hydra checkpoint's config
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(save / "checkpoint_last.pt")])
    hydra_model = models[0]
    for dest in plugin_option_dests(arch):
        assert str(getattr(hydra_model.args, dest)) == str(getattr(reference.args, dest)), dest
    for key, value in model_options.items():
        assert str(getattr(hydra_model.args, key)) == str(value), key
    if family == "diffwin":
        assert hydra_model.args.diffwin_layers == 2  # the default 3, cut to the 2-layer model


def test_hydra_bad_value_and_criterion_mismatch_fail_at_start_up(toy_data_bin, tmp_path):
    """Values argparse never sees (a YAML) get the same start-up checks."""
    write_yaml(tmp_path / "bad.yaml", toy_data_bin, tmp_path / "save_bad", "transformer_calibrated_small",
               {"calibration_lambda": -1}, "label_smoothed_cross_entropy")
    bad = hydra_train(tmp_path, "bad", check=False)
    assert bad.returncode not in (0, 134)
    assert "--calibration-lambda -1: must be >= 0" in bad.stdout
    assert not re.search(r"loaded \d+ examples", bad.stdout)

    write_yaml(tmp_path / "mismatch.yaml", toy_data_bin, tmp_path / "save_mm", "transformer_man_small", {},
               "calibrated_label_smoothed_cross_entropy")
    mismatch = hydra_train(tmp_path, "mismatch", check=False)
    assert mismatch.returncode not in (0, 134)
    assert "needs a calibrated model" in mismatch.stdout and "got --arch transformer_man_small" in mismatch.stdout
    assert not re.search(r"loaded \d+ examples", mismatch.stdout)
    assert not list(tmp_path.rglob("crash.pt"))
