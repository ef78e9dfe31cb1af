"""The fused-bias-grad path (issue 74): a learnable bias through the fused CPU kernel with its own gradient.

Every comparison is float64 against the explicit path (the softmax written out, autograd through it),
for the output and every gradient (the sublayer input, q/k/v/out projections, each bias parameter),
with several blocks per call (the block size forced small: query rows of one sentence, or whole sentences)
and one block.
"""

import pytest
import torch
from conftest import TINY_MODEL, build_fairseq_model

from man_fairseq.modules import fused_bias_grad as fused
from man_fairseq.modules.attention_backend import EXPLICIT, EXTENDED, FUSED_BIAS_GRAD, SDPA, choose_kernel
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from man_fairseq.modules.diff_window import AdditiveWindow
from man_fairseq.modules.localness import LocalnessBias
from man_fairseq.modules.mask_bias import DynamicMaskBias, StaticWindowBias

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
C, H = 16, 4


@pytest.fixture(params=["rows", "sentences", "whole"])
def block_elements(request, monkeypatch):
    """Blocks of a few query rows of one sentence (uneven last block), of two whole sentences (of the three the
    tests use, at 9 x 9 tokens: an uneven last block), or the whole call in one block."""
    elements = {"rows": 4 * H * 11, "sentences": 2 * H * 9 * 9, "whole": 1 << 30}[request.param]
    monkeypatch.setattr(fused, "BLOCK_ELEMENTS", elements)
    return request.param


# ---------------------------------------------------------------------------------------------
# the policy: which calls take the path, and why the others do not
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, path",
    [
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, requires_grad=True, bias_grad=True), FUSED_BIAS_GRAD),
        (dict(backend="auto", device_type="cpu", dtype=F64, has_mask=True, requires_grad=True, bias_grad=True), FUSED_BIAS_GRAD),
        # flex has no CPU backward: it falls back to auto, which takes the path
        (dict(backend="flex", device_type="cpu", dtype=F32, has_mask=True, flex_supported=True, requires_grad=True,
              bias_grad=True), FUSED_BIAS_GRAD),
        # explicit stays the reference, sdpa PyTorch's dispatcher, CUDA its own kernels
        (dict(backend="explicit", device_type="cpu", dtype=F32, has_mask=True, requires_grad=True, bias_grad=True), EXPLICIT),
        (dict(backend="sdpa", device_type="cpu", dtype=F32, has_mask=True, requires_grad=True, bias_grad=True), SDPA),
        (dict(backend="auto", device_type="cuda", dtype=F32, has_mask=True, requires_grad=True, bias_grad=True), SDPA),
        # the probabilities read, dropout, half precision, a bias written as extra q/k columns
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, needs_probabilities=True, bias_grad=True),
         EXPLICIT),
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, dropout=True, bias_grad=True), SDPA),
        (dict(backend="auto", device_type="cpu", dtype=BF16, has_mask=True, bias_grad=True), SDPA),
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, extendable=True, bias_grad=True), EXTENDED),
        # no bias gradient: the plain fused forward as before
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, requires_grad=True), SDPA),
    ],
)
def test_kernel_policy(kwargs, path):
    choice = choose_kernel(**kwargs)
    assert choice.path == path, choice.reason
    if kwargs.get("dropout"):
        assert "dropout" in choice.reason
    if kwargs["dtype"] == BF16:
        assert "half precision" in choice.reason


# ---------------------------------------------------------------------------------------------
# one attention module: float64 values and every gradient equal to the explicit path
# ---------------------------------------------------------------------------------------------

def padding(lengths, left):
    t = max(lengths)
    pad = torch.zeros(len(lengths), t, dtype=torch.bool)
    for i, n in enumerate(lengths):
        if left:
            pad[i, : t - n] = True
        else:
            pad[i, n:] = True
    return pad


def future_mask(t):
    return torch.triu(torch.full((t, t), float("-inf"), dtype=F64), 1)


def forward_backward(attn, backend, x, key=None, pad=None, attn_mask=None):
    """Output, input gradients and parameter gradients of one training call, and the kernel it took."""
    attn.attention_backend = backend
    attn.zero_grad()
    x = x.detach().clone().requires_grad_()
    kv = x if key is None else key.detach().clone().requires_grad_()
    out, _ = attn(x, kv, kv, key_padding_mask=pad, attn_mask=attn_mask, need_weights=False)
    real = torch.ones_like(out) if pad is None or key is not None else (~pad).t()[..., None].to(out.dtype)
    # a fixed random weighting of the (real) outputs: every output element reaches the loss differently
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    (out * weight * real).sum().backward()
    grads = {name: p.grad.clone() for name, p in attn.named_parameters() if p.grad is not None}
    grads["input"] = x.grad.clone()
    if key is not None:
        grads["key input"] = kv.grad.clone()
    return out.detach() * real, grads, attn.last_kernel


