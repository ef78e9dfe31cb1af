"""The banded path (issue 80): a hard window (SMAN1, SMAN2) computes only the keys inside its band.

Every comparison is float64 against the explicit path (the softmax over every key written out, autograd
through it), for the output and every gradient, with padding on either side, sentences shorter than the
band, an all-padded sentence, causal windows and incremental decoding. The exactness tests take the band
wherever it computes fewer scores than the full path (``all_bands``: lengths of tens of tokens, not the
hundreds where ``auto`` takes it), and each asserts the path it took; the policy's own threshold is tested
at the studies' lengths.
"""

import logging

import pytest
import torch
from conftest import TINY_MODEL, build_fairseq_model
from test_fused_bias_grad import future_mask, padding, tokens

from man_fairseq.modules import banded_attention as banded
from man_fairseq.modules.attention_backend import BANDED, EXPLICIT, FLEX, SDPA, choose_kernel
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from man_fairseq.modules.mask_bias import StaticWindowBias

F32, F64 = torch.float32, torch.float64
C, H = 16, 4
WINDOWS = [0, 4, "sqrt_half_length"]


# ---------------------------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, path",
    [
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, hard_band=True, band_cheaper=True), BANDED),
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, requires_grad=True, dropout=True,
              hard_band=True, band_cheaper=True), BANDED),
        # flex has no CPU backward: it falls back to auto, which takes the band
        (dict(backend="flex", device_type="cpu", dtype=F32, has_mask=True, flex_supported=True, requires_grad=True,
              hard_band=True, band_cheaper=True), BANDED),
        # a band that would compute more than a fifth of the scores: every key
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, hard_band=True, band_cheaper=False), SDPA),
        # explicit stays the reference, sdpa the dispatcher, CUDA unmeasured, flex runs where it can
        (dict(backend="explicit", device_type="cpu", dtype=F32, has_mask=True, hard_band=True, band_cheaper=True),
         EXPLICIT),
        (dict(backend="sdpa", device_type="cpu", dtype=F32, has_mask=True, hard_band=True, band_cheaper=True), SDPA),
        (dict(backend="auto", device_type="cuda", dtype=F32, has_mask=True, hard_band=True, band_cheaper=True), SDPA),
        (dict(backend="flex", device_type="cpu", dtype=F64, has_mask=True, flex_supported=True, hard_band=True,
              band_cheaper=True), FLEX),
        # returned weights (or a post-softmax transform): the explicit path
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, needs_probabilities=True, hard_band=True,
              band_cheaper=True), EXPLICIT),
    ],
)
def test_kernel_policy(kwargs, path):
    choice = choose_kernel(**kwargs)
    assert choice.path == path, choice.reason
    if path == BANDED:
        assert "only the keys inside its band" in choice.reason
    if kwargs["backend"] == "auto" and kwargs["device_type"] == "cpu" and not kwargs["band_cheaper"]:
        assert "more than a fifth of the scores" in choice.reason


def test_the_band_is_taken_where_it_computes_at_most_half_the_scores():
    assert banded.band_is_cheaper(400, 400, 4)  # CNN/DM's sources: 400 x 24 of 400 x 400 scores
    assert banded.band_is_cheaper(400, 400, 14)  # SMAN1 at 400 tokens: 420 x 56
    assert not banded.band_is_cheaper(32, 32, 4)  # Multi30k, Gigaword: 32 x 24 of 32 x 32
    assert not banded.band_is_cheaper(64, 64, 4)  # 0.38 of the scores, measured slower
    assert banded.band_is_cheaper(1, 45, 4) and not banded.band_is_cheaper(1, 44, 4)  # a decoding step: 9 keys
    assert not banded.band_is_cheaper(400, 400, None)


def test_auto_takes_the_band_at_cnndm_lengths_only():
    attn = attention(4)
    for t, path in ((400, BANDED), (32, SDPA)):
        x = inputs(t, b=1)
        with torch.no_grad():
            attn(x, x, x, need_weights=False)
        assert attn.last_kernel.path == path, (t, attn.last_kernel.reason)
    assert "more than a fifth of the scores" in attn.last_kernel.reason


# ---------------------------------------------------------------------------------------------
# one attention: float64 output and every gradient equal to the explicit path
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def all_bands(monkeypatch):
    """The band wherever it computes fewer scores than the full path, so that short inputs exercise it, in
    chunks of a few blocks (as long inputs go)."""
    monkeypatch.setattr(banded, "MAX_BAND_FRACTION", 1.0)
    monkeypatch.setattr(banded, "CHUNK_ELEMENTS", 600)  # two blocks of (3, 4, 24, 4)

