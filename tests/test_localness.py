"""Localness (Gaussian bias, docs/localness.md) and relative position representations (Shaw et al. 2018)."""

import math

import pytest
import torch

import torch.nn.functional as F
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, run_cli
from man_fairseq.modules import localness_extension
from man_fairseq.modules.attention_backend import EXPLICIT, EXTENDED, SDPA
from man_fairseq.modules.biased_attention import AttentionContext, BiasedMultiheadAttention
from man_fairseq.modules.localness import WINDOW_STRATEGIES, LocalnessBias, gaussian_bias
from man_fairseq.modules.relative_position import RelativePositionMultiheadAttention

DIM, HEADS = 8, 2
DT = torch.float64


# ----------------------------------------------------------------------------- helpers

def padding_mask(lengths, total, left):
    """(B, total) bool, True at pads; pads on the left (fairseq sources) or the right."""
    rows = []
    for n in lengths:
        row = [True] * (total - n) + [False] * n if left else [False] * n + [True] * (total - n)
        rows.append(row)
    return torch.tensor(rows)


def context(q, k, kpm=None, query_start=0, self_attention=True):
    """AttentionContext from (B,H,T,D) q and (B,H,S,D) k."""
    b, h, t, d = q.shape
    return AttentionContext(
        query=q.permute(2, 0, 1, 3).reshape(t, b, h * d), key=None, q=q, k=k,
        key_padding_mask=kpm, query_start=query_start, incremental_state=None,
        self_attention=self_attention,
    )


