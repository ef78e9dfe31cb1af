"""The checks of tests/gpu (tests/gpu/gpu_checks.py), run on CPU: each passes on what is right
and fails on what the GPU test is there to catch."""

import copy
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import gpu_checks as checks  # noqa: E402

from man_fairseq.modules import attention_backend as backends  # noqa: E402
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention  # noqa: E402

# real fairseq-train (--no-progress-bar) lines of a CPU run of transformer_man_base
TRAIN_LOG = """\
2026-11-23 22:13:00 | INFO | train_inner | epoch 001:      1 / 4 loss=6.978, nll_loss=6.972, ppl=125.53, wps=0, ups=0, wpb=927, bsz=96, num_updates=1, lr=0.0003, gnorm=1.622, train_wall=0, wall=5
2026-11-23 22:13:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 6.922 | nll_loss 6.916 | ppl 120.74 | wps 0 | wpb 346 | bsz 40 | num_updates 2
2026-11-23 22:13:00 | INFO | train | epoch 001 | loss 6.991 | nll_loss 6.986 | ppl 126.74 | wps 2116.8 | ups 3.01 | wpb 815 | bsz 80 | num_updates 2 | lr 0.0006 | gnorm 1.726 | train_wall 0 | wall 6
"""
OVERFLOW = "2026-11-23 22:13:00 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0\n"
# the same run had its training loss turned NaN (fp16 overflow reaching the loss); validation finite
NAN_LOG = TRAIN_LOG.replace("loss=6.978", "loss=nan").replace("| loss 6.991 |", "| loss nan |")


def test_loss_parser_reads_every_loss_and_catches_nan():
    assert checks.train_losses(OVERFLOW + TRAIN_LOG) == [6.978, 6.922, 6.991]
    checks.assert_finite_training(OVERFLOW + TRAIN_LOG)
    assert [math.isnan(x) for x in checks.train_losses(NAN_LOG)] == [True, False, True]
    with pytest.raises(AssertionError, match="non-finite"):
        checks.assert_finite_training(NAN_LOG)
    with pytest.raises(AssertionError, match="no loss"):
        checks.assert_finite_training("nothing trained\n")
    # the NaN of the per-update line alone (validation and epoch summary finite) is caught too:
    # the pattern test_gpu_cli.py once used read only the "| loss X |" summaries and missed it
    inner_nan = TRAIN_LOG.replace("loss=6.978", "loss=nan")
    assert [math.isnan(x) for x in checks.train_losses(inner_nan)] == [True, False, False]
    with pytest.raises(AssertionError, match="non-finite"):
        checks.assert_finite_training(inner_nan)


GEN_REF = "S-0\tw1 w2\nH-0\t-0.51\tw5 w6\nH-1\t-0.70\tw7\nH-2\t-1.25\tw8 w9 w9\n"


def test_decode_comparison():
    ref = checks.decodes(GEN_REF)
    assert ref == {0: (-0.51, "w5 w6"), 1: (-0.70, "w7"), 2: (-1.25, "w8 w9 w9")}
    checks.assert_decodes_agree(checks.decodes(GEN_REF.replace("-0.51", "-0.52")), ref, 1.0, score_tol=0.05)
    checks.assert_decodes_agree(checks.decodes(GEN_REF.replace("\tw7", "\tw4")), ref, 0.6, score_tol=0.05)
    for broken, msg in ((GEN_REF.replace("-0.70", "nan"), "non-finite"),
                        (GEN_REF.replace("-0.70", "-inf"), "non-finite"),
                        (GEN_REF.replace("H-2", "X-2"), "missing"),
                        (GEN_REF.replace("\tw7", "\tw4").replace("w8 w9 w9", "w8"), "only 1/3"),
                        (GEN_REF.replace("-1.25", "-2.5"), "scores off")):
        with pytest.raises(AssertionError, match=msg):
            checks.assert_decodes_agree(checks.decodes(broken), ref, 0.6, score_tol=0.05)


def test_compile_count_needs_a_compilation():
    checks.assert_compiled_within(29, 9, structures=2)  # (2 + 1) x 9 + 2
    with pytest.raises(AssertionError, match="nothing was compiled"):
        checks.assert_compiled_within(0, 9, structures=2)
    with pytest.raises(AssertionError, match="30 compilations for 9 keys of 2 mod structures"):
        checks.assert_compiled_within(30, 9, structures=2)


