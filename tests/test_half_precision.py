"""Half precision on CPU the way fairseq runs it: the whole model cast (``model.half()`` for
``--fp16``, ``.bfloat16()`` for ``--bf16``), not autocast.

Every family, fp16 and bf16 (torch 2.13 runs both on CPU: matmul, softmax, SDPA and their
backward), the explicit path and ``auto`` (SDPA on CPU), against the explicit fp32 path with
the same (rounded) parameters: logits and the gradient of every parameter, per parameter,
with the source padded on the left and on the right and a length on a flex bucket boundary.
"""

import copy
import math

import pytest
import torch
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, run_cli
from model_families import FAMILIES, LOSS_SCALE, build_family, tokens

from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from man_fairseq.modules.window_mask import soft_window_mask

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# max |logits - ref| / max |ref| and, per parameter, ||grad - ref|| / ||ref||. Measured worst
# cases over all families: fp16 1e-3 / 4.3e-3, bf16 8.5e-3 / 3.5e-2 (fairseq's own transformer
# at this size: 7e-4 / 2.1e-3 and 4.9e-3 / 1.5e-2)
TOL_LOGITS = {"fp16": 3e-3, "bf16": 2.5e-2}
TOL_GRAD = {"fp16": 1.5e-2, "bf16": 8e-2}
# a parameter whose gradient is zero in exact arithmetic (the key projection's bias: softmax is
# shift invariant) is compared against this fraction of the largest gradient norm instead
GRAD_FLOOR = 1e-2
SRC_LENGTHS = [16, 9, 13]  # 16: a flex bucket boundary
TGT_LENGTHS = [16, 11, 5]


