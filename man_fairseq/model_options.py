"""Which options define a model, and which of them two sets of options disagree on.

A trained model is its parameters and the options that say what they compute: its arch and the options
its model class declares (``--encoder-embed-dim``, ``--man-norm``, ``--localness-window``, ...). Some of
those declared options change neither the parameters nor what a trained model computes, and may
differ from one run of the same model to the next: :data:`NOT_MODEL_DEFINING`. The rest is what a
resume (:mod:`man_fairseq.patches.resume_options`) and ``--model-overrides``
(:mod:`man_fairseq.patches.model_overrides`) must not change.
"""

from argparse import Namespace

from .plugin_options import arch_option_names, option_flag

# options a model class declares that change neither its parameters nor what it computes once trained
NOT_MODEL_DEFINING = frozenset({
    # regularisation during training
    "dropout", "attention_dropout", "activation_dropout", "relu_dropout", "adaptive_softmax_dropout",
    "encoder_layerdrop", "decoder_layerdrop", "quant_noise_pq", "quant_noise_pq_block_size", "quant_noise_scalar",
    # memory and kernels: the same function computed another way
    "checkpoint_activations", "offload_activations", "min_params_to_wrap", "attention_backend",
    "encoder_xformers_att_config", "decoder_xformers_att_config", "export",
    # the longest sentence read (a limit of the data; sinusoidal positions have no table)
    "max_source_positions", "max_target_positions",
    # what the parameters start from, read only before the first update
    "encoder_embed_path", "decoder_embed_path", "dman_init",
    "base_shuffle",  # BASE layers' batch shuffling during training
    "_name",
})


def model_defining_options(arch) -> set:
    """The option names (dests) that define a model of ``arch``: ``arch`` itself and what its model
    class declares, less :data:`NOT_MODEL_DEFINING`."""
    return ({"arch"} | arch_option_names(arch)) - NOT_MODEL_DEFINING


def option_value(options, name, absent=None):
    """``name`` of a model's options: an argparse Namespace, a dict or an omegaconf DictConfig."""
    if isinstance(options, Namespace):
        return getattr(options, name, absent)
    try:
        return options[name] if name in options else absent
    except Exception:  # a mandatory value never given ("???")
        return absent


def saved_model_options(state):
    """The model options a loaded checkpoint ``state`` holds: its ``cfg.model``, or an older one's
    ``args``; None when it holds neither."""
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if hasattr(cfg, "get") else None
    return model if model is not None else state.get("args")


def same_value(a, b) -> bool:
    """Whether two option values are the same setting (an Enum choice and its string are)."""
    return a == b or str(a) == str(b)


def differing_options(saved, given, arch):
    """[(name, saved value, given value)] of the options defining a model of ``arch`` (sorted) that
    ``saved`` and ``given`` (a model's options) both hold and disagree on."""
    missing = object()
    out = []
    for name in sorted(model_defining_options(arch)):
        a, b = option_value(saved, name, missing), option_value(given, name, missing)
        if a is not missing and b is not missing and not same_value(a, b):
            out.append((name, a, b))
    return out


def describe_differences(differences) -> str:
    """``--man-norm pre -> post, --localness-window fixed -> query``: each option as its flag."""
    return ", ".join(f"{option_flag(name)} {a} -> {b}" for name, a, b in differences)
