"""What the GPU tests check, as functions: the GPU tests call them on CUDA, and
``tests/test_gpu_checks.py`` runs them on CPU (so the checks themselves are tested, and fail when
what they guard is broken, on a machine without a GPU).
"""

import math
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import build_fairseq_model  # noqa: E402
from model_families import LOSS_SCALE, tokens  # noqa: E402,F401  (the CPU tests' sentences and loss scale)

from man_fairseq.modules.biased_attention import BiasedMultiheadAttention  # noqa: E402
from man_recipes.training import fairseq_log  # noqa: E402

# head width 16 (flex's compiled kernels need a power of two >= 16)
GPU_MODEL = [
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0", "--attention-dropout", "0",
]
FAMILIES = {
    "man": ("transformer_man_base", ["--decoder-sublayers", "dman,san,cross,ffn"]),
    "man_static": ("transformer_man_base", ["--encoder-sublayers", "sman1,sman2,dman,ffn",
                                            "--decoder-sublayers", "sman1,sman2,cross,ffn"]),
    "localness_query": ("transformer_localness_base", ["--localness-layers", "all", "--localness-window", "query",
                                                       "--localness-attention-types", "encoder_self,decoder_self,cross"]),
    "localness_layer": ("transformer_localness_base", ["--localness-layers", "all", "--localness-window", "layer",
                                                       "--localness-attention-types", "encoder_self,decoder_self"]),
    "localness_head": ("transformer_localness_base", ["--localness-layers", "all", "--localness-window", "head"]),
    "localness_fixed": ("transformer_localness_base", ["--localness-layers", "all", "--localness-window", "fixed"]),
    "diffwin": ("transformer_diffwin_base", []),
    "calibration": ("transformer_calibrated_base", []),
    "transformer": ("transformer_wmt_en_de", []),  # fairseq's own, for reference tolerances
}
# source lengths hit % 128 == 64 (64, 192) next to others; left-padded source, right-padded target
SRC_LENGTHS = [192, 130, 64, 100]
TGT_LENGTHS = [64, 192, 150, 77]


def build(family, backend, device="cuda", seed=0, model_args=GPU_MODEL):
    arch, extra = FAMILIES[family]
    torch.manual_seed(seed)
    argv = list(model_args) + extra + ([] if family == "transformer" else ["--attention-backend", backend])
    model, task, _ = build_fairseq_model(arch, argv, dict_size=200)
    return model.to(device), task


def set_backend(model, backend):
    for m in model.modules():
        if isinstance(m, BiasedMultiheadAttention):
            m.attention_backend = backend


# half precision: relative L2 error of outputs / gradients against the fp32 explicit path
HALF_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 6e-2}