@pytest.fixture(scope="module")
def man_fp32():
    """transformer_man_base at the GPU tests' size and lengths, explicit path, fp32 on CPU."""
    model, task = checks.build("man", "explicit", device="cpu")
    logits, loss, grads = checks.loss_and_grads(model, task, device="cpu")
    return model, task, logits, loss, grads


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_fp32_comparison_passes_on_cpu_kernels(man_fp32, backend):
    """The fp32 comparison at its GPU tolerance, on CPU's SDPA (flex trains through auto on CPU, whose
    DMAN sublayers take the fused-bias-grad path)."""
    ref_model, task, ref_logits, ref_loss, ref_grads = man_fp32
    model = copy.deepcopy(ref_model)
    checks.set_backend(model, backend)
    logits, loss, grads = checks.loss_and_grads(model, task, device="cpu")
    # fairseq asks the last cross-attention for weights: explicit
    expected = {backends.SDPA, backends.EXPLICIT} | ({backends.FUSED_BIAS_GRAD} if backend == "flex" else set())
    assert {m.last_kernel.path for m in model.modules() if isinstance(m, BiasedMultiheadAttention)} == expected
    assert checks.max_rel_error(logits, ref_logits) <= 1e-4
    checks.assert_gradients_match(grads, ref_grads, 1e-4)


def test_fp16_comparison_scales_the_loss_as_fairseq_does(man_fp32):
    """Unscaled, fp16 loses up to half of the dynamic mask's small gradients (the GPU test failed so
    on an H200 for MAN and diffwin on every backend); with fairseq's loss scale the fp16 model on
    CPU's fp16 SDPA is within the GPU test's tolerance."""
    ref_model, task, ref_logits, _, ref_grads = man_fp32
    tol = checks.HALF_TOLERANCE[torch.float16]

    def worst_gradient(loss_scale):
        model = copy.deepcopy(ref_model).to(torch.float16)
        checks.set_backend(model, "sdpa")
        logits, _, grads = checks.loss_and_grads(model, task, device="cpu", loss_scale=loss_scale)
        assert checks.max_rel_error(logits, ref_logits) < tol
        return max(float((grads[n] - ref_grads[n]).norm() / ref_grads[n].norm())
                   for n in grads if ref_grads[n].norm() > 1e-6)

    assert worst_gradient(checks.LOSS_SCALE[torch.float16]) < 2 * tol
    assert worst_gradient(1.0) > 2 * tol


def test_per_parameter_check_catches_one_wrong_head(man_fp32):
    """A 1 % error in one head's query gradient: within the tolerance as one L2 over all
    gradients, caught by the per-parameter max error."""
    *_, ref_grads = man_fp32
    grads = {n: g.clone() for n, g in ref_grads.items()}
    name = "encoder.layers.1.blocks.0.q_proj.weight"
    grads[name][16:32] *= 1.01  # head 1 of 4 (head width 16)
    flat = torch.cat([g.flatten() for g in grads.values()])
    ref_flat = torch.cat([g.flatten() for g in ref_grads.values()])
    assert float((flat - ref_flat).norm() / ref_flat.norm()) < 1e-4
    with pytest.raises(AssertionError, match=name.replace(".", r"\.")):
        checks.assert_gradients_match(grads, ref_grads, 1e-4)


def test_per_parameter_check_catches_wrong_long_distance_gradients(man_fp32):
    """DMAN's distance table: the entries for distances >= 128 (long sentences only) wrong by 5 %,
    in the layer whose table has the smallest gradients of the model."""
    *_, ref_grads = man_fp32
    name = "encoder.layers.1.blocks.0.bias_module.distance_bias"
    table = ref_grads[name]
    center = table.numel() // 2
    far = torch.ones_like(table, dtype=torch.bool)
    far[center - 127 : center + 128] = False
    assert table[far].abs().max() > 0, "the batch reaches distances >= 128"
    grads = {n: g.clone() for n, g in ref_grads.items()}
    grads[name][far] *= 1.05
    with pytest.raises(AssertionError, match=name.replace(".", r"\.")):
        checks.assert_gradients_match(grads, ref_grads, 1e-4)


def test_sdpa_gets_the_mask_in_the_query_dtype_and_contiguous():
    """The GPU mask-guard test's check on CPU: a bf16 attention with an fp32, strided bias."""
    torch.manual_seed(0)
    attn = BiasedMultiheadAttention(64, 4, self_attention=True).to(torch.bfloat16)
    attn.bias_module = checks.StridedFp32Bias()
    x = torch.randn(40, 2, 64, dtype=torch.bfloat16)
    pad = torch.zeros(2, 40, dtype=torch.bool)
    pad[1, :8] = True
    for key_padding_mask in (None, pad):
        assert checks.sdpa_masks_seen(attn, x, key_padding_mask) == [(torch.bfloat16, 1)]
        assert attn.last_kernel.path == backends.SDPA
    # the guard itself: an fp32 strided mask leaves prepare_sdpa_mask in q's dtype, contiguous
    mask = torch.randn(40, 40).t()[None, None]
    q = torch.randn(2, 4, 40, 16, dtype=torch.bfloat16)
    prepared = backends.prepare_sdpa_mask(mask, q)
    assert prepared.dtype == torch.bfloat16 and prepared.stride(-1) == 1
