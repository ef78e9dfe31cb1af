"""The checkpoint evaluate.sh decodes, read once: its training progress, and whether it holds the
run's model (its arch and the model options the run's command gave), so that a checkpoint of another
run placed in RUN/checkpoints/ or passed with --checkpoint is refused before decoding, not recorded
as this run's result."""

from man_recipes.averaging import model_config
from man_recipes.evaluation.decode import EvaluateError
from man_recipes.training.launch import train_args


def load_state(checkpoint):
    """The checkpoint's state dict (its tensors memory-mapped), or :class:`EvaluateError` naming it."""
    import torch

    from man_fairseq.checkpoint_errors import load_error
    from man_fairseq.patches import safe_globals

    safe_globals.apply()
    try:
        return torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # a file cut short or not a checkpoint at all: name it, before decoding
        raise EvaluateError(load_error(checkpoint, e)) from e


def training_progress(state):
    """(number of updates, completed epochs) recorded in a checkpoint's state; None where absent."""
    history = state.get("optimizer_history") or [{}]
    train_iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    epoch = train_iterator.get("epoch")  # the epoch to run next or the one interrupted
    return history[-1].get("num_updates"), (epoch - 1 if epoch else None)


def run_model(cfg, run_info):
    """The model options (:func:`~man_recipes.averaging.model_config`) the run was trained with:
    its config's command with the options given after ``--`` (run.json's ``overrides``), parsed
    by fairseq's training parser with the arch's defaults, as fairseq-train parses them. None
    where the build fills a value in (the task's position limits); ``share_all_embeddings``
    implies ``share_decoder_input_output_embed``, which fairseq's build sets."""
    from fairseq import options

    import man_fairseq  # noqa: F401  (registers the plugin's archs)

    argv = train_args(cfg, "checkpoints", device="cpu", extra=run_info.get("overrides") or ())
    return _as_built(model_config({"args": options.parse_args_and_arch(options.get_training_parser(), argv)}))


def _as_built(model):
    if model.get("share_all_embeddings"):
        model["share_decoder_input_output_embed"] = True
    return model


def check_run_model(state, checkpoint, cfg, run_info, run):
    """:class:`EvaluateError` when ``state`` (the checkpoint file ``checkpoint``) holds another
    model than run folder ``run`` trained (:func:`run_model`): another arch, or another value of
    one of its model options. A state that records no model (no ``cfg`` or ``args``) is left to
    fairseq-generate."""
    if not (state.get("cfg") or {}).get("model") and state.get("args") is None:
        return
    trained, held = run_model(cfg, run_info), _as_built(model_config(state))
    where = f"{checkpoint} holds"
    if held["arch"] != trained["arch"]:
        raise EvaluateError(f"{where} a {held['arch']} model, not the {trained['arch']} that {run} trained; "
                            "evaluate it in its own run folder")
    for key, value in sorted(trained.items()):
        if value is not None and held.get(key) != value:
            raise EvaluateError(f"{where} a model with {key} = {held.get(key)!r}, not the {value!r} that {run} "
                                "was trained with; evaluate it in its own run folder")
