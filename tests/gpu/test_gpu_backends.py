"""GPU checks of the attention backends; skipped without CUDA.

For every family and each backend (``auto``, ``sdpa``, ``flex``):

* in fp32 with TF32 off, the outputs and EVERY parameter's gradient equal the explicit path's to
  a tight tolerance, each parameter measured against its own gradient scale (a gradient wrong in
  one head, or at long distances, fails);
* in fp16 and bf16 (the model cast to half, as fairseq's ``--fp16``/``--bf16``), they agree with
  the explicit fp32 path within half-precision tolerances;

on batches padded on both sides whose lengths hit ``% 128 == 64`` (the cuDNN NaN-gradient case,
pytorch#196678). The checks are functions of ``gpu_checks.py``, exercised on CPU by
``tests/test_gpu_checks.py``. Run: ``python -m pytest -q tests/gpu`` on a machine with a GPU.
"""

import copy

import pytest
import torch
from gpu_checks import (FAMILIES, HALF_TOLERANCE, LOSS_SCALE, StridedFp32Bias, assert_compiled_within,
                        assert_gradients_match, build, loss_and_grads, max_rel_error, sdpa_masks_seen, set_backend,
                        tf32_off, tokens)

from man_fairseq.modules import attention_backend as backends
from man_fairseq.modules import flex_backend as flex
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# fp32 against fp32 (TF32 off): only the summation order differs between kernels
FP32_TOLERANCE = 1e-4
BACKENDS = ["auto", "sdpa", "flex"]
# encoder states of flex against explicit in the same half dtype (max error / max state)
STATE_TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 4e-2}


def rel_err(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def flex_paths(model):
    return {m.last_kernel.path for m in model.modules()
            if isinstance(m, BiasedMultiheadAttention) and m.self_attention}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "transformer"])
def test_backend_matches_explicit_in_fp32(family, backend):
    """Same model, same fp32 precision, TF32 off: any difference is the kernel's."""
    with tf32_off():
        ref_model, task = build(family, "explicit")
        model = copy.deepcopy(ref_model)
        set_backend(model, backend)
        ref_logits, ref_loss, ref_grads = loss_and_grads(ref_model, task)
        logits, loss, grads = loss_and_grads(model, task)
    assert torch.isfinite(logits).all() and torch.isfinite(loss)
    assert max_rel_error(logits, ref_logits) <= FP32_TOLERANCE
    assert abs(float(loss - ref_loss)) <= FP32_TOLERANCE * float(ref_loss)
    assert_gradients_match(grads, ref_grads, FP32_TOLERANCE)
    if backend == "flex" and family.startswith(("man", "localness")):
        assert flex_paths(model) == {backends.FLEX}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_backend_matches_explicit_fp32_in_half_precision(family, backend, dtype_name):
    if family == "transformer" and backend != "auto":
        pytest.skip("fairseq's transformer has no --attention-backend")
    dtype = DTYPES[dtype_name]
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    with tf32_off():
        ref_model, task = build(family, "explicit")
        ref_logits, ref_loss, ref_grads = loss_and_grads(ref_model, task)
    model = copy.deepcopy(ref_model).to(dtype)
    set_backend(model, backend)
    logits, loss, grads = loss_and_grads(model, task, loss_scale=LOSS_SCALE[dtype])
    tol = HALF_TOLERANCE[dtype]
    assert torch.isfinite(logits).all() and torch.isfinite(loss)
    assert rel_err(logits, ref_logits) < tol
    assert set(grads) == set(ref_grads), "a parameter lost its gradient on this backend"
    bad = {}
    for name, g in grads.items():
        assert torch.isfinite(g).all(), f"non-finite gradient of {name}"
        if ref_grads[name].norm() > 1e-6:
            err = rel_err(g, ref_grads[name])
            if err > 2 * tol:
                bad[name] = err
    assert not bad, f"gradients differ beyond {2 * tol}: {bad}"
    if backend == "flex" and family.startswith(("man", "localness")):
        assert flex_paths(model) == {backends.FLEX}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flex_recompiles_are_bounded_by_buckets(dtype):
    """Variable lengths reuse the bucketed compilations instead of compiling per batch: a second pass
    over other lengths with the same (batch size, length bucket) keys compiles nothing, and the first
    compiles no more than static kernels per key and mod structure need. (On an H200 with torch 2.11 the
    dynamic-shape compilation failed with a LoweringException, so the runner compiled static kernels
    per shape: 18-20 graphs for this first pass, results/gpu/2026-11-29-h200.md.) The compiled encoder
    computes what the explicit path computes."""
    model, task = build("man", "flex")
    model = model.to(dtype).eval()
    reference = copy.deepcopy(model)
    set_backend(reference, "explicit")
    d = task.source_dictionary
    runner = flex.FLEX_RUNNER
    keys = set()

    def one_pass(shorter_by):
        with torch.no_grad():
            for i, n in enumerate((20, 37, 41, 55, 60, 63, 70, 90, 101, 127)):
                n -= shorter_by  # 2 shorter: every length stays in its bucket
                lengths = [n] + [max(2, n - 5 - j) for j in range(i % 4)]  # batch sizes 1..4
                src = tokens(d, lengths, left=True, seed=n).cuda()
                out = model.encoder(src, torch.tensor(lengths).cuda())
                assert flex_paths(model.encoder) == {backends.FLEX}
                ref = reference.encoder(src, torch.tensor(lengths).cuda())
                real = (src != d.pad()).t().unsqueeze(-1)  # (T, B, 1): the real tokens' states
                x, x_ref = (o["encoder_out"][0].float().masked_fill(~real, 0.0) for o in (out, ref))
                assert torch.isfinite(x).all()
                # same dtype, two kernels; CPU eager flex measured 1.2e-2 (bf16) and 1.0e-3 (fp16)
                assert max_rel_error(x, x_ref) <= STATE_TOLERANCE[dtype], (n, max_rel_error(x, x_ref))
                keys.add((len(lengths), flex.bucket_length(n)))

    before = runner.recompiles()
    one_pass(0)
    first = runner.recompiles() - before
    seen = set(keys)
    one_pass(2)
    assert keys == seen and len({bucket for _, bucket in keys}) == 3
    again = runner.recompiles() - before - first
    assert again == 0, f"{again} compilations for lengths in keys already compiled (first pass: {first})"
    # the encoder's two mod structures: DMAN's score mod, and the padding mask alone (its SAN)
    assert_compiled_within(first, len(keys), structures=2)


def test_fp32_mask_is_never_read_as_half():
    """pytorch#191612 guard: the mask handed to SDPA is in the query's dtype with stride(-1) == 1,
    even when the bias arrives in fp32 and strided (tests/test_gpu_checks.py runs this on CPU)."""
    attn = BiasedMultiheadAttention(64, 4, self_attention=True).cuda().to(torch.bfloat16)
    attn.bias_module = StridedFp32Bias()
    x = torch.randn(192, 2, 64, device="cuda", dtype=torch.bfloat16)
    pad = torch.zeros(2, 192, dtype=torch.bool, device="cuda")
    pad[1, :64] = True
    for key_padding_mask in (None, pad):
        assert sdpa_masks_seen(attn, x, key_padding_mask) == [(torch.bfloat16, 1)]
        assert attn.last_kernel.sdpa_backends == (backends.EFFICIENT, backends.MATH)