def assert_paths_agree(attn, x, **kw):
    attn.train()
    ref, ref_grads, choice = forward_backward(attn, "explicit", x, **kw)
    assert choice.path == EXPLICIT
    out, grads, choice = forward_backward(attn, "auto", x, **kw)
    assert choice.path == FUSED_BIAS_GRAD, choice.reason
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    assert set(grads) == set(ref_grads)
    bias_params = {n for n, _ in attn.named_parameters() if n.startswith("bias_module.")}
    assert bias_params and bias_params <= set(grads)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12, msg=name)


def attention(bias_module, cross=False, seed=0):
    torch.manual_seed(seed)
    attn = BiasedMultiheadAttention(C, H, self_attention=not cross, encoder_decoder_attention=cross,
                                    bias_module=bias_module)
    return attn.double()


def inputs(t, b=3, seed=1):
    return torch.randn(t, b, C, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize("left", [True, False])
def test_dman_encoder_with_padding_on_either_side(block_elements, left):
    attn = attention(DynamicMaskBias(C, H, max_relative_distance=3))
    assert_paths_agree(attn, inputs(9), pad=padding([9, 4, 7], left))


def test_dman_without_padding_and_zero_init(block_elements):
    assert_paths_agree(attention(DynamicMaskBias(C, H, max_relative_distance=20, init="zeros")), inputs(9))


def test_dman_causal_decoder_self_attention(block_elements):
    attn = attention(DynamicMaskBias(C, H, max_relative_distance=3))
    attn.causal_attn_mask = True
    assert_paths_agree(attn, inputs(9), pad=padding([9, 6, 8], left=False), attn_mask=future_mask(9))


@pytest.mark.parametrize("segment", [1, 3])
@pytest.mark.parametrize("left", [True, False])
def test_additive_window_self_attention_through_the_generic_reducer(block_elements, segment, left):
    """diffwin's AW has no reducer of its own: its (B,1,T,S) bias is back-propagated by autograd."""
    bias = AdditiveWindow(C, segment_size=segment)
    assert not hasattr(bias, "fused_bias_terms")
    assert_paths_agree(attention(bias), inputs(9), pad=padding([9, 4, 7], left))


def test_additive_window_causal_decoder_self_attention(block_elements):
    attn = attention(AdditiveWindow(C, causal=True))
    attn.causal_attn_mask = True
    assert_paths_agree(attn, inputs(9), pad=padding([9, 6, 8], left=False), attn_mask=future_mask(9))


@pytest.mark.parametrize("segment", [1, 5])
def test_additive_window_cross_attention(block_elements, segment):
    key = torch.randn(11, 3, C, generator=torch.Generator().manual_seed(7), dtype=F64)
    attn = attention(AdditiveWindow(C, segment_size=segment), cross=True)
    assert_paths_agree(attn, inputs(9), key=key, pad=padding([11, 5, 8], left=True))


# ---------------------------------------------------------------------------------------------
# the autograd function itself: gradcheck, both reducers
# ---------------------------------------------------------------------------------------------

class _Ctx:
    incremental_state = None


class _TensorBias(torch.nn.Module):
    """A bias module returning a given tensor of any broadcastable shape: the generic reducer's general case."""

    def __init__(self, tensor):
        super().__init__()
        self.tensor = tensor

    def forward(self, ctx):
        return self.tensor


def qkv(b=2, t=5, s=5, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, H, n, d, generator=g, dtype=F64, requires_grad=True) for n in (t, s, s))


# two query rows of a sentence, one sentence, both sentences per block (2 sentences x 5 queries x 6 keys)
ELEMENTS = [2 * H * 6, 5 * H * 6, 10 * H * 6]


@pytest.mark.parametrize("shape", [(2, H, 5, 6), (2, 1, 5, 6), (1, H, 1, 6), (5, 6)])
@pytest.mark.parametrize("elements", ELEMENTS)
def test_gradcheck_generic_reducer(shape, elements):
    q, k, v = qkv(t=5, s=6)
    bias = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=F64, requires_grad=True)
    fixed = torch.zeros(2, 1, 1, 6, dtype=F64).masked_fill(padding([6, 4], left=True)[:, None, None, :], float("-inf"))

    def f(q, k, v, b):
        return fused.fused_bias_attention(q, k, v, fixed, 0.7, _TensorBias(b), _Ctx(), elements=elements)

    assert torch.autograd.gradcheck(f, (q, k, v, bias))


