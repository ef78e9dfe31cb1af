"""Localness on CUDA: which path each precision takes, and the extended path's error; skipped without CUDA.

* fp32 (TF32 off): ``auto`` runs the bias as extra query/key dimensions (``extended``, SDPA's
  memory-efficient kernel on the extended q/k), within docs/localness.md's float32 bound of the
  explicit path, gradients included.
* fp16 / bf16: ``auto`` keeps the bias as a float mask (``sdpa``, memory-efficient kernel, which
  differentiates the mask on CUDA): the extra dimensions need float32 (``s^2`` reaches 160,000 at
  400 tokens) and a kernel takes one dtype for q and k.
"""

import pytest
import torch
from gpu_checks import tf32_off

from man_fairseq.modules.attention_backend import EFFICIENT, EXPLICIT, EXTENDED, MATH, SDPA
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from man_fairseq.modules.localness import WINDOW_STRATEGIES, LocalnessBias

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

LENGTH, BATCH, DIM, HEADS = 400, 4, 256, 4


def attention_and_inputs(window, dtype):
    torch.manual_seed(0)
    attn = BiasedMultiheadAttention(DIM, HEADS, self_attention=True,
                                    bias_module=LocalnessBias(DIM, HEADS, window=window)).cuda().to(dtype)
    x = torch.randn(LENGTH, BATCH, DIM, device="cuda", dtype=dtype, requires_grad=True)
    pad = torch.zeros(BATCH, LENGTH, dtype=torch.bool, device="cuda")
    pad[1, :64] = True  # left padding
    pad[2, -64:] = True  # right padding
    return attn, x, pad


def output_and_grads(attn, x, pad, backend):
    attn.attention_backend = backend
    attn.zero_grad()
    x.grad = None
    out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=False)
    real = ~pad.t()
    out[real].float().pow(2).mean().backward()
    grads = {n: p.grad.float().clone() for n, p in attn.named_parameters()}
    return out[real].float(), grads, attn.last_kernel


@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
def test_fp32_takes_the_extended_path_within_the_bound(window):
    with tf32_off():
        attn, x, pad = attention_and_inputs(window, torch.float32)
        ref, ref_grads, choice = output_and_grads(attn, x, pad, "explicit")
        assert choice.path == EXPLICIT
        out, grads, choice = output_and_grads(attn, x, pad, "auto")
    assert choice.path == EXTENDED and choice.sdpa_backends == (EFFICIENT, MATH), choice.reason
    assert float((out - ref).abs().max()) < 2e-5 * max(1.0, float(ref.abs().max()))
    largest = max(float(g.abs().max()) for g in ref_grads.values())
    for name, grad in ref_grads.items():
        # k_proj.bias adds q·b_k to every score of a query, which the softmax cancels: its gradient is
        # zero in exact arithmetic and rounding noise (~1e-12) on either path, so it is held to the
        # module's largest gradient rather than to its own noise
        scale = largest if name == "k_proj.bias" else float(grad.abs().max()) or 1.0
        assert float((grads[name] - grad).abs().max()) <= 1e-4 * scale, name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_keeps_the_bias_as_a_float_mask(dtype):
    attn, x, pad = attention_and_inputs("query", dtype)
    out, grads, choice = output_and_grads(attn, x, pad, "auto")
    assert choice.path == SDPA and "half precision" in choice.reason, choice.reason
    assert choice.sdpa_backends == (EFFICIENT, MATH)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads.values())