def loss_and_grads(model, task, device="cuda", src_lengths=SRC_LENGTHS, tgt_lengths=TGT_LENGTHS,
                   loss_scale=1.0):
    """Logits (pad positions zeroed), the mean token NLL and every parameter's gradient, in fp32
    (the backward of ``loss_scale`` times the loss, the gradients divided by it again)."""
    d = task.source_dictionary
    src = tokens(d, src_lengths, left=True, seed=1).to(device)
    prev = tokens(d, tgt_lengths, left=False, seed=2).to(device)
    target = tokens(d, tgt_lengths, left=False, seed=3).to(device)
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(src, torch.tensor(src_lengths).to(device), prev)[0]
    lprobs = torch.log_softmax(logits.float(), -1)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    loss = nll.masked_fill(target == d.pad(), 0.0).sum() / (target != d.pad()).sum()
    (loss * loss_scale).backward()
    real = (target != d.pad()).unsqueeze(-1)
    grads = {n: p.grad.float() / loss_scale for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().float().masked_fill(~real, 0.0), loss.detach().float(), grads


@contextmanager
def tf32_off():
    """fp32 matmuls and convolutions in full fp32 (no TF32), restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def max_rel_error(a: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """max |a - ref| over the tensor, relative to the tensor's own scale max |ref| (>= ``floor``)."""
    scale = max(float(ref.abs().max()), floor) if ref.numel() else floor
    err = float((a - ref).abs().max()) if ref.numel() else 0.0
    return err / scale if scale > 0 else err


def gradient_errors(grads: Dict[str, torch.Tensor], ref_grads: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Per parameter: the largest entry-wise error relative to that parameter's gradient scale.

    One wrong head's rows, or a relative-position table's far entries, are a small part of the
    model's gradient (an L2 over everything hides them) but the largest error of their parameter.
    A scale is at least 1e-3 of the largest parameter's: some gradients are zero by construction
    (key projection biases: softmax ignores a shift shared by all keys) and hold only rounding
    noise, ~1e-8 of the largest, which no two kernels reproduce.
    """
    largest = max((float(g.abs().max()) for g in ref_grads.values() if g.numel()), default=0.0)
    floor = 1e-3 * largest
    return {name: max_rel_error(grads[name], ref, floor) for name, ref in ref_grads.items()}


def assert_gradients_match(grads, ref_grads, tol: float):
    """Same parameters have gradients, all finite, each within ``tol`` of its own scale."""
    missing, extra = set(ref_grads) - set(grads), set(grads) - set(ref_grads)
    assert not missing and not extra, f"gradients missing {sorted(missing)}, unexpected {sorted(extra)}"
    nonfinite = [n for n, g in grads.items() if not torch.isfinite(g).all()]
    assert not nonfinite, f"non-finite gradients: {nonfinite}"
    errors = gradient_errors(grads, ref_grads)
    bad = {n: e for n, e in errors.items() if not e <= tol}
    worst = sorted(bad.items(), key=lambda kv: -kv[1])[:10]
    assert not bad, f"{len(bad)} parameter gradient(s) differ by more than {tol} of their scale: {worst}"


# ------------------------------------------------------------------------------------------------
# the mask SDPA receives (pytorch#191612: an fp32 mask with half q is read as half)
# ------------------------------------------------------------------------------------------------

class StridedFp32Bias(torch.nn.Module):
    """A stand-in bias module: an fp32 ``(1, 1, T, S)`` bias whose last dimension is strided (a
    transposed ``(S, T)`` table), i.e. neither in the query's dtype nor ``stride(-1) == 1`` --
    what the core must fix before SDPA reads it."""

    def forward(self, ctx):
        t, s = ctx.q.size(-2), ctx.k.size(-2)
        g = torch.Generator().manual_seed(0)
        table = torch.randn(s, t, generator=g).to(ctx.q.device)  # fp32 on purpose
        return table.t()[None, None]


def sdpa_masks_seen(attn, x, key_padding_mask=None) -> List[Tuple[torch.dtype, int]]:
    """Call ``attn`` on ``x`` and return (dtype, stride(-1)) of every mask SDPA was handed."""
    seen = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        if attn_mask is not None:
            seen.append((attn_mask.dtype, attn_mask.stride(-1)))
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)
    finally:
        torch.nn.functional.scaled_dot_product_attention = real_sdpa
    return seen


# ------------------------------------------------------------------------------------------------
# fairseq-train / fairseq-generate logs
# ------------------------------------------------------------------------------------------------

def train_losses(stdout: str) -> List[float]:
    """Every training/validation loss fairseq printed (nan and inf included)."""
    return fairseq_log.losses(stdout)


def assert_finite_training(stdout: str):
    losses = train_losses(stdout)
    assert losses, "fairseq printed no loss:\n" + stdout[-3000:]
    bad = [x for x in losses if not math.isfinite(x) or x > 1e4]
    assert not bad, f"non-finite or exploding losses {bad}:\n" + stdout[-3000:]


def decodes(stdout: str) -> Dict[int, Tuple[float, str]]:
    """fairseq-generate's ``H-<id>\\t<score>\\t<hypothesis>`` lines: {id: (score, hypothesis)}."""
    return {int(m.group(1)): (float(m.group(2)), m.group(3))
            for m in re.finditer(r"^H-(\d+)\t(\S+)\t(.*)$", stdout, re.M)}


def assert_decodes_agree(out: Dict[int, Tuple[float, str]], ref: Dict[int, Tuple[float, str]], min_same: float,
                         score_tol: float):
    """Every sentence decoded, finite scores, and at least ``min_same`` of the hypotheses equal
    to the reference's; where they are equal, scores within ``score_tol``."""
    assert ref, "the reference decode produced no hypotheses"
    assert set(out) == set(ref), f"sentences decoded differ: missing {sorted(set(ref) - set(out))[:10]}"
    nonfinite = [i for i, (score, _) in out.items() if not math.isfinite(score)]
    assert not nonfinite, f"non-finite hypothesis scores for sentences {nonfinite[:10]}"
    same = [i for i in ref if out[i][1] == ref[i][1]]
    assert len(same) >= min_same * len(ref), f"only {len(same)}/{len(ref)} hypotheses equal the reference's"
    off = {i: (out[i][0], ref[i][0]) for i in same if abs(out[i][0] - ref[i][0]) > score_tol}
    assert not off, f"equal hypotheses with scores off by more than {score_tol}: {dict(list(off.items())[:5])}"


def assert_compiled_within(compiled: int, keys: int, structures: int):
    """Something compiled (the flex path was really taken), and no more graphs than static kernels
    need: flex_attention one per (batch size, length bucket) key and mod structure, create_block_mask
    one per key, plus the first compilation and a failed dynamic-shape one (FlexRunner's fallback)."""
    assert compiled >= 1, "nothing was compiled: the flex path was not taken"
    bound = (structures + 1) * keys + 2
    assert compiled <= bound, f"{compiled} compilations for {keys} keys of {structures} mod structures (at most {bound})"