def randomise(module, seed=0):
    """Parameters far from their (partly zero) initialisation, so every term matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def moderate_windows(module, scale=0.3):
    """Localness parameters of ``module`` scaled down after :func:`randomise`: N(0, 1) vectors on
    tanh features put sigmoid(z) near 1e-4, windows the extended path declines (its error
    bound, localness_extension.RHO_MAX); 0.3 * N(0, 1) keeps them random but moderate."""
    with torch.no_grad():
        for bias in [m for m in module.modules() if isinstance(m, LocalnessBias)]:
            for p in bias.parameters():
                p.mul_(scale)
    return module


def naive_localness_bias(module, q, k, kpm, causal, query_start=0):
    """The docs/localness.md formula with python loops (float64): -(j-P)^2/(2 sigma^2), sigma = D/2."""
    b, h, t, d = q.shape
    s_len = k.size(2)
    w_p = module.centre_proj.weight
    u = module.query_vectors
    out = torch.zeros(b, h, t, s_len, dtype=DT)
    for bi in range(b):
        real = [s for s in range(s_len) if kpm is None or not kpm[bi, s]]
        first = real[0]
        q_full = q[bi].permute(1, 0, 2).reshape(t, h * d)  # (T, d) before the head split
        k_full = k[bi].permute(1, 0, 2).reshape(s_len, h * d)
        for ti in range(t):
            key_idx = query_start + ti
            visible = [s for s in real if s <= key_idx] if causal else real
            length = max(len(visible), 1)
            hidden = torch.tanh(w_p @ q_full[ti])
            for m in range(h):
                centre = length * torch.sigmoid(u[m] @ hidden)
                if module.window == "fixed":
                    window = torch.tensor(module.fixed_window, dtype=DT)
                elif module.window == "query":
                    window = length * torch.sigmoid(u[h + m] @ hidden)
                elif module.window == "head":
                    window = module.head_window_max * torch.sigmoid(module.head_window_logits[m])
                else:
                    mean = torch.stack([k_full[s] for s in visible]).mean(0) if visible else torch.zeros(h * d, dtype=DT)
                    z = module.window_vectors[m] @ torch.tanh(module.window_proj.weight @ mean)
                    window = length * torch.sigmoid(z)
                sigma = window / 2
                for s in range(s_len):
                    j = s - first  # position counted from the first real token
                    out[bi, m, ti, s] = -((j - centre) ** 2) / (2 * sigma ** 2)
    return out


def naive_attention(q, k, v, bias, kpm, causal, query_start=0, rel=None):
    """softmax(q·k/sqrt(d) + bias [+ q·a^K/sqrt(d)]) (v [+ a^V]) with loops over (t, s)."""
    b, h, t, d = q.shape
    s_len = k.size(2)
    out = torch.zeros(b, h, t, d, dtype=DT)
    for bi in range(b):
        for m in range(h):
            for ti in range(t):
                logits, values = [], []
                for s in range(s_len):
                    if (kpm is not None and kpm[bi, s]) or (causal and s > query_start + ti):
                        continue
                    e = q[bi, m, ti] @ k[bi, m, s] / math.sqrt(d)
                    val = v[bi, m, s]
                    if bias is not None:
                        e = e + bias[bi, m, ti, s]
                    if rel is not None:
                        a_k, a_v, clip = rel
                        r = max(-clip, min(clip, s - (query_start + ti))) + clip
                        e = e + q[bi, m, ti] @ a_k[r] / math.sqrt(d)
                        val = val + a_v[r]
                    logits.append(e)
                    values.append(val)
                if not logits:  # a left-padded causal pad query sees no key: its row is unused
                    continue
                p = torch.softmax(torch.stack(logits), 0)
                out[bi, m, ti] = (p[:, None] * torch.stack(values)).sum(0)
    return out


def heads_of(attn, x):
    """(L,B,C) -> projected (B,H,L,D) q, k, v of a fairseq attention (unscaled)."""
    return tuple(attn._shape(proj(x), x.size(1)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))


# ----------------------------------------------------------------------------- the bias

@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("left", [False, True])
def test_bias_equals_naive_formula(window, causal, left):
    torch.manual_seed(0)
    module = randomise(LocalnessBias(DIM, HEADS, window=window, causal=causal, fixed_window=3.0,
                                     head_window_max=7.0).double())
    b, t = 3, 5
    q = torch.randn(b, HEADS, t, DIM // HEADS, dtype=DT)
    k = torch.randn(b, HEADS, t, DIM // HEADS, dtype=DT)
    kpm = padding_mask([5, 3, 1], t, left)
    got = module(context(q, k, kpm))
    want = naive_localness_bias(module, q, k, kpm, causal)
    real = ~kpm[:, None, None, :].expand_as(got)
    torch.testing.assert_close(got[real], want[real])


def test_causal_incremental_rows_equal_full_rows():
    """A decoder step (T=1, query_start=S-1) gets the same bias row as the full pass."""
    torch.manual_seed(1)
    for window in WINDOW_STRATEGIES:
        module = randomise(LocalnessBias(DIM, HEADS, window=window, causal=True).double())
        q = torch.randn(2, HEADS, 6, DIM // HEADS, dtype=DT)
        k = torch.randn(2, HEADS, 6, DIM // HEADS, dtype=DT)
        full = module(context(q, k))
        for t in range(6):
            step = module(context(q[:, :, t:t + 1], k[:, :, : t + 1], query_start=t))
            torch.testing.assert_close(step, full[:, :, t:t + 1, : t + 1])


def test_gaussian_bias_function_gradcheck():
    torch.manual_seed(2)
    centre = torch.rand(2, 3, 4, 1, dtype=DT, requires_grad=True) * 5
    sigma_query = (torch.rand(2, 3, 4, 1, dtype=DT) + 0.5).requires_grad_()
    sigma_head = (torch.rand(1, 3, 1, 1, dtype=DT) + 0.5).requires_grad_()
    pos = torch.arange(6, dtype=DT).view(1, 1, 1, 6)
    for sigma in (sigma_query, sigma_head):
        assert torch.autograd.gradcheck(gaussian_bias, (centre, sigma, pos))
    # equals autograd on the plain expression, incl. broadcast reduction of the head sigma
    g = torch.randn(2, 3, 4, 6, dtype=DT)
    for sigma in (sigma_query, sigma_head):
        fused = torch.autograd.grad((gaussian_bias(centre, sigma, pos) * g).sum(), (centre, sigma))
        plain = torch.autograd.grad((-((pos - centre) ** 2) / (2 * sigma ** 2) * g).sum(), (centre, sigma))
        for a, b in zip(fused, plain):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
def test_gradcheck_new_parameters(window):
    """Gradients of every new parameter (and of q, k) through the bias module."""
    torch.manual_seed(3)
    module = randomise(LocalnessBias(4, 2, window=window, causal=window == "layer").double())
    names = [n for n, _ in module.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in module.parameters())
    q = torch.randn(2, 2, 3, 2, dtype=DT, requires_grad=True)
    k = torch.randn(2, 2, 3, 2, dtype=DT, requires_grad=True)
    kpm = padding_mask([3, 2], 3, left=True)

    def bias(q, k, *ps):
        out = torch.func.functional_call(module, dict(zip(names, ps)), (context(q, k, kpm),))
        return out.masked_fill(kpm[:, None, None, :], 0.0)

    assert torch.autograd.gradcheck(bias, (q, k) + params)


# ----------------------------------------------------------------------------- attention with the bias

def localness_attention(window, causal=False, rel=False, **kw):
    cls = RelativePositionMultiheadAttention if rel else BiasedMultiheadAttention
    extra = {"max_relative_position": 2} if rel else {}
    bias = LocalnessBias(DIM, HEADS, window=window, causal=causal, **kw) if window else None
    attn = cls(DIM, HEADS, self_attention=True, bias_module=bias, **extra).double()
    return moderate_windows(randomise(attn)).eval()


@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["extended", "explicit"])
def test_attention_with_localness_equals_naive(window, left, need_weights):
    torch.manual_seed(4)
    attn = localness_attention(window)
    x = torch.randn(5, 2, DIM, dtype=DT)
    kpm = padding_mask([5, 3], 5, left=left)
    out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=need_weights)
    assert attn.last_kernel.path == (EXPLICIT if need_weights else EXTENDED), attn.last_kernel.reason
    q, k, v = heads_of(attn, x)
    bias = naive_localness_bias(attn.bias_module, q, k, kpm, causal=False)
    heads_out = naive_attention(q, k, v, bias, kpm, causal=False)
    want = attn.out_proj(heads_out.permute(2, 0, 1, 3).reshape(5, 2, DIM))
    real = ~kpm.t()
    torch.testing.assert_close(out[real], want[real])


@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["extended", "explicit"])
def test_cross_attention_localness_equals_naive(window, left, need_weights):
    """Encoder-decoder attention (--localness-attention-types cross): 4 target queries over 6
    source keys of another width; positions and the length D count real source tokens."""
    torch.manual_seed(12)
    kdim = 6
    attn = BiasedMultiheadAttention(DIM, HEADS, kdim=kdim, vdim=kdim, encoder_decoder_attention=True,
                                    bias_module=LocalnessBias(DIM, HEADS, window=window, causal=False,
                                                              fixed_window=3.0, head_window_max=7.0))
    attn = moderate_windows(randomise(attn.double())).eval()
    query = torch.randn(4, 2, DIM, dtype=DT)
    src = torch.randn(6, 2, kdim, dtype=DT)
    kpm = padding_mask([6, 4], 6, left=left)
    out, _ = attn(query, src, src, key_padding_mask=kpm, need_weights=need_weights, static_kv=True)
    assert attn.last_kernel.path == (EXPLICIT if need_weights else EXTENDED), attn.last_kernel.reason
    q = attn._shape(attn.q_proj(query), 2)
    k, v = attn._shape(attn.k_proj(src), 2), attn._shape(attn.v_proj(src), 2)
    bias = naive_localness_bias(attn.bias_module, q, k, kpm, causal=False)
    want = attn.out_proj(naive_attention(q, k, v, bias, kpm, causal=False).permute(2, 0, 1, 3).reshape(4, 2, DIM))
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
def test_fused_and_explicit_paths_give_the_same_gradients(window):
    """The default (extended q/k) path must back-propagate into the localness parameters."""
    torch.manual_seed(11)
    attn = localness_attention(window).train()
    x = torch.randn(5, 2, DIM, dtype=DT)
    kpm = padding_mask([5, 3], 5, left=True)
    grads = []
    for need_weights in (False, True):  # fused kernel / explicit softmax
        attn.zero_grad()
        out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=need_weights)
        out.masked_fill(kpm.t()[..., None], 0.0).pow(2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in attn.bias_module.named_parameters()})
    assert grads[0] and all(g.abs().sum() > 0 for g in grads[0].values())
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name])


def test_zero_bias_limit_is_plain_attention():
    """A fixed window much wider than the sentence makes the Gaussian flat: plain attention."""
    torch.manual_seed(5)
    attn = localness_attention("fixed", fixed_window=1e7)
    plain = BiasedMultiheadAttention(DIM, HEADS, self_attention=True).double().eval()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("bias_module")})
    x = torch.randn(6, 3, DIM, dtype=DT)
    kpm = padding_mask([6, 4, 2], 6, left=False)
    got, _ = attn(x, x, x, key_padding_mask=kpm)
    want, _ = plain(x, x, x, key_padding_mask=kpm)
    real = ~kpm.t()
    torch.testing.assert_close(got[real], want[real])
    # and a narrow window does change it (the comparison above can fail)
    attn.bias_module.fixed_window = 1.0
    narrow, _ = attn(x, x, x, key_padding_mask=kpm)
    assert (narrow[real] - want[real]).abs().max() > 1e-3


@pytest.mark.parametrize("window, rel", [(w, r) for w in WINDOW_STRATEGIES for r in (False, True)] + [(None, True)])
def test_left_and_right_padding_agree(window, rel):
    torch.manual_seed(6)
    attn = localness_attention(window, rel=rel)
    lengths, total = [6, 4, 2], 6
    x_right = torch.randn(total, 3, DIM, dtype=DT)
    x_left = torch.zeros_like(x_right)
    for b, n in enumerate(lengths):
        x_left[total - n:, b] = x_right[:n, b]
    right, _ = attn(x_right, x_right, x_right, key_padding_mask=padding_mask(lengths, total, False))
    left, _ = attn(x_left, x_left, x_left, key_padding_mask=padding_mask(lengths, total, True))
    for b, n in enumerate(lengths):
        torch.testing.assert_close(left[total - n:, b], right[:n, b])


# ----------------------------------------------------------------------------- the bias as extra q/k dimensions

@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
@pytest.mark.parametrize("causal,left", [(False, True), (True, False), (True, True)],
                         ids=["left_pad", "causal_right_pad", "causal_left_pad"])
def test_extended_path_equals_naive_and_explicit(window, causal, left):
    """Self-attention, encoder and decoder (causal mask + padding), on the extended path: equal to
    the naive formula and to --attention-backend explicit, values and gradients (float64)."""
    torch.manual_seed(14)
    attn = localness_attention(window, causal=causal, fixed_window=3.0, head_window_max=7.0).train()
    t = 6
    x = torch.randn(t, 2, DIM, dtype=DT)
    kpm = padding_mask([6, 4], t, left=left)
    attn_mask = torch.triu(torch.full((t, t), float("-inf"), dtype=DT), 1) if causal else None
    real = ~kpm.t()
    outputs, grads = {}, {}
    for backend in ("auto", "explicit"):
        attn.attention_backend = backend
        attn.zero_grad()
        out, _ = attn(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=False)
        assert attn.last_kernel.path == (EXTENDED if backend == "auto" else EXPLICIT), attn.last_kernel.reason
        out[real].pow(2).sum().backward()
        outputs[backend] = out[real]
        grads[backend] = {n: p.grad.clone() for n, p in attn.named_parameters()}
    q, k, v = heads_of(attn, x)
    bias = naive_localness_bias(attn.bias_module, q, k, kpm, causal)
    want = attn.out_proj(naive_attention(q, k, v, bias, kpm, causal).permute(2, 0, 1, 3).reshape(t, 2, DIM))
    torch.testing.assert_close(outputs["auto"], want[real])
    torch.testing.assert_close(outputs["auto"], outputs["explicit"])
    if causal and left:
        # a left-padded causal pad query sees only pad keys: the explicit softmax's row is NaN and
        # so are its gradients (0 * NaN), the fused kernel's row is finite; fairseq right-pads
        # the decoder's input, so only this test builds such a row
        assert any(g.isnan().any() for g in grads["explicit"].values())
        assert not any(g.isnan().any() for g in grads["auto"].values())
        return
    for name, grad in grads["explicit"].items():
        torch.testing.assert_close(grads["auto"][name], grad, msg=name)


@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
def test_extended_path_gradcheck(window):
    """gradcheck of the extended path's output w.r.t. the input and every localness parameter."""
    torch.manual_seed(15)
    attn = BiasedMultiheadAttention(4, 2, self_attention=True,
                                    bias_module=LocalnessBias(4, 2, window=window, causal=window == "layer"))
    attn = moderate_windows(randomise(attn.double())).eval()
    names = [n for n, _ in attn.named_parameters() if n.startswith("bias_module.")]
    params = tuple(dict(attn.named_parameters())[n].detach().clone().requires_grad_() for n in names)
    x = torch.randn(4, 2, 4, dtype=DT, requires_grad=True)
    kpm = padding_mask([4, 3], 4, left=True)
    real = ~kpm.t()

    def f(x, *ps):
        out, _ = torch.func.functional_call(attn, dict(zip(names, ps)), (x, x, x),
                                            {"key_padding_mask": kpm, "need_weights": False})
        return out[real]

    f(x, *params)
    assert attn.last_kernel.path == EXTENDED
    assert torch.autograd.gradcheck(f, (x,) + params)