def attention(window, causal=False, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    attn = BiasedMultiheadAttention(C, H, self_attention=True, dropout=dropout,
                                    bias_module=StaticWindowBias(window, causal=causal))
    attn.causal_attn_mask = causal
    return attn.double().train()


def inputs(t, b=3, seed=1):
    return torch.randn(t, b, C, generator=torch.Generator().manual_seed(seed), dtype=F64)


def forward_backward(attn, backend, x, pad=None, attn_mask=None):
    """Real positions' output, input and parameter gradients of one training call, and the kernel it took."""
    attn.attention_backend = backend
    attn.zero_grad()
    x = x.detach().clone().requires_grad_()
    out, _ = attn(x, x, x, key_padding_mask=pad, attn_mask=attn_mask, need_weights=False)
    assert torch.isfinite(out).all()
    real = torch.ones_like(out) if pad is None else (~pad).t()[..., None].to(out.dtype)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    (out * weight * real).sum().backward()
    grads = {name: p.grad.clone() for name, p in attn.named_parameters()}
    grads["input"] = x.grad.clone()
    return out.detach() * real, grads, attn.last_kernel


def assert_paths_agree(attn, x, pad=None, attn_mask=None):
    ref, ref_grads, choice = forward_backward(attn, "explicit", x, pad, attn_mask)
    assert choice.path == EXPLICIT
    out, grads, choice = forward_backward(attn, "auto", x, pad, attn_mask)
    assert choice.path == BANDED, choice.reason
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
def test_encoder_window_with_padding_on_either_side(all_bands, window, left):
    # a sentence of 3 tokens: shorter than the band (b = 4, SMAN1's b = 1 .. 6 here)
    assert_paths_agree(attention(window), inputs(70), padding([70, 31, 3], left))


@pytest.mark.parametrize("window", WINDOWS)
def test_encoder_window_without_padding(all_bands, window):
    assert_paths_agree(attention(window), inputs(61, b=2))


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
def test_causal_window_with_fairseqs_future_mask(all_bands, window, left):
    assert_paths_agree(attention(window, causal=True), inputs(70), padding([70, 40, 2], left), future_mask(70))


@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
def test_an_all_padded_sentence_leaves_the_others_unchanged(all_bands, left):
    """A sentence with no real token: every one of its queries sees no key (finite, unused rows)."""
    assert_paths_agree(attention("sqrt_half_length"), inputs(64), padding([64, 0, 20], left))


def test_a_bool_attn_mask_is_read_as_masked_where_true(all_bands):
    attn = attention(4, causal=True)
    assert_paths_agree(attn, inputs(64), padding([64, 50, 9], False), torch.isneginf(future_mask(64)))


@pytest.mark.parametrize("chunk", [1, 1 << 20], ids=["block_by_block", "one_chunk"])
@pytest.mark.parametrize("t, blocks", [(20, 2), (10, 1)])
def test_gradcheck(monkeypatch, t, blocks, chunk):
    """The banded function and its own backward, every input differentiated (q, k, v), per-query half widths,
    padding and a causal mask, with one or two blocks (in one chunk, or a chunk each) and keys beyond the
    sequence on both sides."""
    monkeypatch.setattr(banded, "CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, t, 3, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    half_width = torch.tensor([[1.0], [3.0]], dtype=F64)
    pad = padding([t, t - 7], left=True)
    mask = future_mask(t)
    assert -(-t // banded.block_rows(3, t)) == blocks

    def fn(q, k, v):
        return banded.banded_attention(q, k, v, half_width, 3, 0, pad, mask, 0.5)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7)


def test_gradcheck_with_dropout_after_cached_keys_with_strided_keys(monkeypatch):
    """The banded function's own backward with attention dropout (the same draws at every call: the seed is
    set), queries after cached keys (``query_start`` > 0), three blocks in chunks of two and one, k and v
    strided as the core's projections make them, and keys beyond the sequence on the right only."""
    monkeypatch.setattr(banded, "CHUNK_ELEMENTS", 2 * 2 * (16 + 4) * 3)  # two blocks of B * H * span * D
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 34, 3, generator=g, dtype=F64, requires_grad=True)
    k, v = (torch.randn(40, 1, 2, 3, generator=g, dtype=F64).permute(1, 2, 0, 3).requires_grad_() for _ in range(2))
    assert not k.is_contiguous() and banded.block_rows(2, 34) == 16

    def fn(q, k, v):
        torch.manual_seed(0)
        return banded.banded_attention(q, k, v, 2, 2, 6, None, None, 0.5, dropout_p=0.3, training=True)

    assert not torch.allclose(fn(q, k, v), banded.banded_attention(q, k, v, 2, 2, 6, None, None, 0.5))  # drawn
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7)


