"""fairseq-train resuming its checkpoint_last.pt with other model options than the run's is refused in one
line naming each option and its two values, before anything is written
(man_fairseq/patches/resume_options.py); options that may change on a resume are not compared (issue 81)."""

from argparse import Namespace

import pytest
import torch
from conftest import TINY_MODEL, TINY_TRAIN, build_fairseq_model, run_cli

from man_fairseq.model_options import differing_options
from man_fairseq.patches.resume_options import check_resume
from man_fairseq.plugin_options import PluginOptionError

OPTIONS = ["--arch", "transformer_man_small", "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN]


def _train(data, save_dir, *extra, check=True):
    return run_cli(["fairseq-train", data, "--user-dir", "man_fairseq", *OPTIONS, "--save-dir", save_dir, *extra],
                   check=check)


def _error_lines(proc):
    return [line for line in proc.stdout.splitlines() if "error" in line.lower()]


def test_a_resume_with_another_norm_is_refused_in_one_line_and_one_with_another_lr_trains_on(toy_data_bin, tmp_path):
    save_dir = tmp_path / "run"
    _train(toy_data_bin, save_dir, "--max-update", "2")
    last = save_dir / "checkpoint_last.pt"
    before = (sorted(p.name for p in save_dir.iterdir()), last.read_bytes())
    proc = _train(toy_data_bin, save_dir, "--max-update", "4", "--man-norm", "post", "--lr", "0.001", check=False)
    assert proc.returncode != 0
    errors = _error_lines(proc)
    assert errors == [f"fairseq-train: error: {last} was trained with other model options than this command's: "
                      "--decoder-normalize-before True -> False, --encoder-normalize-before True -> False, "
                      "--man-norm pre -> post (saved -> given); resume with the run's options, or train the new "
                      "model in another --save-dir"], proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    assert (sorted(p.name for p in save_dir.iterdir()), last.read_bytes()) == before  # nothing written
    # learning rate, epochs, dropout, patience: a resume may change them
    _train(toy_data_bin, save_dir, "--max-update", "3", "--lr", "0.001", "--dropout", "0.2", "--patience", "5")
    assert torch.load(last, weights_only=True)["optimizer_history"][-1]["num_updates"] == 3


@pytest.fixture(scope="module")
def localness_checkpoint(tmp_path_factory):
    """A transformer_localness_small checkpoint's options as fairseq-train saves them (its cfg.model)."""
    folder = tmp_path_factory.mktemp("localness")
    _, _, args = build_fairseq_model("transformer_localness_small", ["--localness-window", "fixed"], dict_size=20,
                                     tmp_dir=folder)
    torch.save({"cfg": {"model": args}, "model": {}}, folder / "checkpoint_last.pt")
    return folder / "checkpoint_last.pt", args


def test_another_localness_window_is_named_with_both_values(localness_checkpoint):
    path, saved = localness_checkpoint
    given = Namespace(**dict(vars(saved), localness_window="query", lr=[0.1], max_epoch=9, data="/elsewhere"))
    with pytest.raises(PluginOptionError, match=rf"^{path} was trained with other model options than this "
                                                r"command's: --localness-window fixed -> query \(saved -> given\)"):
        check_resume(str(path), given)
    check_resume(str(path), Namespace(**dict(vars(saved), lr=[0.1], attention_backend="explicit", dropout=0.3)))


def test_only_the_options_defining_the_model_are_compared():
    saved = Namespace(arch="transformer_man_small", man_norm="pre", encoder_embed_dim=512, dropout=0.1, lr=[0.1],
                      attention_backend="auto", max_epoch=10, patience=-1)
    given = Namespace(arch="transformer_man_small", man_norm="pre", encoder_embed_dim=256, dropout=0.3, lr=[0.01],
                      attention_backend="flex", max_epoch=20, patience=5)
    assert differing_options(saved, given, "transformer_man_small") == [("encoder_embed_dim", 512, 256)]


def test_a_checkpoint_whose_parameters_have_other_names_resumes_only_with_a_reset_optimizer(toy_data_bin, tmp_path):
    """The optimizer's state follows the parameters' order, not their names: a checkpoint of
    transformer_masked saved in MAN's layer form (before its Transformer-order sides took fairseq's) loads
    renamed, but its Adam moments would go to other parameters, so the resume is refused in one line
    unless --reset-optimizer; nothing is written."""
    masked = ["fairseq-train", toy_data_bin, "--user-dir", "man_fairseq", "--arch", "transformer_masked_small",
              "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, "--save-dir", tmp_path / "run"]
    run_cli([*masked, "--max-update", "2"])
    last = tmp_path / "run" / "checkpoint_last.pt"
    state = torch.load(last, weights_only=False)
    # encoder layer 0 as MAN's layer form named it (rename_man_form_keys maps it back when loading)
    state["model"] = {k.replace("encoder.layers.0.self_attn.", "encoder.layers.0.blocks.0."): v
                      for k, v in state["model"].items()}
    torch.save(state, last)
    before = last.read_bytes()
    proc = run_cli([*masked, "--max-update", "4"], check=False)
    assert proc.returncode != 0
    errors = _error_lines(proc)
    assert errors == [f"fairseq-train: error: {last} holds this model's parameters under other names or in another "
                      "order (no 'encoder.layers.0.self_attn.k_proj.weight'; 8 of 85 missing): its optimizer state "
                      "would go to other parameters. Resume with --reset-optimizer (Adam's moments start again), or "
                      "with the plugin version that wrote it"], proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout and last.read_bytes() == before
    run_cli([*masked, "--max-update", "3", "--reset-optimizer"])
    assert torch.load(last, weights_only=True)["optimizer_history"][-1]["num_updates"] == 3