def loss_and_grads(model, task, left, scale):
    d = task.source_dictionary
    src = tokens(d, SRC_LENGTHS, left, seed=1)
    prev = tokens(d, TGT_LENGTHS, left=False, seed=2)
    target = tokens(d, TGT_LENGTHS, left=False, seed=3)
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(src, torch.tensor(SRC_LENGTHS), prev)[0]
    lprobs = torch.log_softmax(logits.float(), -1)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    loss = nll.masked_fill(target == d.pad(), 0.0).sum() / (target != d.pad()).sum()
    (loss * scale).backward()
    real = (target != d.pad()).unsqueeze(-1)
    grads = {n: p.grad.float() / scale for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().float().masked_fill(~real, 0.0), grads


def set_backend(model, backend):
    for m in model.modules():
        if isinstance(m, BiasedMultiheadAttention):
            m.attention_backend = backend
    return model


def compare(logits, grads, ref_logits, ref_grads, dtype_name):
    problems = []
    assert torch.isfinite(logits).all(), "non-finite logits"
    err = float((logits - ref_logits).abs().max() / ref_logits.abs().max())
    if err > TOL_LOGITS[dtype_name]:
        problems.append(f"logits {err:.2e}")
    assert set(grads) == set(ref_grads), f"gradients missing: {set(ref_grads) ^ set(grads)}"
    floor = GRAD_FLOOR * max(float(g.norm()) for g in ref_grads.values())
    for name, g in grads.items():
        if not torch.isfinite(g).all():
            problems.append(f"{name}: non-finite gradient")
            continue
        err = float((g - ref_grads[name]).norm()) / max(float(ref_grads[name].norm()), floor)
        if err > TOL_GRAD[dtype_name]:
            problems.append(f"{name}: {err:.2e}")
    return problems


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_half_model_matches_explicit_fp32(family, dtype_name):
    dtype = DTYPES[dtype_name]
    model, task = build_family(family)
    # the reference has the half model's parameters exactly (rounded, then back to fp32)
    ref = copy.deepcopy(model).to(dtype).float()
    problems = {}
    for left in (True, False):
        ref_logits, ref_grads = loss_and_grads(ref, task, left, 1.0)
        for backend in ("explicit", "auto"):
            half = set_backend(copy.deepcopy(model).to(dtype), backend)
            logits, grads = loss_and_grads(half, task, left, LOSS_SCALE[DTYPES[dtype_name]])
            found = compare(logits, grads, ref_logits, ref_grads, dtype_name)
            if found:
                problems[(backend, "left" if left else "right")] = found
    assert not problems, problems


@pytest.mark.parametrize("family", ["localness_query", "sman"])  # a score mod, a mask mod
def test_half_model_flex_forward_matches_explicit_fp32(family):
    """flex has no CPU backward: its half-precision check here is the eval forward (eager flex)."""
    model, task = build_family(family)
    d = task.source_dictionary
    src, prev = tokens(d, SRC_LENGTHS, True, seed=1), tokens(d, TGT_LENGTHS, False, seed=2)
    real = (prev != d.pad()).unsqueeze(-1)
    for dtype_name, dtype in DTYPES.items():
        ref = copy.deepcopy(model).to(dtype).float().eval()
        half = set_backend(copy.deepcopy(model).to(dtype), "flex").eval()
        with torch.no_grad():
            ref_logits = ref(src, torch.tensor(SRC_LENGTHS), prev)[0].masked_fill(~real, 0.0)
            logits = half(src, torch.tensor(SRC_LENGTHS), prev)[0].float().masked_fill(~real, 0.0)
        assert {m.last_kernel.path for m in half.modules()
                if isinstance(m, BiasedMultiheadAttention) and m.self_attention} == {"flex"}
        err = float((logits - ref_logits).abs().max() / ref_logits.abs().max())
        assert torch.isfinite(logits).all() and err < TOL_LOGITS[dtype_name], (dtype_name, err)


def test_diffwin_mask_keeps_small_values_in_half_precision():
    """P(pointer >= j) = total - P(pointer <= j) + phi cancels near the far end of a sharp pointer:
    summed in half, small mask values were off by 3x their size (bf16)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 8, 64, generator=g, dtype=torch.float64) * 6  # sharp pointers
    for dtype, tol in ((torch.bfloat16, 2 ** -7), (torch.float16, 2 ** -10)):
        for segment_size, union in ((1, False), (5, False), (5, True)):
            # the same pointer values in half and in float64: only the arithmetic differs
            phi = torch.softmax(logits, -1).to(dtype)
            ref = soft_window_mask(phi[0].double(), phi[1].double(), segment_size, union=union)
            out = soft_window_mask(phi[0], phi[1], segment_size, union=union)
            assert out.dtype == dtype
            err = (out.double() - ref).abs() / (ref.abs() + 1e-4)  # 1e-4: above fp16 subnormals
            assert float(err.max()) < 2 * tol, (dtype, segment_size, union, float(err.max()))


# fairseq 0.12.3 on CPU: --fp16's (and --bf16's) FP16Optimizer allocates its fp32 copy with
# torch.cuda.current_device(); --memory-efficient-fp16 (-bf16) needs none and runs.
CLI_FAMILIES = {
    "man": ("transformer_man_base", ["--encoder-sublayers", "dman,sman1,sman2,ffn",
                                     "--decoder-sublayers", "dman,sman1,cross,ffn"]),
    "localness": ("transformer_localness_base", ["--localness-window", "layer", "--relative-positions"]),
    "diffwin": ("transformer_diffwin_base", ["--diffwin-layers", "2"]),  # AW token, AW segment, MW
    "calibration": ("transformer_calibrated_base", ["--criterion", "calibrated_label_smoothed_cross_entropy",
                                                    "--calibration-fusion", "gate"]),
}


@pytest.mark.parametrize("family", list(CLI_FAMILIES))
def test_fairseq_train_fp16_update_on_cpu(family, toy_data_bin, tmp_path):
    arch, extra = CLI_FAMILIES[family]
    out = run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--task", "translation", "--arch", arch,
                   "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, *extra, "--max-update", "2",
                   "--fp16", "--memory-efficient-fp16", "--disable-validation", "--save-dir", tmp_path / "ck", "--no-save"]).stdout
    summary = [line for line in out.splitlines() if "| train |" in line]
    assert summary, out[-3000:]
    # the update ran in half precision with a loss scale, and its loss is a finite number
    assert "num_updates 2" in summary[-1] and "loss_scale" in summary[-1], summary[-1]
    loss = float(summary[-1].split("| loss ")[1].split()[0])
    assert math.isfinite(loss), summary[-1]


def test_fairseq_train_bf16_is_not_tpu(toy_data_bin, tmp_path):
    """fairseq 0.12 sets --tpu whenever --bf16 is given, and the trainer then asks torch_xla for a
    device (on a GPU too: found on an H200). The plugin leaves --tpu to the user: a --bf16 update runs."""
    out = run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--task", "translation", "--arch",
                   "transformer_man_base", "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, "--max-update", "2",
                   "--bf16", "--memory-efficient-bf16", "--disable-validation", "--save-dir", tmp_path / "ck",
                   "--no-save"]).stdout
    assert "'tpu': False" in out and "'bf16': True" in out, out[-3000:]
    summary = [line for line in out.splitlines() if "| train |" in line]
    assert summary and "num_updates 2" in summary[-1], out[-3000:]
    assert math.isfinite(float(summary[-1].split("| loss ")[1].split()[0])), summary[-1]
