"""The fixed calibration fusion: the authors' ``a + lambda a^c`` is the default (docs/calibration.md).

The paper prints ``softmax(a + lambda a^c)``; a softmax over weights in [0, 1 + lambda e] is
nearly uniform, so that form flattens a peaked cross-attention towards the uniform bound
(measured on a trained model: 1.69 -> 3.14 bits). The authors' code adds without a softmax,
which keeps the attention's shape: ``a (1 + lambda e^(1-m))`` rescales each weight by a factor
in [1 + lambda, 1 + lambda e].
"""

import math

import pytest
import torch

import man_fairseq  # noqa: F401  (registers models)
from conftest import build_fairseq_model
from man_fairseq.modules.biased_attention import AttentionContext
from man_fairseq.modules.calibration import CalibrationTransform

HEADS, DIM, SRC, TGT, BSZ = 4, 16, 24, 7, 3
# |H(default) - H(a)| must stay below this (bits); the printed softmax form must end within
# FLAT_TOL bits of the uniform bound log2(S).
CLOSE_TOL = 0.15
FLAT_TOL = 0.1


def entropy_bits(p):
    p = p / p.sum(-1, keepdim=True)  # the un-normalised fusions are compared as distributions
    return -(p * torch.log2(p.clamp_min(1e-300))).sum(-1)


def peaked_context(seed=0, scale=4.0):
    """Cross-attention weights with ~1.5-2 bits of entropy over 24 keys, and its context."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(TGT, BSZ, DIM, generator=g, dtype=torch.float64)
    key = torch.randn(SRC, BSZ, DIM, generator=g, dtype=torch.float64)
    logits = scale * torch.randn(BSZ, HEADS, TGT, SRC, generator=g, dtype=torch.float64)
    ctx = AttentionContext(
        query=query, key=key, q=torch.zeros(BSZ, HEADS, TGT, DIM // HEADS, dtype=torch.float64),
        k=torch.zeros(BSZ, HEADS, SRC, DIM // HEADS, dtype=torch.float64), key_padding_mask=None,
        query_start=0, incremental_state=None, self_attention=False,
    )
    return logits.softmax(-1), ctx


def fused(fusion, a, ctx, lam=0.1):
    torch.manual_seed(1)
    t = CalibrationTransform(DIM, DIM, HEADS, fusion=fusion, calibration_lambda=lam).double()
    with torch.no_grad():
        # a mask that really varies over (0, 1): larger perturbation weights than the init
        for lin in (t.perturbation.q_proj, t.perturbation.k_proj):
            lin.weight.mul_(4.0)
        m = t.mask(ctx, detach=True)
        out = t(a, ctx)
    return out, m


def test_default_fixed_fusion_is_the_authors_sum():
    from man_fairseq.models.transformer_calibrated import CALIBRATION_DEFAULTS

    assert CALIBRATION_DEFAULTS.calibration_fusion == "fixed"
    a, ctx = peaked_context()
    out, m = fused("fixed", a, ctx, lam=0.3)
    torch.testing.assert_close(out, a + 0.3 * a * torch.exp(1 - m))
    soft, _ = fused("fixed_softmax", a, ctx, lam=0.3)
    torch.testing.assert_close(soft, torch.softmax(a + 0.3 * a * torch.exp(1 - m), dim=-1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_keeps_a_peaked_attention_entropy_and_printed_form_flattens_it(seed):
    a, ctx = peaked_context(seed)
    h_a = entropy_bits(a).mean().item()
    uniform = math.log2(SRC)
    assert h_a < uniform - 2.0, "the constructed attention must be peaked"
    out, m = fused("fixed", a, ctx)
    assert m.std().item() > 0.1, "the mask must vary"
    h_default = entropy_bits(out).mean().item()
    h_printed = entropy_bits(fused("fixed_softmax", a, ctx)[0]).mean().item()
    assert abs(h_default - h_a) < CLOSE_TOL, (h_a, h_default)
    assert h_printed > uniform - FLAT_TOL, (h_a, h_printed, uniform)
    # per query row too: the default never moves a row's entropy by more than the tolerance
    assert (entropy_bits(out) - entropy_bits(a)).abs().max().item() < 2 * CLOSE_TOL


def test_fusion_option_reaches_the_model():
    model, _, args = build_fairseq_model("transformer_calibrated_small", [])
    fusions = {m.fusion for m in model.modules() if isinstance(m, CalibrationTransform)}
    assert fusions == {"fixed"}
    model, _, _ = build_fairseq_model("transformer_calibrated_small",
                                      ["--calibration-fusion", "fixed_softmax"])
    fusions = {m.fusion for m in model.modules() if isinstance(m, CalibrationTransform)}
    assert fusions == {"fixed_softmax"}
