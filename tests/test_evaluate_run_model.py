"""evaluate.sh decodes only a checkpoint of the run's own model (issue 82): a MAN checkpoint in a
Transformer run's checkpoints/, or one trained with other model options, is refused in one line
before decoding, not recorded as the run's result.

The checkpoints hold the model options exactly as fairseq-train records them: fairseq's own
parser on the command train.sh builds from a config (no training: the parameters play no part)."""

import json

import torch
import yaml

from test_score_inputs import _evaluate, _generate_output, toy_run  # noqa: F401  (toy_run: a fixture)

from man_recipes.config import CONFIG_DIR, load_config
from man_recipes.training.launch import train_args


def _checkpoint(path, config, extra=()):
    """A checkpoint recording the model of ``config`` as fairseq-train trains it (``extra``: options
    after ``--``)."""
    from fairseq import options

    import man_fairseq  # noqa: F401  (registers the plugin's archs)

    args = options.parse_args_and_arch(options.get_training_parser(),
                                       train_args(load_config(config), "checkpoints", device="cpu", extra=extra))
    torch.save({"cfg": {"model": args}, "optimizer_history": [{"num_updates": 7}],
                "extra_state": {"train_iterator": {"epoch": 3}}}, path)


def _with_command(run, extra=()):
    """run.json as train.sh writes it, for the run's config with ``extra`` after ``--``."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    command = ["fairseq-train"] + train_args(cfg, "x", extra=extra)
    (run / "run.json").write_text(json.dumps({"overrides": list(extra), "command": command}))


def test_a_checkpoint_of_the_runs_model_is_evaluated(toy_run, monkeypatch, capsys):
    run, refs = toy_run
    _checkpoint(run / "checkpoints" / "checkpoint_last.pt", CONFIG_DIR / "multi30k" / "transformer.yaml")
    code, _, err = _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs))
    assert (code, err) == (0, "")
    _with_command(run, ["--seed", "3"])  # an option that is not the model's
    code, _, err = _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs))
    assert (code, err) == (0, "")


def test_a_man_checkpoint_in_a_transformer_run_is_refused_before_decoding(toy_run, monkeypatch, capsys):
    run, _ = toy_run
    checkpoint = run / "checkpoints" / "checkpoint_last.pt"
    _checkpoint(checkpoint, CONFIG_DIR / "multi30k" / "man.yaml")
    code, out, err = _evaluate(run, monkeypatch, capsys, None)  # None: decoding must not start
    assert code == 2 and err == (f"ERROR: {checkpoint} holds a transformer_man_small model, not the "
                                 f"transformer_iwslt_de_en that {run} trained; evaluate it in its own run folder\n")
    assert not (run / "results.json").exists()


def test_a_checkpoint_with_other_model_options_is_refused(toy_run, monkeypatch, capsys):
    run, refs = toy_run
    checkpoint = run / "checkpoints" / "checkpoint_last.pt"
    _checkpoint(checkpoint, CONFIG_DIR / "multi30k" / "transformer.yaml", ["--encoder-layers", "3"])
    code, _, err = _evaluate(run, monkeypatch, capsys, None)
    assert code == 2 and err == (f"ERROR: {checkpoint} holds a model with encoder_layers = 3, not the 6 that {run} "
                                 "was trained with; evaluate it in its own run folder\n")
    # the run's own command gave --encoder-layers 3 (after `--`): then it is the run's model
    _with_command(run, ["--encoder-layers", "3"])
    code, _, err = _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs))
    assert (code, err) == (0, "")