def test_block_form_is_the_gaussian_bias():
    """q_extra · k_extra = -(s - P)^2 / (2 sigma^2) for every block count (float64)."""
    torch.manual_seed(16)
    centre = torch.rand(2, 3, 7, 1, dtype=DT) * 9
    sigma = torch.rand(2, 3, 7, 1, dtype=DT) + 0.2
    positions = torch.arange(9, dtype=DT)[None]
    want = -((positions[:, None, None, :] - centre) / sigma) ** 2 / 2
    for blocks in (1, 2, 3, 9):
        q_extra, k_extra = localness_extension.gaussian_dims(centre, sigma, positions, 9, blocks)
        assert q_extra.shape[-1] == 2 * blocks + 1
        torch.testing.assert_close(q_extra @ k_extra[:, None].transpose(-1, -2), want.expand(2, 3, 7, 9))


def float32_output_errors(length, window_min, blocks=None, heads=2, dim=64, seed=0, window_max=None):
    """Largest |output - float64 output| of one attention with the Gaussian bias (unit-variance q, k,
    v; centres uniform over the sentence, windows uniform in [window_min, window_max or 0.9 L], float32 P and
    sigma): the explicit float32 bias, the naive extension [a, b]·[s^2, s] and the block form."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, length, dim, generator=g) for _ in range(3))
    centre = torch.rand(1, heads, length, 1, generator=g) * length
    window_max = 0.9 * length if window_max is None else window_max
    sigma = (window_min + torch.rand(1, heads, length, 1, generator=g) * (window_max - window_min)) / 2
    positions = torch.arange(length, dtype=torch.float32)
    exact = -((positions.double() - centre.double()) / sigma.double()) ** 2 / 2
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=exact)

    def error(out):
        return (out.double() - want).abs().max().item()

    def extended(q_extra, k_extra):
        extra = q_extra.size(-1)
        return F.scaled_dot_product_attention(
            torch.cat([q * dim ** -0.5, q_extra], -1), torch.cat([k, k_extra.expand(1, heads, length, extra)], -1),
            torch.cat([v, v.new_zeros(1, heads, length, extra)], -1), scale=1.0)[..., :dim]

    a = -0.5 / sigma ** 2
    middle = (length - 1) / 2  # positions centred on the sentence
    errors = {
        "explicit": error(F.scaled_dot_product_attention(q, k, v, attn_mask=-((positions - centre) / sigma) ** 2 / 2)),
        "naive": error(extended(torch.cat([a, -2 * a * centre], -1), torch.stack([positions ** 2, positions], -1))),
        "naive, centred": error(extended(torch.cat([a, -2 * a * (centre - middle)], -1),
                                         torch.stack([(positions - middle) ** 2, positions - middle], -1))),
    }
    blocks = blocks or localness_extension.block_count(sigma, length)
    errors["block count"] = blocks
    if blocks is not None:
        q_extra, k_extra = localness_extension.gaussian_dims(centre, sigma, positions[None], length, blocks)
        errors["blocks"] = error(extended(q_extra, k_extra[:, None]))
    return errors


@pytest.mark.parametrize("length, window_min", [(400, 1.0), (1000, 2.0)])
def test_float32_block_form_error_bound(length, window_min):
    """docs/localness.md's bound: at the rule's block count the block form stays within 2e-5 of
    float64 (measured there: <= 5.5e-6), where the naive extension is off by more than 1e-4."""
    errors = float32_output_errors(length, window_min)
    assert errors["explicit"] < 2e-6, errors
    assert errors["naive"] > 1e-4, errors
    assert errors["blocks"] < 2e-5, errors


def test_float32_block_form_error_bound_at_the_rule_limit():
    """Every query at the narrowest window the rule allows for its block width (w <= 32 sigma):
    6.7e-6 here, 1.4e-5 over 8 heads (docs/localness.md)."""
    errors = float32_output_errors(400, 2.0, window_max=2.0, seed=1)  # sigma = 1 everywhere
    assert errors["block count"] == math.ceil(400 / localness_extension.RHO_MAX)
    assert errors["blocks"] < 4e-5, errors


def test_narrow_windows_on_long_sentences_fall_back_to_the_explicit_bias():
    """The rule: more than MAX_BLOCKS blocks of width <= RHO_MAX * sigma_min -> the bias as a float mask."""
    many = localness_extension.MAX_BLOCKS * localness_extension.RHO_MAX
    assert localness_extension.block_count(torch.tensor([1.0]), int(many)) == localness_extension.MAX_BLOCKS
    assert localness_extension.block_count(torch.tensor([1.0]), int(many) + 1) is None
    assert localness_extension.block_count(torch.tensor([0.0]), 4) is None
    # a pad query's window does not count
    sigma, real = torch.tensor([[1e-6], [1.0]]), torch.tensor([[False], [True]])
    assert localness_extension.block_count(sigma, 10, real) == 1
    assert localness_extension.block_count(sigma, 10) is None
    # through the core: a fixed window this narrow on 20 keys needs 20 / (32 * 0.001) blocks
    torch.manual_seed(17)
    attn = localness_attention("fixed", fixed_window=0.002)
    x = torch.randn(20, 2, DIM, dtype=DT)
    out, _ = attn(x, x, x, need_weights=False)
    assert attn.last_kernel.path == SDPA and "declined" in attn.last_kernel.reason
    attn.attention_backend = "explicit"
    torch.testing.assert_close(out, attn(x, x, x, need_weights=False)[0])


def test_float32_extended_path_of_a_layer_equals_explicit():
    """A float32 localness attention at 400 tokens (default options): the two paths within the bound."""
    torch.manual_seed(18)
    attn = BiasedMultiheadAttention(64, 4, self_attention=True, bias_module=LocalnessBias(64, 4)).eval()
    x = torch.randn(400, 1, 64)
    with torch.no_grad():
        got, _ = attn(x, x, x, need_weights=False)
        assert attn.last_kernel.path == EXTENDED
        attn.attention_backend = "explicit"
        want, _ = attn(x, x, x, need_weights=False)
    assert (got - want).abs().max() < 2e-5


# ----------------------------------------------------------------------------- relative positions

@pytest.mark.parametrize("window", [None, "query"])
@pytest.mark.parametrize("causal,left", [(False, True), (False, False), (True, False)],
                         ids=["left_pad", "right_pad", "causal_right_pad"])
def test_relative_position_attention_equals_naive(window, causal, left):
    torch.manual_seed(7)
    attn = localness_attention(window, causal=causal, rel=True)
    t = 6
    x = torch.randn(t, 2, DIM, dtype=DT)
    kpm = padding_mask([6, 4], t, left=left)
    attn_mask = torch.triu(torch.full((t, t), float("-inf"), dtype=DT), 1) if causal else None
    out, weights = attn(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask)
    q, k, v = heads_of(attn, x)
    bias = naive_localness_bias(attn.bias_module, q, k, kpm, causal) if window else None
    rel = (attn.relative_keys, attn.relative_values, attn.max_relative_position)
    heads_out = naive_attention(q, k, v, bias, kpm, causal, rel=rel)
    want = attn.out_proj(heads_out.permute(2, 0, 1, 3).reshape(t, 2, DIM))
    real = ~kpm.t()
    torch.testing.assert_close(out[real], want[real])
    # the value-side term really contributes (removing it changes the output)
    with torch.no_grad():
        attn.relative_values.zero_()
    no_values, _ = attn(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask)
    assert (no_values[real] - out[real]).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_relative_key_and_value_embeddings(causal):
    """Gradients of a^K, a^V (Shaw et al.) and of the input, padded keys, clipping exercised."""
    torch.manual_seed(13)
    attn = RelativePositionMultiheadAttention(4, 2, self_attention=True, max_relative_position=1).double()
    attn = randomise(attn).eval()
    t = 4
    x = torch.randn(t, 2, 4, dtype=DT, requires_grad=True)
    kpm = padding_mask([4, 3], t, left=not causal)
    attn_mask = torch.triu(torch.full((t, t), float("-inf"), dtype=DT), 1) if causal else None
    names = ["relative_keys", "relative_values"]
    params = tuple(getattr(attn, n).detach().clone().requires_grad_() for n in names)
    real = ~kpm.t()

    def f(x, a_k, a_v):
        out, _ = torch.func.functional_call(attn, dict(zip(names, (a_k, a_v))), (x, x, x),
                                            {"key_padding_mask": kpm, "attn_mask": attn_mask})
        return out[real]

    assert torch.autograd.gradcheck(f, (x,) + params)


def test_relative_position_options_are_validated():
    with pytest.raises(ValueError, match="self-attention only"):
        RelativePositionMultiheadAttention(DIM, HEADS, kdim=DIM, vdim=DIM, encoder_decoder_attention=True)
    with pytest.raises(ValueError, match="max_relative_position"):
        RelativePositionMultiheadAttention(DIM, HEADS, max_relative_position=0, self_attention=True)
    with pytest.raises(ValueError, match="unknown localness window"):
        LocalnessBias(DIM, HEADS, window="sentence")


# ----------------------------------------------------------------------------- whole model

def tiny_dictionary_dir(tmp_path, size=30):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    for lang in ("src", "tgt"):
        d.save(str(tmp_path / f"dict.{lang}.txt"))
    return tmp_path


def build_model(data_dir, arch, *extra):
    from fairseq import options, tasks

    import man_fairseq  # noqa: F401  (registers the archs)

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data_dir), "--user-dir", USER_DIR, "--task", "translation", "-s", "src", "-t", "tgt",
        "--arch", arch, "--share-all-embeddings", *map(str, extra),
    ])
    task = tasks.setup_task(args)
    return task.build_model(args), task


def test_parameter_increase_at_base_width(tmp_path):
    """Query-specific localness on the 3 lower encoder layers: 0.7–0.9M over transformer_wmt_en_de
    with a 37,000-symbol shared vocabulary (paper: 88.0M -> 88.8M)."""
    data = tiny_dictionary_dir(tmp_path, size=37000 - 4)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    base, _ = build_model(data, "transformer_wmt_en_de")
    loc, _ = build_model(data, "transformer_localness_base")
    increase = count(loc) - count(base)
    assert 0.7e6 <= increase <= 0.9e6, increase
    assert increase == 3 * (512 * 512 + 2 * 8 * 512)


def localness_modules(model):
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, LocalnessBias):
            found[name] = module
    return found


def test_options_reach_the_modules(tmp_path):
    data = tiny_dictionary_dir(tmp_path)
    tiny = TINY_MODEL + ["--encoder-layers", "3", "--decoder-layers", "3"]
    model, _ = build_model(data, "transformer_localness_small", *tiny)
    assert sorted(localness_modules(model)) == [f"encoder.layers.{i}.self_attn.bias_module" for i in range(3)]
    assert all(m.window == "query" and not m.causal for m in localness_modules(model).values())
    assert not any(isinstance(m, RelativePositionMultiheadAttention) for m in model.modules())

    model, _ = build_model(
        data, "transformer_localness_small", *tiny, "--localness-window", "fixed",
        "--localness-fixed-window", "7", "--localness-layers", "1",
        "--localness-attention-types", "encoder_self,decoder_self,cross",
    )
    mods = localness_modules(model)
    assert sorted(mods) == sorted([
        "encoder.layers.1.self_attn.bias_module", "decoder.layers.1.self_attn.bias_module",
        "decoder.layers.1.encoder_attn.bias_module",
    ])
    assert {m.window for m in mods.values()} == {"fixed"} and {m.fixed_window for m in mods.values()} == {7.0}
    assert mods["decoder.layers.1.self_attn.bias_module"].causal
    assert not mods["decoder.layers.1.encoder_attn.bias_module"].causal

    model, _ = build_model(
        data, "transformer_localness_small", *tiny, "--localness-window", "head",
        "--localness-head-window-max", "20", "--localness-layers", "all",
        "--relative-positions", "--max-relative-position", "5",
        "--relative-position-attention-types", "decoder_self",
    )
    mods = localness_modules(model)
    assert len(mods) == 3 and {m.head_window_max for m in mods.values()} == {20.0}
    assert {m.window for m in mods.values()} == {"head"}
    rel = [n for n, m in model.named_modules() if isinstance(m, RelativePositionMultiheadAttention)]
    assert rel == [f"decoder.layers.{i}.self_attn" for i in range(3)]
    assert model.decoder.layers[0].self_attn.max_relative_position == 5

    model, _ = build_model(data, "transformer_localness_small", *tiny, "--localness-window", "layer",
                           "--localness-layers", "", "--relative-positions")
    assert not localness_modules(model)
    rel = [n for n, m in model.named_modules() if isinstance(m, RelativePositionMultiheadAttention)]
    assert len(rel) == 6
    # the model's bias module is the one the naive-formula tests check: layer strategy has W_d
    model, _ = build_model(data, "transformer_localness_small", *tiny, "--localness-window", "layer")
    assert all(hasattr(m, "window_proj") for m in localness_modules(model).values())


@pytest.mark.parametrize("extra, message", [
    (["--localness-window", "sentence"], "invalid choice"),
    (["--localness-attention-types", "encoder_self,decoder"], "unknown attention type"),
    (["--relative-positions", "--relative-position-attention-types", "cross"], "unknown attention type"),
    (["--localness-layers", "5"], "out of range"),
    (["--localness-layers", "one"], "comma-separated"),
    (["--localness-fixed-window", "0"], "must be > 0"),
    (["--max-relative-position", "0", "--relative-positions"], "must be >= 1"),
])
def test_bad_option_values_fail_at_start_up(tmp_path, extra, message, capsys):
    data = tiny_dictionary_dir(tmp_path)
    with pytest.raises((ValueError, SystemExit)) as info:
        # valid layers for the 2-layer TINY_MODEL unless the case overrides them
        build_model(data, "transformer_localness_small", *TINY_MODEL, "--localness-layers", "0,1", *extra)
    text = str(info.value) + capsys.readouterr().err
    assert message in text


@pytest.mark.parametrize("rel", [True, False], ids=["relative_positions", "extended"])
def test_incremental_decoding_equals_full_forward_with_beam_reorder(tmp_path, rel):
    """Localness on decoder self- and cross-attention (each strategy), with relative positions
    (self-attention explicit) or without (every localness attention on the extended path)."""
    data = tiny_dictionary_dir(tmp_path)
    torch.manual_seed(8)
    for window in WINDOW_STRATEGIES:
        model, task = build_model(
            data, "transformer_localness_small", *TINY_MODEL, "--localness-window", window,
            "--localness-layers", "all", "--localness-attention-types", "encoder_self,decoder_self,cross",
            *(["--relative-positions"] if rel else []), "--dropout", "0", "--attention-dropout", "0",
        )
        model = moderate_windows(randomise(model.double(), seed=9), 0.1).eval()  # random u, z: non-trivial windows
        pad = task.source_dictionary.pad()
        # 2 sentences x 2 beams; the second sentence left-padded, as fairseq builds sources
        src = torch.randint(4, 30, (2, 7))
        src[1, :2] = pad
        src = src.repeat_interleave(2, 0)
        src_lengths = (src != pad).sum(1)
        prev = torch.randint(4, 30, (4, 6))
        prev[:, 0] = task.target_dictionary.eos()
        enc = model.encoder(src, src_lengths=src_lengths)
        full, _ = model.decoder(prev, encoder_out=enc)

        # incremental with a beam reorder after step 3 as beam search makes them: within each
        # sentence, hypotheses are copied/swapped (fairseq keeps the cross-attention cache then)
        order = torch.tensor([1, 1, 3, 2])
        state = {}
        steps = []
        for t in range(6):
            if t == 3:
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                prev = prev[order]
                full = full[order]
                steps = [s[order] for s in steps]
            out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            steps.append(out)
        torch.testing.assert_close(torch.cat(steps, 1), full, msg=f"window={window}")
        self_attention = model.decoder.layers[0].self_attn
        assert self_attention.last_kernel.path == (EXPLICIT if rel else EXTENDED), self_attention.last_kernel.reason


# ----------------------------------------------------------------------------- end to end

CLI_CASES = {  # one training run per window strategy, together covering every attention type
    "fixed": ["--localness-attention-types", "encoder_self,cross"],
    "layer": ["--localness-attention-types", "encoder_self,decoder_self"],
    "query": ["--relative-positions"],
    "head": ["--localness-attention-types", "decoder_self"],
}


def run_parallel(commands):
    """The fairseq commands at once (each one thread): their start-up dominates, not compute."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(commands)) as pool:
        futures = [pool.submit(run_cli, cmd, env={"OMP_NUM_THREADS": "1"}) for cmd in commands]
        return [f.result() for f in futures]


