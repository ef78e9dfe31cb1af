"""Every model family of man-fairseq as fairseq options, and padded token batches: shared by the
half-precision and compilation tests (tests/test_half_precision.py, tests/test_compile.py).

One entry per mask variant the issue lists: each localness window strategy, relative positions,
DMAN, SMAN1/SMAN2, diffwin token/segment x AW/MW, calibration with each fusion.
"""

import torch
from conftest import TINY_MODEL, build_fairseq_model

LOCALNESS = ["--localness-layers", "all", "--localness-attention-types", "encoder_self,decoder_self,cross"]


def _diffwin(mask, mode):
    # the decoder's self-attention takes token masks only (a segment reaches the future)
    return ["--diffwin-preset", "none", "--diffwin-layers", "2", "--diffwin-segment-size", "3",
            "--diffwin-encoder", mode, "--diffwin-decoder", mode, "--diffwin-cross", mode,
            "--diffwin-encoder-mask", mask, "--diffwin-cross-mask", mask]


FAMILIES = {
    **{f"localness_{w}": ("transformer_localness_base", LOCALNESS + ["--localness-window", w])
       for w in ("fixed", "layer", "query", "head")},
    "relative_positions": ("transformer_localness_base", LOCALNESS + [
        "--relative-positions", "--relative-position-attention-types", "encoder_self,decoder_self"]),
    "dman": ("transformer_man_base", ["--encoder-sublayers", "dman,san,ffn", "--decoder-sublayers", "dman,san,cross,ffn"]),
    "sman": ("transformer_man_base", ["--encoder-sublayers", "sman1,sman2,ffn",
                                      "--decoder-sublayers", "sman1,sman2,cross,ffn"]),
    **{f"diffwin_{mask}_{mode}": ("transformer_diffwin_base", _diffwin(mask, mode))
       for mask in ("token", "segment") for mode in ("aw", "mw")},
    **{f"calibration_{f}": ("transformer_calibrated_base", ["--calibration-fusion", f, "--calibration-anneal-steps", "10"])
       for f in ("fixed", "fixed_softmax", "anneal", "gate")},
}


def build_family(family, backend="explicit", extra=(), seed=0):
    """(model, task) of ``family``: TINY_MODEL, no dropout, GELU (a smooth activation keeps
    precision comparisons free of ReLU sign flips), ``--attention-backend backend``."""
    arch, options = FAMILIES[family]
    torch.manual_seed(seed)
    model, task, _ = build_fairseq_model(
        arch, TINY_MODEL + ["--dropout", "0", "--activation-fn", "gelu", "--attention-backend", backend,
                            *options, *extra], dict_size=40)
    return model, task

# fairseq's --fp16 scales the loss (--fp16-init-scale 128, then dynamically) so that small gradients
# do not underflow: unscaled, MAN's dynamic-mask parameters lose up to half their gradient (found on
# an H200, the same on CPU); bf16 has fp32's exponent range and fairseq does not scale it
LOSS_SCALE = {torch.float16: 128.0, torch.bfloat16: 1.0}


def tokens(dictionary, lengths, left, seed):
    """(B, max(lengths)) random sentences ending in EOS, padded on the left or the right."""
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    out = torch.full((len(lengths), t), dictionary.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):
        seq = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g).tolist() + [dictionary.eos()]
        if left:
            out[i, t - n:] = torch.tensor(seq)
        else:
            out[i, :n] = torch.tensor(seq)
    return out