def saved_bytes_beyond_inputs(fn, *inputs):
    """Bytes of the tensors autograd keeps for the backward pass of ``fn(*inputs)``, not counting those that
    share the inputs' storage (views of them), each storage once."""
    inputs_storage = {x.untyped_storage().data_ptr() for x in inputs}
    seen = set()

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in inputs_storage:
            seen.add((storage.data_ptr(), storage.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(nbytes for _, nbytes in seen)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_backward_pass_keeps_no_copy_of_q_k_or_v(dropout):
    """One banded call keeps q, k, v as given plus the band's probabilities (and the bool mask of the kept
    weights with dropout): no padded q, no windows of k and v (issue 80: they cost SMAN2 more memory than
    a plain self-attention)."""
    g = torch.Generator().manual_seed(8)
    bsz, heads, t, d, b = 2, 2, 64, 16, 4
    q, k, v = (torch.randn(bsz, heads, t, d, generator=g, requires_grad=True) for _ in range(3))
    rows = banded.block_rows(b, t)
    probs = bsz * heads * t * (rows + 2 * b)  # t is a multiple of rows: no padded row
    limit = probs * (4 + (1 if dropout else 0))

    def fn(q, k, v):
        return banded.banded_attention(q, k, v, b, b, 0, padding([64, 50], True), future_mask(t), 0.25,
                                       dropout_p=dropout, training=True)

    assert saved_bytes_beyond_inputs(fn, q, k, v) <= limit


def test_queries_after_cached_keys_with_strided_keys():
    """Queries that start after cached keys (``query_start`` > 0: several queries with an incremental cache),
    three blocks, k and v strided as the core's projections make them."""
    g = torch.Generator().manual_seed(6)
    t, s, b = 40, 50, 8  # blocks of 16 rows, windows of 16 + 16 keys
    q = torch.randn(2, 3, t, 4, generator=g, dtype=F64)
    k, v = (torch.randn(s, 2, 3, 4, generator=g, dtype=F64).permute(1, 2, 0, 3) for _ in range(2))
    assert not k.is_contiguous()
    dist = ((torch.arange(t)[:, None] + s - t) - torch.arange(s)[None, :]).abs()
    ref = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + torch.zeros(t, s, dtype=F64).masked_fill(dist > b, float("-inf")),
                        -1) @ v
    out = banded.banded_attention(q, k, v, b, b, s - t, None, None, 0.5)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)


def test_dropout_zeroes_or_rescales_each_band_weight():
    """Attention dropout on the band's weights: with the values the identity, the output is the weight matrix;
    every weight inside the band is the full path's weight, zeroed (about p of them) or divided by 1 - p, and
    every weight outside the band stays zero: the reference's distribution (independent draws per weight)."""
    g = torch.Generator().manual_seed(4)
    t, b, p = 80, 4, 0.3
    q, k = (torch.randn(1, 2, t, 8, generator=g, dtype=F64) for _ in range(2))
    v = torch.eye(t, dtype=F64).expand(1, 2, t, t)
    dist = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs()
    band_mask = torch.zeros(t, t, dtype=F64).masked_fill(dist > b, float("-inf"))
    ref = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + band_mask, -1)
    torch.manual_seed(0)
    out = banded.banded_attention(q, k, v, b, b, 0, None, None, 0.5, dropout_p=p, training=True)
    inside = (dist <= b).expand_as(out)
    assert (out[~inside] == 0).all()
    kept = out[inside] != 0
    torch.testing.assert_close(out[inside][kept], ref[inside][kept] / (1 - p), rtol=1e-12, atol=0)
    assert abs((1 - kept.double().mean()).item() - p) < 0.05, kept.double().mean()
    no_dropout = banded.banded_attention(q, k, v, b, b, 0, None, None, 0.5, dropout_p=p, training=False)
    torch.testing.assert_close(no_dropout, ref, rtol=1e-12, atol=1e-15)


def test_dropout_in_training_takes_the_band(all_bands):
    attn = attention(4, dropout=0.1)
    x = inputs(64)
    attn(x, x, x, need_weights=False)
    assert attn.last_kernel.path == BANDED


