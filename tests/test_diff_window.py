"""Differentiable windows (docs/diffwin.md): soft masks, AW / MW attention, model options, CLI."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, run_cli

from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from man_fairseq.modules.diff_window import (
    AdditiveWindow,
    MultiplicativeWindow,
    WindowPointers,
    build_window,
)
from man_fairseq.modules.window_mask import segment_bounds, soft_window_mask


# ---------------------------------------------------------------- naive references (float64)
def naive_L(n):
    """Upper-triangular ones, L[i, j] = 1 if i <= j."""
    return torch.triu(torch.ones(n, n, dtype=torch.float64))


def naive_J(n, b):
    """J[i, j] = 1 if i <= b * ceil(j / b) with 1-based i, j (the paper's definition)."""
    J = torch.zeros(n, n, dtype=torch.float64)
    for i in range(1, n + 1):
        for j in range(1, n + 1):
            J[i - 1, j - 1] = float(i <= b * math.ceil(j / b))
    return J


def naive_mask(phi_l, phi_r, M):
    """m = (phi_L M) * (phi_R M^T) + (phi_R M) * (phi_L M^T), as written in docs/diffwin.md."""
    return (phi_l @ M) * (phi_r @ M.T) + (phi_r @ M) * (phi_l @ M.T)


def discrete_mask(l, r, n, b=1, union=False):
    """Discrete window for pointers l, r (0-based): 1[g(l)<=g(j)<=g(r)] + 1[g(r)<=g(j)<=g(l)]
    (the paper's formula), or with ``union`` 1[min <= g(j) <= max]."""
    g = torch.arange(n) // b
    gl, gr = l // b, r // b
    if union:
        return ((min(gl, gr) <= g) & (g <= max(gl, gr))).double()
    return ((gl <= g) & (g <= gr)).double() + ((gr <= g) & (g <= gl)).double()


def random_pointers(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).mul(2).softmax(-1)


# ---------------------------------------------------------------- soft mask
def test_one_hot_pointers_l_le_r_give_exact_window():
    n = 9
    for l, r in itertools.combinations(range(n), 2):  # l < r
        phi_l = F.one_hot(torch.tensor([[l]]), n).double()
        phi_r = F.one_hot(torch.tensor([[r]]), n).double()
        m = soft_window_mask(phi_l, phi_r)[0, 0]
        expected = ((torch.arange(n) >= l) & (torch.arange(n) <= r)).double()
        assert torch.equal(m, expected), (l, r, m)
    # l == r: both terms of the paper's formula fire, value 2 at the single key, 0 elsewhere
    for l in range(n):
        phi = F.one_hot(torch.tensor([[l]]), n).double()
        assert torch.equal(soft_window_mask(phi, phi)[0, 0], 2 * F.one_hot(torch.tensor(l), n).double())


def test_one_hot_pointers_l_gt_r_give_swapped_window():
    n = 9
    for r, l in itertools.combinations(range(n), 2):  # l > r
        phi_l = F.one_hot(torch.tensor([[l]]), n).double()
        phi_r = F.one_hot(torch.tensor([[r]]), n).double()
        m = soft_window_mask(phi_l, phi_r)[0, 0]
        expected = ((torch.arange(n) >= r) & (torch.arange(n) <= l)).double()
        assert torch.equal(m, expected), (l, r, m)


@pytest.mark.parametrize("n", [1, 6, 11])
def test_token_mask_equals_triangular_formula(n):
    phi_l, phi_r = random_pointers(2, 3, n, n, seed=1)
    torch.testing.assert_close(soft_window_mask(phi_l, phi_r), naive_mask(phi_l, phi_r, naive_L(n)))


@pytest.mark.parametrize("n,b", [(10, 5), (11, 5), (7, 3), (4, 5), (6, 1)])
def test_segment_mask_equals_J_formula_and_is_constant_per_segment(n, b):
    phi_l, phi_r = random_pointers(2, 2, n, n, seed=2)
    m = soft_window_mask(phi_l, phi_r, segment_size=b)
    torch.testing.assert_close(m, naive_mask(phi_l, phi_r, naive_J(n, b)))
    for start in range(0, n, b):
        seg = m[..., start:start + b]
        torch.testing.assert_close(seg, seg[..., :1].expand_as(seg))
    if b > 1 and n > b:  # and it is not the token mask
        assert not torch.allclose(m, soft_window_mask(phi_l, phi_r))


@pytest.mark.parametrize("b", [1, 3])
def test_soft_mask_is_expectation_of_discrete_window(b):
    n = 8
    phi_l, phi_r = random_pointers(2, 1, 2, n, seed=3)
    m = soft_window_mask(phi_l, phi_r, segment_size=b)[0]
    # exact expectation by enumerating every pointer pair
    exact = torch.zeros(2, n, dtype=torch.float64)
    for t in range(2):
        for l in range(n):
            for r in range(n):
                exact[t] += phi_l[0, t, l] * phi_r[0, t, r] * discrete_mask(l, r, n, b)
    torch.testing.assert_close(m, exact, rtol=0, atol=1e-12)
    # Monte-Carlo mean of discrete masks from sampled pointers
    samples = 100_000
    gen = torch.Generator().manual_seed(4)
    g = torch.arange(n) // b
    for t in range(2):
        gl = torch.multinomial(phi_l[0, t], samples, replacement=True, generator=gen)[:, None] // b
        gr = torch.multinomial(phi_r[0, t], samples, replacement=True, generator=gen)[:, None] // b
        mc = (((gl <= g) & (g <= gr)).double() + ((gr <= g) & (g <= gl)).double()).mean(0)
        # std of the mean <= 1/sqrt(samples) ~ 0.003; plausible wrong formulas (no second
        # term, strict triangle, L in place of L^T) are off by > 0.05 here (checked below)
        assert (mc - m[t]).abs().max() < 0.015
    L = naive_L(n)
    wrong = [
        ((phi_l @ L) * (phi_r @ L.T))[0],
        naive_mask(phi_l, phi_r, torch.triu(L, 1))[0],
        ((phi_l @ L) * (phi_r @ L) + (phi_r @ L.T) * (phi_l @ L.T))[0],
    ]
    if b == 1:
        for w in wrong:
            assert (w - exact).abs().max() > 0.05


@pytest.mark.parametrize("b", [1, 3])
def test_union_mask_is_probability_of_key_inside_window(b):
    n = 8
    phi_l, phi_r = random_pointers(2, 1, 2, n, seed=7)
    m = soft_window_mask(phi_l, phi_r, segment_size=b, union=True)[0]
    exact = torch.zeros(2, n, dtype=torch.float64)
    for t in range(2):
        for l in range(n):
            for r in range(n):
                exact[t] += phi_l[0, t, l] * phi_r[0, t, r] * discrete_mask(l, r, n, b, union=True)
    torch.testing.assert_close(m, exact, rtol=0, atol=1e-12)
    assert m.max() <= 1 + 1e-12
    # one-hot pointers: the exact 0/1 window for every l <= r, l == r included
    for l, r in itertools.combinations_with_replacement(range(n), 2):
        pl, pr = (F.one_hot(torch.tensor([[p]]), n).double() for p in (l, r))
        expected = discrete_mask(l, r, n, b, union=True)
        assert torch.equal(soft_window_mask(pl, pr, segment_size=b, union=True)[0, 0], expected)
        assert torch.equal(soft_window_mask(pr, pl, segment_size=b, union=True)[0, 0], expected)


def test_segment_bounds_follow_first_real_key():
    pad = torch.tensor([[True, True, False, False, False, False, False, False]])
    start, end = segment_bounds(8, 3, pad, "cpu")
    # real keys 2..7 form segments [2,3,4] [5,6,7]
    assert start[0, 2:].tolist() == [2, 2, 2, 5, 5, 5]
    assert end[0, 2:].tolist() == [4, 4, 4, 7, 7, 7]


def test_soft_mask_builds_no_square_matrix_product():
    """cumsum, not an S x S triangular matmul (the issue's efficiency requirement): record every
    aten op the mask runs (``@`` included) and refuse matrix products."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class RecordOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    phi_l, phi_r = random_pointers(2, 1, 4, 16, seed=5)
    with RecordOps() as rec:
        soft_window_mask(phi_l, phi_r)
        soft_window_mask(phi_l, phi_r, segment_size=5, union=True)
    assert any("cumsum" in op for op in rec.ops)
    assert not [op for op in rec.ops if any(k in op for k in ("mm", "matmul", "einsum", "baddbmm"))], rec.ops
    with RecordOps() as rec:  # the recorder does see a triangular product written with @
        phi_l @ naive_L(16)
    assert any("mm" in op for op in rec.ops)


# ---------------------------------------------------------------- attention formulas
def make_attention(mode, dim=12, heads=3, mask_type="token", seg=3, temperature=1.0, causal=False,
                   renormalize=False, cross=False, kdim=None, seed=0, union=False):
    torch.manual_seed(seed)
    bias, post = build_window(mode, dim, kdim=kdim if cross else None, mask_type=mask_type,
                              segment_size=seg, temperature=temperature, causal=causal,
                              renormalize=renormalize, union=union)
    attn = BiasedMultiheadAttention(
        dim, heads, kdim=kdim if cross else None, vdim=kdim if cross else None,
        self_attention=not cross, encoder_decoder_attention=cross,
        bias_module=bias, post_softmax=post,
    )
    return attn.double().eval()


def naive_window_attention(attn, query, key, kpm, mode, seg, temperature, causal, renormalize, union=False):
    """Full AW/MW attention written out from docs/diffwin.md, float64, one loop over the batch."""
    window = attn.bias_module if mode == "aw" else attn.post_softmax
    T, B, d = query.shape
    S = key.size(0)
    H, D = attn.num_heads, attn.head_dim
    P = window.num_products
    Wq = window.query_proj.weight.view(P, d, d)
    Wk = window.key_proj.weight.view(P, d, -1)
    outs = []
    for b in range(B):
        x, y = query[:, b], key[:, b]
        real = ~kpm[b] if kpm is not None else torch.ones(S, dtype=torch.bool)
        allowed = real[None, :].expand(T, S).clone()
        if causal:
            allowed &= torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)
        pointer_logits = [(x @ Wq[i].T) @ (y @ Wk[i].T).T / math.sqrt(d) / temperature for i in range(2)]
        phis = [lg.masked_fill(~allowed, float("-inf")).softmax(-1) for lg in pointer_logits]
        # segments counted from the first real key
        first = int(real.nonzero()[0])
        M = torch.zeros(S, S, dtype=torch.float64)
        M[first:, first:] = naive_J(S - first, seg) if seg > 1 else naive_L(S - first)
        m = naive_mask(phis[0], phis[1], M)
        if union:  # minus P(both pointers in j's segment): M * M^T marks same-segment pairs
            same = M * M.T
            m = m - (phis[0] @ same) * (phis[1] @ same)
        q = (x @ attn.q_proj.weight.T + attn.q_proj.bias).view(T, H, D).transpose(0, 1)
        k = (y @ attn.k_proj.weight.T + attn.k_proj.bias).view(S, H, D).transpose(0, 1)
        v = (y @ attn.v_proj.weight.T + attn.v_proj.bias).view(S, H, D).transpose(0, 1)
        scores = q @ k.transpose(1, 2) / math.sqrt(D)
        if mode == "aw":
            local = (x @ Wq[2].T) @ (y @ Wk[2].T).T
            scores = scores + local * m / math.sqrt(d)
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        if mode == "mw":
            probs = probs * m
            if renormalize:
                probs = probs / probs.sum(-1, keepdim=True)
        out = (probs @ v).transpose(0, 1).reshape(T, d)
        outs.append(out @ attn.out_proj.weight.T + attn.out_proj.bias)
    return torch.stack(outs, 1)


CASES = [
    # mode, mask, causal, renormalize, cross
    ("aw", "token", False, False, False),
    ("aw", "segment", False, False, False),
    ("mw", "token", False, False, False),
    ("mw", "token", False, True, False),
    ("mw", "segment", False, False, True),
    ("aw", "segment", False, False, True),
    ("mw", "token", True, False, False),
    ("aw", "token", True, False, False),
    ("mw", "segment", False, False, "union"),
    ("aw", "token", True, False, "union"),
]


@pytest.mark.parametrize("mode,mask,causal,renorm,cross", CASES)
@pytest.mark.parametrize("need_weights", [False, True])  # SDPA path and explicit path
def test_attention_equals_naive_formula(mode, mask, causal, renorm, cross, need_weights):
    union = cross == "union"  # the union mask, tested in self-attention
    cross = cross is True
    d, T, S, kdim = 12, 6, 9 if cross else 6, 10
    attn = make_attention(mode, dim=d, mask_type=mask, seg=3, temperature=0.7, causal=causal,
                          renormalize=renorm, cross=cross, kdim=kdim, union=union)
    torch.manual_seed(1)
    query = torch.randn(T, 3, d, dtype=torch.float64)
    key = torch.randn(S, 3, kdim, dtype=torch.float64) if cross else query
    kpm = torch.zeros(3, S, dtype=torch.bool)
    if not causal:  # left pad one row, right pad another
        kpm[1, :2] = True
        kpm[2, -3:] = True
    else:
        kpm[2, -2:] = True
    am = torch.triu(torch.full((T, S), float("-inf"), dtype=torch.float64), 1) if causal else None
    out, _ = attn(query, key, key, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights)
    ref = naive_window_attention(attn, query, key, kpm, mode, 3 if mask == "segment" else 1, 0.7, causal, renorm, union)
    real_queries = torch.ones(T, 3, dtype=torch.bool)
    if causal:
        real_queries[-2:, 2] = False
    torch.testing.assert_close(out[real_queries], ref[real_queries], rtol=1e-9, atol=1e-10)


def test_mw_renormalized_rows_sum_to_one_and_plain_rows_do_not():
    x = torch.randn(5, 2, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    for renorm in (False, True):
        attn = make_attention("mw", renormalize=renorm)
        _, w = attn(x, x, x, need_weights=True, need_head_weights=True)
        sums = w.sum(-1)
        if renorm:
            torch.testing.assert_close(sums, torch.ones_like(sums))
        else:
            assert (sums - 1).abs().max() > 1e-3


PADDING_CASES = [  # mode, mask, cross, union, renormalize: every non-causal combination
    (mode, mask, cross, union, False)
    for mode in ("aw", "mw") for mask in ("token", "segment") for cross in (False, True) for union in (False, True)
] + [("mw", "token", False, False, True), ("mw", "segment", True, True, True)]


@pytest.mark.parametrize("mode,mask,cross,union,renorm", PADDING_CASES)
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_left_and_right_padding_give_same_outputs(mode, mask, cross, union, renorm, need_weights):
    """A sequence of 7 real keys, padded by 3 on the left or on the right, unpadded."""
    d, kdim, n, pad = 12, 10, 7, 3
    attn = make_attention(mode, dim=d, mask_type=mask, seg=3, cross=cross, kdim=kdim, union=union,
                          renormalize=renorm)
    torch.manual_seed(2)
    keys_real = torch.randn(n, 1, kdim if cross else d, dtype=torch.float64)
    q_real = torch.randn(4, 1, d, dtype=torch.float64) if cross else keys_real
    filler = torch.randn(pad, 1, keys_real.size(-1), dtype=torch.float64)
    ref, _ = attn(q_real, keys_real, keys_real, need_weights=False)
    for left in (True, False):
        keys = torch.cat([filler, keys_real] if left else [keys_real, filler])
        kpm = torch.zeros(1, n + pad, dtype=torch.bool)
        kpm[0, :pad] = left
        kpm[0, n:] = not left
        query = q_real if cross else keys
        out, _ = attn(query, keys, keys, key_padding_mask=kpm, need_weights=need_weights)
        real = out if cross else (out[pad:] if left else out[:n])
        torch.testing.assert_close(real, ref, rtol=1e-9, atol=1e-10)


def test_decoder_self_attention_rejects_segment_masks():
    with pytest.raises(ValueError, match="token masks only"):
        build_window("mw", 8, mask_type="segment", segment_size=5, causal=True)
    with pytest.raises(ValueError, match="unknown diffwin mode"):
        build_window("xw", 8)
    with pytest.raises(ValueError, match="unknown diffwin mask"):
        build_window("aw", 8, mask_type="word")
    with pytest.raises(ValueError, match="temperature"):
        build_window("aw", 8, temperature=0.0)


@pytest.mark.parametrize("union", [False, True])
@pytest.mark.parametrize("b", [1, 3])
def test_gradcheck_soft_mask(b, union):
    phi_l, phi_r = random_pointers(2, 1, 3, 7, seed=6)
    phi_l.requires_grad_(True)
    phi_r.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, c: soft_window_mask(a, c, segment_size=b, union=union), (phi_l, phi_r))


GRADCHECK_CASES = [  # mode, mask, causal, renormalize, union
    (mode, mask, False, False, False) for mode in ("aw", "mw") for mask in ("token", "segment")
] + [("aw", "token", True, False, False), ("mw", "token", True, False, False),
     ("mw", "token", False, True, False), ("aw", "segment", False, False, True), ("mw", "token", True, False, True)]


@pytest.mark.parametrize("mode,mask,causal,renorm,union", GRADCHECK_CASES)
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_gradcheck_window_parameters(mode, mask, causal, renorm, union, need_weights):
    """Window projections and the attention input, through the whole attention, padded keys."""
    x = torch.randn(4, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(9)).requires_grad_(True)
    kpm = torch.zeros(2, 4, dtype=torch.bool)
    if causal:
        kpm[1, -1:] = True  # decoder targets are right padded
    else:
        kpm[1, :1] = True
    am = torch.triu(torch.full((4, 4), float("-inf"), dtype=torch.float64), 1) if causal else None
    attn = make_attention(mode, dim=4, heads=2, mask_type=mask, seg=2, temperature=0.5, causal=causal,
                          renormalize=renorm, union=union)
    window = attn.bias_module if mode == "aw" else attn.post_softmax
    wq = window.query_proj.weight.detach().clone().requires_grad_(True)
    wk = window.key_proj.weight.detach().clone().requires_grad_(True)
    real = ~kpm.t()  # a pad query may attend to nothing under the causal mask: compare real rows

    def f(a, b, c):
        return _attn_with_window_weights(attn, window, a, b, c, kpm, am, need_weights)[real]

    assert torch.autograd.gradcheck(f, (wq, wk, x))


def _attn_with_window_weights(attn, window, wq, wk, x, kpm, attn_mask=None, need_weights=False):
    params = {"query_proj.weight": wq, "key_proj.weight": wk}
    prefix = "bias_module." if window is attn.bias_module else "post_softmax."
    out, _ = torch.func.functional_call(
        attn, {prefix + k: v for k, v in params.items()}, (x, x, x),
        {"key_padding_mask": kpm, "need_weights": need_weights, "attn_mask": attn_mask},
    )
    return out


# ---------------------------------------------------------------- model level (real CLI parsing)
@pytest.fixture(scope="module")
def build_model(toy_data_bin):
    from fairseq import options, tasks

    def build(*extra, arch="transformer_diffwin_small", seed=0):
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(
            parser, [str(toy_data_bin), "--user-dir", USER_DIR, "--arch", arch, *TINY_MODEL, *map(str, extra)]
        )
        task = tasks.setup_task(args)
        torch.manual_seed(seed)
        return task.build_model(args).eval(), args, task

    return build


def windows_of(model):
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, WindowPointers):
            found[name] = module
    return found


def test_presets_and_explicit_options_reach_the_modules(build_model):
    model, args, _ = build_model("--diffwin-layers", "1")  # default preset: Enc(AW)-Cr(AW,Seg)-Dec(MW)
    assert args.diffwin_preset == "enc_aw-cr_aw_seg-dec_mw"
    w = windows_of(model)
    assert isinstance(w["encoder.layers.0.self_attn.bias_module"], AdditiveWindow)
    assert isinstance(w["decoder.layers.0.self_attn.post_softmax"], MultiplicativeWindow)
    cross = w["decoder.layers.0.encoder_attn.bias_module"]
    assert isinstance(cross, AdditiveWindow) and cross.segment_size == 5
    assert w["decoder.layers.0.self_attn.post_softmax"].causal
    assert len(w) == 3  # layer 1 untouched

    model, args, _ = build_model("--diffwin-preset", "cr_aw_seg", "--diffwin-cross-mask", "token",
                                 "--diffwin-segment-size", "4")
    w = windows_of(model)
    assert set(w) == {f"decoder.layers.{i}.encoder_attn.bias_module" for i in (0, 1)}  # layers 3 >= 2
    assert all(m.segment_size == 1 for m in w.values())  # explicit token mask wins over the preset

    model, _, _ = build_model("--diffwin-preset", "enc_aw-dec_mw", "--diffwin-encoder", "mw",
                              "--diffwin-encoder-mask", "segment", "--diffwin-segment-size", "4",
                              "--diffwin-temperature", "0.25", "--diffwin-mw-renormalize")
    w = windows_of(model)
    enc = w["encoder.layers.1.self_attn.post_softmax"]
    assert enc.segment_size == 4 and enc.temperature == 0.25 and enc.renormalize
    assert not any("encoder_attn" in n for n in w)

    model, _, _ = build_model("--diffwin-preset", "none")
    assert windows_of(model) == {}


def test_bad_options_fail_at_startup(build_model, capsys):
    # argparse errors (exit status 2) naming the option, before anything is built
    for extra, message in [
        (("--diffwin-decoder-mask", "segment"), "argument --diffwin-decoder-mask: invalid value 'segment': "
                                                "decoder self-attention supports token masks only"),
        (("--diffwin-segment-size", "0"), "argument --diffwin-segment-size: invalid value '0': must be >= 1"),
        (("--diffwin-temperature", "-1"), "argument --diffwin-temperature: invalid value '-1': must be > 0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            build_model(*extra)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err

def test_bad_option_choices_are_argparse_errors(build_model, capsys):
    with pytest.raises(SystemExit):  # argparse choices
        build_model("--diffwin-encoder", "xw")
    assert "argument --diffwin-encoder: invalid choice: 'xw'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_model("--diffwin-preset", "best")
    assert "argument --diffwin-preset: invalid choice: 'best'" in capsys.readouterr().err


def model_output(model, src, src_len, tgt):
    return model(src, src_len, tgt)[0]


def toy_batch(task, bsz=3, src_len=7, tgt_len=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (bsz, src_len), generator=gen)
    lengths = torch.tensor([src_len - 2 * i for i in range(bsz)])
    for i, n in enumerate(lengths):  # left padding as fairseq's translation task does
        src[i, : src_len - n] = d.pad()
    tgt = torch.randint(d.nspecial, len(d), (bsz, tgt_len), generator=gen)
    tgt[:, 0] = d.eos()
    return src, lengths, tgt


@pytest.mark.parametrize("option,values", [
    ("--diffwin-temperature", ["1.0", "0.3"]),
    ("--diffwin-segment-size", ["2", "5"]),
    ("--diffwin-layers", ["1", "2"]),
    ("--diffwin-mw-renormalize", [None, True]),
    ("--diffwin-mask-union", [None, True]),
])
def test_every_option_changes_the_output(build_model, option, values):
    outputs = []
    for value in values:
        extra = [] if value is None else ([option] if value is True else [option, value])
        # encoder MW with segments so every option (renormalisation included) is exercised
        model, _, task = build_model("--diffwin-encoder", "mw", "--diffwin-encoder-mask", "segment", *extra)
        src, lengths, tgt = toy_batch(task)
        with torch.no_grad():
            outputs.append(model_output(model, src, lengths, tgt))
    assert (outputs[0] - outputs[1]).abs().max() > 1e-4


def decode_step_by_step(model, src, lengths, tgt, reorders, beam=1):
    """Incremental decoder outputs of the last position at every step, with ``reorders`` applied
    as fairseq's generator applies them, each checked against a full forward; the final state.
    ``beam``: rows come in groups of identical sources, encoded once and repeated as the generator
    does (encoding the copies apart may differ in the last bit under multi-threaded kernels)."""
    with torch.no_grad():
        enc = model.encoder(src[::beam], lengths[::beam])
        if beam > 1:
            enc = model.encoder.reorder_encoder_out(enc, torch.arange(src.size(0)) // beam)
        state = {}
        rows = torch.arange(tgt.size(0))
        for step in range(tgt.size(1)):
            if step in reorders:
                order = reorders[step]
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                rows = rows[order]
            inc = model.decoder(tgt[rows, : step + 1], encoder_out=enc, incremental_state=state)[0][:, -1]
            full = model.decoder(tgt[rows, : step + 1], encoder_out=model.encoder(src[rows], lengths[rows]))[0][:, -1]
            torch.testing.assert_close(inc, full, rtol=1e-9, atol=1e-9, msg=lambda m: f"step {step}: {m}")
    return state, rows


@pytest.mark.parametrize("options", [
    ["--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw"],
    ["--diffwin-preset", "none", "--diffwin-decoder", "aw", "--diffwin-cross", "mw", "--diffwin-cross-mask", "segment"],
])
def test_incremental_decoding_with_beam_reordering_equals_full_forward(build_model, options):
    """Decoder self MW/AW (token, causal), cross AW/MW with segments; reorders as fairseq's beam
    search does (the decoder reaches every window's reorder through two paths)."""
    model, _, task = build_model(*options, "--diffwin-segment-size", "2", "--dropout", "0")
    model = model.double()
    beam = 2
    src, lengths, tgt = toy_batch(task, bsz=2, src_len=9, tgt_len=7)
    # every beam hypothesis has its own target prefix
    src = src.repeat_interleave(beam, 0)
    lengths = lengths.repeat_interleave(beam, 0)
    tgt = torch.cat([tgt, tgt.flip(1)], 0)[[0, 2, 1, 3]]
    tgt[:, 0] = task.target_dictionary.eos()
    # within-sentence beam reorders, then a finished sentence removed (batch shrinks)
    reorders = {2: torch.tensor([1, 1, 2, 3]), 4: torch.tensor([0, 1, 3, 2]), 5: torch.tensor([2, 3])}
    state, rows = decode_step_by_step(model, src, lengths, tgt, reorders)
    # the cached key projections stay one contiguous (B, P, S, d) block through the reorders, the
    # layout a step's product reads without copying the cache
    windows = [m for m in model.decoder.modules() if isinstance(m, WindowPointers)]
    assert windows
    for window in windows:
        keys = window._get_input_buffer(state)["prev_key_proj"]
        assert keys.is_contiguous()
        assert keys.shape[:2] == (rows.numel(), window.num_products) and keys.size(3) == window.embed_dim
        assert keys.size(2) in (tgt.size(1), src.size(1))


def beam_batch(task, beam, bsz=3):
    src, lengths, tgt = toy_batch(task, bsz=bsz, src_len=9, tgt_len=7)
    src, lengths = src.repeat_interleave(beam, 0), lengths.repeat_interleave(beam, 0)
    # every hypothesis has its own target prefix
    gen = torch.Generator().manual_seed(3)
    tgt = tgt.repeat_interleave(beam, 0)
    tgt[:, 1:] = torch.randint(4, len(task.target_dictionary), tgt[:, 1:].shape, generator=gen)
    tgt[:, 0] = task.target_dictionary.eos()
    return src, lengths, tgt


CROSS_WINDOWS = ["--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw", "--diffwin-segment-size", "2", "--dropout", "0"]


@pytest.mark.parametrize("finished", [False, True])
def test_beam_search_caches_cross_window_keys_once_per_sentence(build_model, finished):
    """With the generator's beam size, a cross window caches (sentences, P, S, d) and reorders
    leave it alone until a sentence finishes; every step still equals the full forward."""
    model, _, task = build_model(*CROSS_WINDOWS)
    model = model.double()
    beam = 2
    model.set_beam_size(beam)
    src, lengths, tgt = beam_batch(task, beam)
    reorders = {2: torch.tensor([1, 1, 2, 3, 5, 4]), 4: torch.tensor([0, 0, 3, 2, 4, 5])}
    if finished:
        reorders[5] = torch.tensor([0, 1, 4, 5])  # the second sentence finished
    state, rows = decode_step_by_step(model, src, lengths, tgt, reorders, beam=beam)
    cross = [m for name, m in windows_of(model).items() if "encoder_attn" in name]
    assert cross
    for window in cross:
        buffer = window._get_input_buffer(state)
        assert "prev_key_proj" not in buffer
        keys = buffer["sentence_key_proj"]
        assert keys.shape[:2] == (rows.numel() // beam, window.num_products) and keys.is_contiguous()
    # decoder self-attention windows keep one row per hypothesis
    for name, window in windows_of(model).items():
        if "self_attn" in name and "decoder" in name:
            assert window._get_input_buffer(state)["prev_key_proj"].size(0) == rows.numel()


def test_reorder_that_splits_a_sentences_beams_falls_back_to_a_row_per_hypothesis(build_model):
    """Identical sources cached per sentence under a beam size of 2, then decoded as a beam-1
    generator would (a row dropped alone): the cache becomes one row per hypothesis, still exact."""
    model, _, task = build_model(*CROSS_WINDOWS)
    model = model.double()
    model.set_beam_size(2)
    src, lengths, tgt = beam_batch(task, 2)
    state, rows = decode_step_by_step(model, src, lengths, tgt, {3: torch.tensor([0, 1, 3, 4, 5])}, beam=2)
    for name, window in windows_of(model).items():
        if "encoder_attn" in name:
            buffer = window._get_input_buffer(state)
            assert "sentence_key_proj" not in buffer and buffer["prev_key_proj"].size(0) == rows.numel()


def test_stale_beam_size_never_merges_different_sentences(build_model):
    """A beam size left from an earlier generator: distinct sources keep their own rows."""
    model, _, task = build_model(*CROSS_WINDOWS)
    model = model.double()
    model.set_beam_size(2)
    src, lengths, tgt = toy_batch(task, bsz=4, src_len=9, tgt_len=7)
    state, rows = decode_step_by_step(model, src, lengths, tgt, {3: torch.tensor([0, 2, 3])})
    for name, window in windows_of(model).items():
        if "encoder_attn" in name:
            assert window._get_input_buffer(state)["prev_key_proj"].size(0) == rows.numel()


def test_decoder_wide_beam_size_keeps_the_cores_caches_per_hypothesis(build_model):
    """``decoder.set_beam_size`` reaches every submodule: the attention core ignores it (fairseq's
    beamable shortcut would shrink its per-hypothesis caches to one row per sentence)."""
    model, _, task = build_model(*CROSS_WINDOWS)
    model = model.double()
    model.decoder.set_beam_size(2)
    src, lengths, tgt = beam_batch(task, 2)
    decode_step_by_step(model, src, lengths, tgt, {2: torch.tensor([1, 1, 2, 3, 5, 4]), 4: torch.tensor([0, 1, 4, 5])})


def test_generator_output_unchanged_by_per_sentence_cache(build_model):
    """fairseq's SequenceGenerator (beam 3, a sentence finishing early) gives the same hypotheses
    and scores with the per-sentence cross cache as with a row per hypothesis."""
    from fairseq.sequence_generator import SequenceGenerator

    model, _, task = build_model(*CROSS_WINDOWS)
    model = model.double()
    src, lengths, _ = toy_batch(task, bsz=4, src_len=9, tgt_len=7)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    results = []
    for per_sentence in (True, False):
        generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=8)
        # the generator's beam size reaches every window; 1 restores a row per hypothesis
        assert {w.beam_size for name, w in windows_of(model).items() if name.startswith("decoder.")} == {3}
        if not per_sentence:
            model.set_beam_size(1)
        with torch.no_grad():
            results.append(generator.generate([model], sample))
    for with_cache, without in zip(*results):
        assert [h["tokens"].tolist() for h in with_cache] == [h["tokens"].tolist() for h in without]
        torch.testing.assert_close(
            torch.stack([h["score"] for h in with_cache]), torch.stack([h["score"] for h in without]),
            rtol=1e-9, atol=1e-9,
        )
    lengths_out = {len(h[0]["tokens"]) for h in results[0]}
    assert len(lengths_out) > 1, "every sentence ended at the same step: no batch shrink was exercised"


# ---------------------------------------------------------------- CLI end to end
@pytest.mark.parametrize("preset", ["enc_aw-dec_mw", "cr_aw_seg", "enc_aw-cr_aw_seg-dec_mw"])
def test_cli_train_and_generate_each_preset(toy_raw, toy_data_bin, tmp_path, preset):
    ckpt = tmp_path / "ckpt"
    out = run_cli([
        "fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--task", "translation",
        "--arch", "transformer_diffwin_small", "--diffwin-preset", preset, "--diffwin-layers", "2",
        "--diffwin-segment-size", "3", *TINY_MODEL, *TINY_TRAIN,
        "--max-update", "4", "--save-dir", ckpt,
    ])
    assert f"preset={preset}" in out.stdout
    gen = run_cli([
        "fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path", ckpt / "checkpoint_last.pt",
        "--beam", "3", "--batch-size", "8", "--max-len-b", "12", "--cpu", "--gen-subset", "test",
    ])
    hyps = [line for line in gen.stdout.splitlines() if line.startswith("H-")]
    num_test = len((toy_raw / "test.src").read_text().splitlines())
    assert len(hyps) == num_test, gen.stdout[-2000:]
    assert "BLEU" in gen.stdout