@pytest.mark.parametrize("elements", ELEMENTS)
def test_gradcheck_dman_reducer(elements):
    q, k, v = qkv(t=5, s=6)
    dman = DynamicMaskBias(C, H, max_relative_distance=2).double()
    g = torch.Generator().manual_seed(3)
    hw = torch.randn(2, 1, 5, 1, generator=g, dtype=F64, requires_grad=True)
    dist = torch.randn(5, 6, generator=g, dtype=F64, requires_grad=True)
    head = torch.randn(1, H, 1, 1, generator=g, dtype=F64, requires_grad=True)
    # causal (keys one ahead) with padding, and a finite entry: the -inf entries folded into the bias, the rest added
    fixed = torch.triu(torch.full((5, 6), float("-inf"), dtype=F64), 2).expand(2, 1, 5, 6).clone()
    fixed[0, 0, :, 0] = float("-inf")
    fixed[1, 0, 2, 3] = -0.5

    def f(q, k, v, hw, dist, head):
        # the DMAN reducer on free terms (the module builds them from its parameters)
        dman.fused_bias_terms = lambda ctx: (hw, dist, head)
        return fused.fused_bias_attention(q, k, v, fixed, 0.7, dman, _Ctx(), elements=elements)

    assert torch.autograd.gradcheck(f, (q, k, v, hw, dist, head))


# ---------------------------------------------------------------------------------------------
# calls that keep their paths
# ---------------------------------------------------------------------------------------------

def test_no_grad_incremental_dropout_weights_and_static_windows_keep_their_paths():
    attn = attention(DynamicMaskBias(C, H, max_relative_distance=3)).train()
    x = inputs(6)
    with torch.no_grad():
        attn(x, x, x, need_weights=False)
    assert attn.last_kernel.path == SDPA
    attn(x, x, x, need_weights=True)
    assert attn.last_kernel.path == EXPLICIT and "probabilities" in attn.last_kernel.reason
    attn.dropout_module.p = 0.1
    attn(x, x, x, need_weights=False)
    assert attn.last_kernel.path == SDPA and "dropout" in attn.last_kernel.reason
    attn.dropout_module.p = 0.0
    attn.eval()  # evaluation mode with gradients on (no dropout either way): still the path
    attn(x, x, x, need_weights=False)
    assert attn.last_kernel.path == FUSED_BIAS_GRAD
    attn.causal_attn_mask = True
    attn(x[:1], x[:1], x[:1], incremental_state={}, need_weights=False)
    assert attn.last_kernel.path == SDPA  # incremental decoding: the plain fused forward
    for p in attn.bias_module.parameters():
        p.requires_grad_(False)
    attn(x, x, x, need_weights=False)
    assert attn.last_kernel.path == SDPA  # a frozen bias needs no gradient
    static = attention(StaticWindowBias(2)).train()
    static(x, x, x, need_weights=False)
    assert static.last_kernel.path == SDPA  # no parameters: the window is a fixed mask
    localness = attention(LocalnessBias(C, H, window="query")).train()
    localness(x, x, x, need_weights=False)
    assert localness.last_kernel.path == EXTENDED


# ---------------------------------------------------------------------------------------------
# whole models: --attention-backend reaches the attentions; a training step equal on both paths
# ---------------------------------------------------------------------------------------------

MODELS = {
    "dman": ("transformer_man_base", ["--encoder-sublayers", "dman,san,ffn", "--decoder-sublayers",
                                      "dman,san,cross,ffn", "--dman-max-relative-distance", "3"]),
    "sman1": ("transformer_man_base", ["--encoder-sublayers", "sman1,dman,ffn", "--decoder-sublayers",
                                       "sman1,cross,ffn"]),
    "sman2": ("transformer_man_base", ["--encoder-sublayers", "sman2,dman,ffn", "--decoder-sublayers",
                                       "sman2,san,cross,ffn", "--static-mask-window", "2"]),
    "sman_without_window": ("transformer_man_base", ["--encoder-sublayers", "san,dman,ffn",
                                                     "--decoder-sublayers", "san,cross,ffn"]),
    "diffwin_token": ("transformer_diffwin_base", ["--diffwin-encoder", "aw", "--diffwin-encoder-mask", "token",
                                                   "--diffwin-cross", "aw", "--diffwin-cross-mask", "token",
                                                   "--diffwin-decoder", "aw"]),
    "diffwin_segment": ("transformer_diffwin_base", ["--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw",
                                                     "--diffwin-encoder-mask", "segment", "--diffwin-segment-size", "3"]),
}


def tiny(name, backend):
    arch, extra = MODELS[name]
    torch.manual_seed(0)
    model, task, args = build_fairseq_model(
        arch, TINY_MODEL + ["--dropout", "0", "--attention-backend", backend] + extra, dict_size=40)
    return model.double().train(), task, args