def test_returned_weights_take_the_explicit_path():
    attn = attention(4)
    x = inputs(64)
    _, weights = attn(x, x, x, need_weights=True)
    assert attn.last_kernel.path == EXPLICIT and weights.shape == (3, 64, 64)


def test_short_inputs_stay_on_the_full_kernel():
    attn = attention(4)
    x = inputs(32)
    attn(x, x, x, need_weights=False)
    assert attn.last_kernel.path == SDPA and "more than a fifth of the scores" in attn.last_kernel.reason


@pytest.mark.parametrize("window", [4, "sqrt_half_length"])
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
def test_incremental_decoding_equals_the_full_pass(all_bands, window, left):
    attn = attention(window, causal=True).eval()
    t = 40
    x, pad = inputs(t), padding([40, 25, 30], left)
    attn.attention_backend = "explicit"
    with torch.no_grad():
        full, _ = attn(x, x, x, key_padding_mask=pad, attn_mask=future_mask(t), need_weights=False)
    attn.attention_backend = "auto"
    state, steps, paths = {}, [], []
    with torch.no_grad():
        for i in range(t):
            out, _ = attn(x[i: i + 1], x[i: i + 1], x[i: i + 1], key_padding_mask=pad[:, i: i + 1],
                          incremental_state=state, need_weights=False)
            steps.append(out)
            paths.append(attn.last_kernel.path)
    assert BANDED in paths and paths[0] == SDPA  # a step with few keys computes them all
    real = ~pad.t()
    torch.testing.assert_close(torch.cat(steps)[real], full[real], rtol=1e-10, atol=1e-12)


def test_the_banded_path_is_said_once_in_the_log(all_bands, monkeypatch, caplog):
    monkeypatch.setattr(banded, "_REPORTED", set())
    attn = attention(4)
    x = inputs(64)
    with caplog.at_level(logging.INFO, logger="man_fairseq.modules.banded_attention"):
        attn(x, x, x, need_weights=False)
        attn(x, x, x, need_weights=False)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["StaticWindowBias(window=4, causal=False): attention on the banded path "
                        "(cpu: dispatcher free (no cuDNN kernel); a hard window: only the keys inside its band)"]


# ---------------------------------------------------------------------------------------------
# whole MAN models built by fairseq: sman1 / sman2 sublayers, both backends
# ---------------------------------------------------------------------------------------------

SMAN = ["--encoder-sublayers", "sman1,sman2,ffn", "--decoder-sublayers", "sman2,sman1,cross,ffn",
        "--static-mask-window", "3"]


def man_model(backend):
    torch.manual_seed(0)
    model, task, args = build_fairseq_model(
        "transformer_man_base", TINY_MODEL + ["--dropout", "0", "--attention-backend", backend] + SMAN, dict_size=40)
    assert args.attention_backend == backend
    return model.double().train(), task


def window_attentions(model):
    return [m for m in model.modules() if isinstance(m, BiasedMultiheadAttention)
            and isinstance(m.bias_module, StaticWindowBias)]


def test_a_man_model_with_sman_sublayers_trains_the_same_on_both_backends(all_bands):
    results = {}
    for backend in ("explicit", "auto"):
        model, task = man_model(backend)
        src = tokens(task, [60, 23, 44], left=True, seed=1)
        prev = tokens(task, [64, 64, 64], left=False, seed=2)
        model.zero_grad()
        out = model(src, (src != task.source_dictionary.pad()).sum(1), prev)[0]
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
        (out * weight).sum().backward()
        results[backend] = out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        paths = {m.last_kernel.path for m in window_attentions(model)}
        assert paths == ({BANDED} if backend == "auto" else {EXPLICIT}), paths
    (ref, ref_grads), (out, grads) = results["explicit"], results["auto"]
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    assert set(grads) == set(ref_grads)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-9, atol=1e-10, msg=n)


def test_a_man_model_decodes_step_by_step_as_its_full_pass(all_bands):
    model, task = man_model("auto")
    ref_model, _ = man_model("explicit")
    model.eval()
    ref_model.eval()
    src = tokens(task, [30, 24], left=True, seed=3)
    prev = tokens(task, [40, 40], left=False, seed=4)
    with torch.no_grad():
        full = ref_model.decoder(prev, encoder_out=ref_model.encoder(src, torch.tensor([30, 24])))[0]
        enc = model.encoder(src, torch.tensor([30, 24]))
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0])
    assert BANDED in {m.last_kernel.path for m in window_attentions(model.decoder)}
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-9, atol=1e-9)