def test_cli_train_generate_each_strategy_and_dump_windows(tmp_path, toy_raw, toy_data_bin):
    saves = {w: tmp_path / f"ckpt_{w}" for w in CLI_CASES}
    run_parallel([[
        "fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_localness_small",
        *TINY_MODEL, *TINY_TRAIN, "--localness-window", w, "--localness-layers", "0,1", *extra,
        "--max-update", "3", "--save-dir", saves[w], "--share-all-embeddings",
    ] for w, extra in CLI_CASES.items()])

    windows_dir = tmp_path / "windows"
    generate = [[
        "fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path", saves[w] / "checkpoint_last.pt",
        "--beam", "3", "--batch-size", "8", "--max-len-b", "12",
        "--cpu", "--gen-subset", "test",
    ] for w in CLI_CASES]
    # the same checkpoints decoded on the reference path (the default runs the extended q/k path)
    explicit = [cmd + ["--model-overrides", "{'attention_backend': 'explicit'}"] for cmd in generate]
    dump = [  # the window dump command on the layer-strategy model (encoder and decoder self)
        "python", "-m", "man_recipes.cli.localness_windows", toy_data_bin, "--user-dir", USER_DIR,
        "--path", saves["layer"] / "checkpoint_last.pt", "--gen-subset", "valid", "--batch-size", "16",
        "--cpu", "--windows-output-dir", windows_dir,
    ]
    *generated, dumped = run_parallel(generate + explicit + [dump])
    generated, generated_explicit = generated[: len(CLI_CASES)], generated[len(CLI_CASES):]

    num_test = len((toy_raw / "test.src").read_text().splitlines())
    for window, gen, ref in zip(CLI_CASES, generated, generated_explicit):
        hyps = sorted(line.split("\t") for line in gen.stdout.splitlines() if line.startswith("H-"))
        assert len(hyps) == num_test, (window, gen.stdout[-2000:])
        # identical hypotheses; scores (printed to 4 decimals) within float32 rounding
        ref_hyps = sorted(line.split("\t") for line in ref.stdout.splitlines() if line.startswith("H-"))
        assert [(h[0], h[2]) for h in hyps] == [(h[0], h[2]) for h in ref_hyps], window
        assert max(abs(float(h[1]) - float(r[1])) for h, r in zip(hyps, ref_hyps)) <= 2e-4, window

    rows = [line.split("\t") for line in (windows_dir / "windows.tsv").read_text().splitlines()]
    assert rows[0] == ["sample_id", "attention", "layer", "head", "query_position", "length", "centre", "window"]
    assert {(r[1], r[2]) for r in rows[1:]} == {(k, l) for k in ("encoder_self", "decoder_self") for l in "01"}
    num_valid = len((toy_raw / "valid.src").read_text().splitlines())
    assert {int(r[0]) for r in rows[1:]} == set(range(num_valid))
    for r in rows[1:]:
        # centre inside the visible keys, window inside (0, I): P, D = I * sigmoid(.)
        length, centre, window = int(r[5]), float(r[6]), float(r[7])
        assert 0 <= centre <= length and 0 < window <= length
        if r[1] == "decoder_self":
            assert length == int(r[4]) + 1  # visible prefix
    table = (windows_dir / "windows.md").read_text()
    assert table.count("\n") == 2 + 4 and "| decoder_self | 1 |" in table
    for kind in ("encoder_self", "decoder_self"):
        assert (windows_dir / f"windows_{kind}.png").stat().st_size > 1000
    assert "wrote windows of 4 attention layers" in dumped.stdout