def tokens(task, lengths, left, seed):
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    t = max(lengths)
    out = torch.full((len(lengths), t), d.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):
        seq = torch.tensor(torch.randint(d.nspecial, len(d), (n - 1,), generator=g).tolist() + [d.eos()])
        if left:
            out[i, t - n:] = seq
        else:
            out[i, :n] = seq
    return out


def training_step(model, src, prev):
    model.zero_grad()
    lengths = (src != model.encoder.padding_idx).sum(1)
    out = model(src, lengths, prev)[0]
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    (out * weight).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def learnable_bias_attentions(model):
    return [m for m in model.modules() if isinstance(m, BiasedMultiheadAttention)
            and m.bias_module is not None and any(p.requires_grad for p in m.bias_module.parameters())]


@pytest.mark.parametrize("name", list(MODELS))
def test_backend_option_reaches_the_biases_and_a_training_step_is_equal(block_elements, name):
    results = {}
    for backend in ("explicit", "auto"):
        model, task, args = tiny(name, backend)
        assert args.attention_backend == backend
        src = tokens(task, [9, 4, 7], left=True, seed=1)
        prev = tokens(task, [6, 6, 6], left=False, seed=2)
        results[backend] = training_step(model, src, prev)
        # fairseq's decoder asks the last layer's cross-attention for its weights (alignment): explicit
        biased = [m for m in learnable_bias_attentions(model) if "probabilities" not in m.last_kernel.reason]
        assert biased
        expected = FUSED_BIAS_GRAD if backend == "auto" else EXPLICIT
        assert {m.last_kernel.path for m in biased} == {expected}, [m.last_kernel.reason for m in biased]
    (ref, ref_grads), (out, grads) = results["explicit"], results["auto"]
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    assert set(grads) == set(ref_grads)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-9, atol=1e-10, msg=n)


def test_incremental_decoding_equals_the_training_pass():
    """The decoder's DMAN in training (grad on: the fused-bias-grad path) and step by step (the plain fused forward)."""
    model, task, _ = tiny("dman", "auto")
    src = tokens(task, [7, 5], left=True, seed=3)
    prev = tokens(task, [6, 6], left=False, seed=4)
    model.eval()  # as in decoding; gradients stay on for the full pass
    enc = model.encoder(src, torch.tensor([7, 5]))
    full = model.decoder(prev, encoder_out=enc)[0]
    assert FUSED_BIAS_GRAD in {m.last_kernel.path for m in learnable_bias_attentions(model.decoder)}
    with torch.no_grad():
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0])
    assert {m.last_kernel.path for m in learnable_bias_attentions(model.decoder)} == {SDPA}
    torch.testing.assert_close(torch.cat(steps, 1), full.detach(), rtol=1e-9, atol=1e-9)


def test_cli_training_logs_the_same_losses_and_the_checkpoint_decodes_the_same(toy_data_bin, tmp_path):
    """fairseq-train on both paths (MAN, DMAN in encoder and decoder): the logged losses and gradient
    norms agree to float32 rounding; the auto run's checkpoint decodes to identical hypotheses on both."""
    import re

    from conftest import TINY_TRAIN, USER_DIR, run_cli

    logged = {}
    for backend in ("explicit", "auto"):
        proc = run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--task", "translation", "--arch",
                        "transformer_man_base", "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN,
                        "--max-update", "10", "--save-dir", tmp_path / backend, "--attention-backend", backend,
                        "--no-save-optimizer-state", "--disable-validation"])
        lines = [line for line in proc.stdout.splitlines() if "train_inner" in line or "| train |" in line]
        logged[backend] = [(float(re.search(r"\bloss[= ]+([\d.]+)", line).group(1)),
                            float(re.search(r"\bgnorm[= ]+([\d.]+)", line).group(1))) for line in lines]
    assert len(logged["auto"]) >= 2 and len(logged["auto"]) == len(logged["explicit"]), logged
    for (loss, gnorm), (ref_loss, ref_gnorm) in zip(logged["auto"], logged["explicit"]):
        assert abs(loss - ref_loss) <= 2e-3 and abs(gnorm - ref_gnorm) <= 2e-3 * max(1.0, ref_gnorm), logged

    def hypotheses(backend):
        out = run_cli(["fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path",
                       tmp_path / "auto" / "checkpoint_last.pt", "--beam", "2", "--batch-size", "8",
                       "--gen-subset", "test", "--cpu", "--max-len-b", "6",
                       "--model-overrides", str({"attention_backend": backend})]).stdout
        return sorted(line.split("\t")[2] for line in out.splitlines() if line.startswith("H-"))

    hyps = hypotheses("auto")
    assert hyps and hyps == hypotheses("explicit")
