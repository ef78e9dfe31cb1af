"""GPU checks of the attention backends (issue 13); skipped without CUDA.

For every family, each half precision and each backend: the model's outputs and the gradients of
ALL parameters (bias parameters included) agree with the explicit fp32 path, on batches padded on
both sides whose lengths hit ``% 128 == 64`` (the cuDNN NaN-gradient case, pytorch#196678).
Run: ``python -m pytest -q tests/gpu`` on a machine with a GPU.
"""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import build_fairseq_model  # noqa: E402

from man_fairseq.modules import attention_backend as backends  # noqa: E402
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

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
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# relative L2 error of outputs / gradients against the fp32 explicit path
TOLERANCE = {"fp16": 2e-2, "bf16": 6e-2}
# source lengths hit % 128 == 64 (64, 192) next to others; left-padded source, right-padded target
SRC_LENGTHS = [192, 130, 64, 100]
TGT_LENGTHS = [64, 192, 150, 77]


def tokens(dictionary, lengths, left, seed):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    out = torch.full((len(lengths), t), dictionary.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):
        seq = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g).tolist() + [dictionary.eos()]
        if left:
            out[i, t - n :] = torch.tensor(seq)
        else:
            out[i, :n] = torch.tensor(seq)
    return out


def build(family, backend, seed=0):
    arch, extra = FAMILIES[family]
    torch.manual_seed(seed)
    argv = GPU_MODEL + extra + ([] if family == "transformer" else ["--attention-backend", backend])
    model, task, _ = build_fairseq_model(arch, argv, dict_size=200)
    return model.cuda(), task


def loss_and_grads(model, task):
    d = task.source_dictionary
    src = tokens(d, SRC_LENGTHS, left=True, seed=1).cuda()
    prev = tokens(d, TGT_LENGTHS, left=False, seed=2).cuda()
    target = tokens(d, TGT_LENGTHS, left=False, seed=3).cuda()
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(src, torch.tensor(SRC_LENGTHS).cuda(), prev)[0]
    lprobs = torch.log_softmax(logits.float(), -1)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    loss = nll.masked_fill(target == d.pad(), 0.0).sum() / (target != d.pad()).sum()
    loss.backward()
    real = (target != d.pad()).unsqueeze(-1)
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    return logits.float().masked_fill(~real, 0.0), loss.float(), grads


def rel_err(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("backend", ["auto", "sdpa", "flex"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_backend_matches_explicit_fp32(family, backend, dtype_name):
    if family == "transformer" and backend != "auto":
        pytest.skip("fairseq's transformer has no --attention-backend")
    dtype = DTYPES[dtype_name]
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    ref_model, task = build(family, "explicit")
    model = copy.deepcopy(ref_model).to(dtype)
    for m in model.modules():
        if isinstance(m, BiasedMultiheadAttention):
            m.attention_backend = backend
    ref_logits, ref_loss, ref_grads = loss_and_grads(ref_model, task)
    logits, loss, grads = loss_and_grads(model, task)
    tol = TOLERANCE[dtype_name]
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
        paths = {m.last_kernel.path for m in model.modules()
                 if isinstance(m, BiasedMultiheadAttention) and m.self_attention}
        assert paths == {backends.FLEX}, paths


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flex_recompiles_are_bounded_by_buckets(dtype):
    """Variable lengths reuse the bucketed compilations instead of compiling per batch."""
    model, task = build("man", "flex")
    model = model.to(dtype).eval()
    d = task.source_dictionary
    runner = backends.FLEX_RUNNER
    before = runner.recompiles()
    lengths_seen = set()
    with torch.no_grad():
        for i, n in enumerate((20, 37, 41, 55, 60, 63, 70, 90, 101, 127)):
            lengths = [n] + [max(2, n - 5 - j) for j in range(i % 4)]  # batch sizes 1..4
            src = tokens(d, lengths, left=True, seed=n).cuda()
            model.encoder(src, torch.tensor(lengths).cuda())
            lengths_seen.add(backends.bucket_length(n))
    compiled = runner.recompiles() - before
    # 10 (length, batch size) pairs in 3 length buckets: the first shape compiles, a new size
    # recompiles once with that dimension dynamic, then everything is reused -- never one
    # compilation per batch (flex_attention and create_block_mask are two graphs per compilation)
    assert len(lengths_seen) == 3
    assert compiled <= 2 * len(lengths_seen), compiled


def test_fp32_mask_is_never_read_as_half(monkeypatch):
    """pytorch#191612 guard: the mask handed to SDPA is in the query's dtype."""
    attn = BiasedMultiheadAttention(64, 4, self_attention=True).cuda().to(torch.bfloat16)
    x = torch.randn(192, 2, 64, device="cuda", dtype=torch.bfloat16)
    pad = torch.zeros(2, 192, dtype=torch.bool, device="cuda")
    pad[1, :64] = True
    seen = {}
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen["mask_dtype"] = None if attn_mask is None else attn_mask.dtype
        seen["stride"] = None if attn_mask is None else attn_mask.stride(-1)
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    attn(x, x, x, key_padding_mask=pad, need_weights=False)
    assert seen == {"mask_dtype": torch.bfloat16, "stride": 1}
    assert attn.last_kernel.sdpa_backends == (backends.EFFICIENT, backends.MATH)
