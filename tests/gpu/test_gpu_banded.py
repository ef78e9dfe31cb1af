"""The banded path of a hard window (issue 80) on CUDA; skipped without it.

``auto`` does not take the path on CUDA (its speed there is not measured), so the function is called
directly: in fp32 with TF32 off its output and q/k/v gradients equal the written-out softmax over every
key with the window as a float mask, and in bf16 they agree with it within half precision, at 400-token
sentences padded on either side (SMAN2's b = 4, SMAN1's per-sentence b, a causal mask).
"""

import pytest
import torch
from gpu_checks import tf32_off

from man_fairseq.modules.banded_attention import banded_attention
from man_fairseq.modules.mask_bias import StaticWindowBias

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference(q, k, v, half_width, pad, attn_mask, scale):
    t, s = q.size(2), k.size(2)
    dist = (torch.arange(t, device=q.device)[:, None] - torch.arange(s, device=q.device)[None, :]).abs()
    outside = dist > (half_width if isinstance(half_width, int) else half_width[..., None])  # (T, S) or (B, 1|T, S)
    mask = torch.zeros(outside.shape, device=q.device).masked_fill(outside, float("-inf"))
    mask = (mask if mask.dim() == 2 else mask[:, None]).masked_fill(pad[:, None, None, :], float("-inf"))
    if attn_mask is not None:
        mask = mask + attn_mask
    mask = mask.masked_fill(torch.isneginf(mask).all(-1, keepdim=True), 0.0)  # pad rows with no key: finite
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale + mask
    return torch.softmax(scores, -1) @ v.float()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("window", [4, "sqrt_half_length"])
@pytest.mark.parametrize("causal", [False, True])
def test_banded_equals_every_key_with_the_window_as_a_mask(dtype, tolerance, window, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    t = 400
    q, k, v = (torch.randn(6, 4, t, 64, generator=g, device="cuda").to(dtype).requires_grad_() for _ in range(3))
    pad = torch.zeros(6, t, dtype=torch.bool, device="cuda")
    pad[1, :37] = True  # left-padded
    pad[2, 250:] = True  # right-padded
    lengths = (~pad).sum(-1).double()
    if window == 4:
        half_width, bound = 4, 4
    else:
        half_width = StaticWindowBias.sqrt_half_length(lengths)[:, None]  # (B, 1)
        bound = int(StaticWindowBias.sqrt_half_length(torch.tensor(float(t))))
    attn_mask = torch.triu(torch.full((t, t), float("-inf"), device="cuda"), 1) if causal else None
    real = (~pad)[:, None, :, None]
    with tf32_off():
        out = banded_attention(q, k, v, half_width, bound, 0, pad, attn_mask, 0.125)
        ref = reference(q, k, v, half_width, pad, attn_mask, 0.125)
        weight = torch.randn(out.shape, generator=g, device="cuda")
        grads = torch.autograd.grad((out.float() * weight * real).sum(), (q, k, v))
        ref_grads = torch.autograd.grad((ref * weight * real).sum(), (q, k, v))
    scale = ref[real.expand_as(ref)].abs().max()
    assert ((out.float() - ref) * real).abs().max() <= tolerance * scale
    for grad, ref_grad in zip(grads, ref_grads):
        assert (grad.float() - ref_grad.float()).abs().max() <= tolerance * ref_grad.float().abs().max()
