"""Mask Attention Networks: formula, degenerate cases, padding, incremental decoding, options."""

import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL, build_fairseq_model, num_params
from fairseq.modules.multihead_attention import MultiheadAttention

from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from man_fairseq.modules.man_layers import parse_sublayers
from man_fairseq.modules.mask_bias import DynamicMaskBias, StaticWindowBias
from man_fairseq.plugin_options import PluginOptionError

D, H = 12, 3


def naive_attention(attn, x, pad, bias_fn, causal=False, activation=None):
    """Multi-head attention written out element by element (float64).

    bias_fn(b, h, t, s) -> additive logit bias (may be -inf); ``activation`` is applied to the
    concatenated heads before the output projection (--attention-head-activation).
    """
    T, B, C = x.shape
    dh = C // attn.num_heads
    q = attn.q_proj(x) / math.sqrt(dh)
    k, v = attn.k_proj(x), attn.v_proj(x)
    out = torch.zeros(T, B, C, dtype=x.dtype)
    for b in range(B):
        for h in range(attn.num_heads):
            sl = slice(h * dh, (h + 1) * dh)
            for t in range(T):
                logits = []
                for s in range(T):
                    if (pad is not None and pad[b, s]) or (causal and s > t):
                        logits.append(torch.tensor(float("-inf"), dtype=x.dtype))
                    else:
                        logits.append(q[t, b, sl] @ k[s, b, sl] + bias_fn(b, h, t, s))
                p = torch.softmax(torch.stack(logits), 0)
                out[t, b, sl] = sum(p[s] * v[s, b, sl] for s in range(T))
    return attn.out_proj(activation(out) if activation is not None else out)


def dman_naive_bias(mod, x):
    def fn(b, h, t, s):
        K = mod.max_relative_distance
        rel = max(-K, min(K, t - s))
        z = x[t, b] @ mod.query_weight[0] + mod.distance_bias[rel + K] + mod.head_bias[h]
        return math.log(torch.sigmoid(z).item()) + 0 * z  # log(sigmoid) spelled out
    return fn


def make_dman_attention(K=256, seed=0, head_activation="none"):
    torch.manual_seed(seed)
    return BiasedMultiheadAttention(D, H, self_attention=True, bias_module=DynamicMaskBias(D, H, K),
                                    head_activation=head_activation).double()


def padding(B, T, n_pad, left):
    """(B, T) key padding mask: sentence 1 has ``n_pad`` pads on the left or on the right."""
    pad = torch.zeros(B, T, dtype=torch.bool)
    if left:
        pad[1, :n_pad] = True
    else:
        pad[1, T - n_pad:] = True
    return pad


@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
@pytest.mark.parametrize("K", [256, 2], ids=["unclipped", "clipped"])
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
def test_dman_matches_naive_formula(need_weights, K, left):
    attn = make_dman_attention(K)
    torch.manual_seed(1)
    x = torch.randn(7, 2, D, dtype=torch.double)
    pad = padding(2, 7, 2, left)
    out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=need_weights)
    ref = naive_attention(attn, x, pad, dman_naive_bias(attn.bias_module, x))
    real = ~pad.t()
    torch.testing.assert_close(out[real], ref[real], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
@pytest.mark.parametrize("head_activation", ["relu", "gelu"])
def test_dman_head_activation_matches_naive_formula(need_weights, head_activation):
    attn = make_dman_attention(K=3, head_activation=head_activation)
    torch.manual_seed(2)
    x = torch.randn(6, 2, D, dtype=torch.double)
    pad = padding(2, 6, 2, left=False)
    out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=need_weights)
    act = {"relu": F.relu, "gelu": F.gelu}[head_activation]
    ref = naive_attention(attn, x, pad, dman_naive_bias(attn.bias_module, x), activation=act)
    real = ~pad.t()
    torch.testing.assert_close(out[real], ref[real], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_decoder_causal_dman_matches_naive_formula(need_weights):
    """Decoder self-attention DMAN: the future mask the decoder passes plus right-padded targets."""
    attn = make_dman_attention(K=2)
    torch.manual_seed(3)
    T = 7
    x = torch.randn(T, 2, D, dtype=torch.double)
    pad = padding(2, T, 3, left=False)
    future = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.double), 1)
    out, _ = attn(x, x, x, key_padding_mask=pad, attn_mask=future, need_weights=need_weights)
    ref = naive_attention(attn, x, pad, dman_naive_bias(attn.bias_module, x), causal=True)
    real = ~pad.t()
    torch.testing.assert_close(out[real], ref[real], rtol=1e-9, atol=1e-9)


def test_all_ones_mask_is_plain_attention():
    """A saturated DMAN mask (M -> 1) and a zero bias both reproduce fairseq's attention."""
    attn = make_dman_attention()
    torch.manual_seed(6)
    plain = MultiheadAttention(D, H, self_attention=True).double()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("bias_module")})
    with torch.no_grad():
        attn.bias_module.head_bias.fill_(60.0)  # logsigmoid(60) = -9e-27
    x = torch.randn(6, 3, D, dtype=torch.double)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[0, -2:] = True
    ref, _ = plain(x, x, x, key_padding_mask=pad, need_weights=False)
    out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)

    class ZeroBias(torch.nn.Module):
        def forward(self, ctx):
            return torch.zeros(1, dtype=ctx.q.dtype)

    attn.bias_module = ZeroBias()
    for need_weights in (False, True):
        out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=need_weights)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_dman_gradcheck(need_weights):
    attn = make_dman_attention(K=3)
    x = torch.randn(5, 2, D, dtype=torch.double, generator=torch.Generator().manual_seed(4))
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, 0] = True
    names = ["bias_module.query_weight", "bias_module.distance_bias", "bias_module.head_bias"]
    params = dict(attn.named_parameters())
    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)

    def f(*new):
        return torch.func.functional_call(
            attn, dict(zip(names, new)), (x, x, x), {"key_padding_mask": pad, "need_weights": need_weights}
        )[0]

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def test_inputs_longer_than_clipping_distance():
    attn = make_dman_attention(K=2)
    torch.manual_seed(7)
    x = torch.randn(40, 1, D, dtype=torch.double)
    out, _ = attn(x, x, x, need_weights=False)
    assert torch.isfinite(out).all()
    # distances beyond K share the boundary value: changing P[K] changes far-away pairs
    logits = attn.bias_module.logits
    from man_fairseq.modules.biased_attention import AttentionContext

    q = attn._shape(attn.q_proj(x), 1)
    ctx = AttentionContext(x, x, q, q, None, 0, None, True)
    z = logits(ctx)[0, 0]
    P = attn.bias_module.distance_bias
    hw = (x[:, 0] @ attn.bias_module.query_weight[0])[:, None]
    U = attn.bias_module.head_bias[0]
    torch.testing.assert_close(z[30, 0], hw[30, 0] + P[4] + U)  # t-s = 30 -> clipped to +2
    torch.testing.assert_close(z[0, 30], hw[0, 0] + P[0] + U)  # t-s = -30 -> clipped to -2


@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
@pytest.mark.parametrize("window", [0, 1, 4, "sqrt_half_length"])
def test_static_window_matches_definition(window, left, need_weights):
    torch.manual_seed(5)
    attn = BiasedMultiheadAttention(D, H, self_attention=True, bias_module=StaticWindowBias(window)).double()
    x = torch.randn(9, 2, D, dtype=torch.double)
    pad = padding(2, 9, 3, left)  # second sentence has 6 real tokens
    lengths = (~pad).sum(1)

    def fn(b, h, t, s):
        bb = window if window != "sqrt_half_length" else max(1, round(math.sqrt(lengths[b].item() / 2)))
        return 0.0 if abs(t - s) <= bb else float("-inf")

    out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=need_weights)
    ref = naive_attention(attn, x, pad, fn)
    real = ~pad.t()
    torch.testing.assert_close(out[real], ref[real], rtol=1e-9, atol=1e-9)
    assert torch.isfinite(out).all(), "pad queries whose window holds only pads must stay finite"


def test_sman1_rounding():
    L = torch.tensor([1, 2, 3, 8, 9, 18, 50])
    b = StaticWindowBias.sqrt_half_length(L)
    # sqrt(L/2) = .71 1 1.22 2 2.12 3 5 -> round to nearest, at least 1
    assert b.tolist() == [1, 1, 1, 2, 2, 3, 5]


# ---------------------------------------------------------------- whole models

TINY_MAN = TINY_MODEL + ["--dropout", "0", "--dman-max-relative-distance", "3"]


def tiny_man(extra=(), arch="transformer_man_base", seed=0):
    torch.manual_seed(seed)
    model, task, args = build_fairseq_model(arch, TINY_MAN + list(extra), dict_size=40)
    return model.double().eval(), task


def batch(task, lengths, left_pad, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    T = max(lengths)
    toks = torch.full((len(lengths), T), d.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):
        seq = torch.randint(d.nspecial, len(d), (n - 1,), generator=g).tolist() + [d.eos()]
        if left_pad:
            toks[i, T - n:] = torch.tensor(seq)
        else:
            toks[i, :n] = torch.tensor(seq)
    return toks


@pytest.mark.parametrize("arch", ["transformer_man_base", "transformer_man_small"])
def test_left_and_right_padding_agree(arch):
    model, task = tiny_man(arch=arch)
    lengths = [9, 4, 6]
    left, right = batch(task, lengths, True), batch(task, lengths, False)
    src_lengths = torch.tensor(lengths)
    out_l = model.encoder(left, src_lengths)["encoder_out"][0]
    out_r = model.encoder(right, src_lengths)["encoder_out"][0]
    T = max(lengths)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(out_l[T - n:, i], out_r[:n, i], rtol=1e-9, atol=1e-9)
    # the decoder sees the same encoder states however the source was padded
    prev = batch(task, [5, 5, 5], False, seed=3)
    dl = model.decoder(prev, encoder_out=model.encoder(left, src_lengths))[0]
    dr = model.decoder(prev, encoder_out=model.encoder(right, src_lengths))[0]
    torch.testing.assert_close(dl, dr, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("decoder_sublayers", ["dman,san,cross,ffn", "sman1,cross,ffn", "sman2,dman,cross,ffn"])
def test_incremental_decoding_matches_full_forward(decoder_sublayers):
    model, task = tiny_man(["--decoder-sublayers", decoder_sublayers])
    src = batch(task, [7, 5], True)
    enc = model.encoder(src, torch.tensor([7, 5]))
    prev = batch(task, [8, 8], False, seed=5)  # longer than K=3: clipping is exercised
    full = model.decoder(prev, encoder_out=enc)[0]
    state = {}
    steps = []
    for t in range(prev.size(1)):
        steps.append(model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0])
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-9, atol=1e-9)

    # beam search: two beams per sentence share the encoder states; reorder within beams
    beams = torch.tensor([0, 0, 1, 1])
    enc_b = model.encoder.reorder_encoder_out(enc, beams)
    prev_b = batch(task, [8, 8, 8, 8], False, seed=7)
    state = {}
    for t in range(4):
        model.decoder(prev_b[:, : t + 1], encoder_out=enc_b, incremental_state=state)
    new_order = torch.tensor([1, 1, 3, 2])
    model.decoder.reorder_incremental_state_scripting(state, new_order)
    step = model.decoder(prev_b[new_order, :5], encoder_out=enc_b, incremental_state=state)[0]
    ref = model.decoder(prev_b[new_order, :5], encoder_out=enc_b)[0][:, 4:5]
    torch.testing.assert_close(step, ref, rtol=1e-9, atol=1e-9)


TABLE3_ORDERS = ["ffn,san,ffn", "san,san,ffn", "dman,dman,ffn", "san,dman,ffn", "dman,san,ffn"]


@pytest.mark.parametrize("encoder_sublayers", TABLE3_ORDERS + ["sman1,san,ffn", "sman2,san,ffn"])
def test_each_order_builds_and_trains_a_step(encoder_sublayers):
    model, task = tiny_man(["--encoder-sublayers", encoder_sublayers])
    model = model.float().train()
    layer = model.encoder.layers[0]
    assert layer.sublayers == encoder_sublayers.split(",")
    src = batch(task, [6, 4], True)
    prev = batch(task, [5, 5], False, seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    logits = model(src, torch.tensor([6, 4]), prev)[0]
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), prev.reshape(-1))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    changed = [not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters())]
    assert all(changed), "every parameter (DMAN's w, P, U included) must be trained"


def _encoder_out(extra, src_len=8, seed=0):
    model, task = tiny_man(extra, seed=seed)
    src = batch(task, [src_len, src_len - 2], True)
    return model.encoder(src, torch.tensor([src_len, src_len - 2]))["encoder_out"][0], model


def test_options_reach_the_modules():
    base, model = _encoder_out([])
    dman = model.encoder.layers[0].blocks[0].bias_module
    assert isinstance(dman, DynamicMaskBias) and dman.max_relative_distance == 3
    assert model.decoder.layers[0].sublayers == ["dman", "san", "cross", "ffn"]

    # each option changes the output of a model that is otherwise identical (same seed)
    for extra in (
        ["--dman-max-relative-distance", "1"],
        ["--attention-head-activation", "relu"],
        ["--attention-head-activation", "gelu"],
        ["--encoder-sublayers", "san,dman,ffn"],
        ["--man-norm", "post"],
    ):
        other, _ = _encoder_out(extra)
        assert not torch.allclose(base, other), f"{extra} did not change the encoder output"

    sman_a, m = _encoder_out(["--encoder-sublayers", "sman2,san,ffn", "--static-mask-window", "1"])
    assert m.encoder.layers[0].blocks[0].bias_module.window == 1
    sman_b, _ = _encoder_out(["--encoder-sublayers", "sman2,san,ffn", "--static-mask-window", "4"])
    assert not torch.allclose(sman_a, sman_b)

    small, _ = tiny_man(arch="transformer_man_small")
    assert small.encoder.layers[0].sublayers == ["dman", "san", "ffn"]
    assert small.decoder.layers[0].sublayers == ["san", "cross", "ffn"]


def test_dman_zero_init_starts_P_and_U_at_zero_and_leaves_the_other_draws_alone():
    normal, _ = tiny_man(seed=3)
    zeros, _ = tiny_man(["--dman-init", "zeros"], seed=3)
    a, b = normal.state_dict(), zeros.state_dict()
    biases = [k for k in a if k.endswith(("distance_bias", "head_bias"))]
    assert len(biases) == 2 * (len(normal.encoder.layers) + len(normal.decoder.layers))  # DMAN everywhere
    for k in a:
        if k in biases:
            assert a[k].abs().min() > 0 and torch.count_nonzero(b[k]) == 0, k
        else:
            assert torch.equal(a[k], b[k]), k
    assert "init=zeros" in repr(zeros.encoder.layers[0].blocks[0].bias_module)


def test_pre_norm_option():
    model, task = tiny_man(["--encoder-normalize-before", "--decoder-normalize-before"])
    assert model.encoder.layers[0].normalize_before and model.decoder.layers[0].normalize_before
    # and it changes what the decoder computes (same seed, same weights otherwise)
    post, _ = tiny_man(["--man-norm", "post"])
    assert not post.encoder.layers[0].normalize_before and not post.decoder.layers[0].normalize_before
    src, prev = batch(task, [6, 4], True), batch(task, [5, 5], False, seed=1)
    with torch.no_grad():
        out_pre = model(src, torch.tensor([6, 4]), prev)[0]
        out_post = post(src, torch.tensor([6, 4]), prev)[0]
    assert not torch.allclose(out_pre, out_post)


@pytest.mark.parametrize("arch,extra,pre", [
    # the authors' translation runs were pre-norm, their summarization runs post-norm (docs/man.md)
    ("transformer_man_small", [], True), ("transformer_man_base", [], True), ("transformer_man", [], True),
    ("transformer_man_summarization", [], False),
    ("transformer_man_small", ["--man-norm", "post"], False),
    ("transformer_man_summarization", ["--man-norm", "pre"], True),
    # fairseq: fairseq's own flags decide
    ("transformer_man_small", ["--man-norm", "fairseq"], False),
    ("transformer_man_summarization", ["--encoder-normalize-before", "--decoder-normalize-before"], True),
])
def test_norm_defaults_to_the_authors_runs(arch, extra, pre):
    model, _ = tiny_man(extra, arch=arch)
    for layers in (model.encoder.layers, model.decoder.layers):
        assert all(layer.normalize_before == pre for layer in layers)


def _plugin_archs():
    from fairseq.models import ARCH_MODEL_REGISTRY

    from man_fairseq.models.family import PluginModel

    return sorted(arch for arch, cls in ARCH_MODEL_REGISTRY.items() if issubclass(cls, PluginModel))


@pytest.mark.parametrize("arch", _plugin_archs())
@pytest.mark.parametrize("given", ["encoder", "decoder"])
def test_one_norm_flag_alone_leaves_the_other_side_as_the_arch_has_it(arch, given):
    """fairseq's --encoder/--decoder-normalize-before are a pair: given alone on a pre-norm MAN arch, one
    made its decoder post-norm without a word (issue 81). Each flag sets its own side; the other side
    keeps the arch's norm, on every plugin arch."""
    from fairseq import options

    def parse(extra):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           ["/nowhere", "--task", "translation", "--arch", arch] + extra)
        return {side: getattr(args, f"{side}_normalize_before") for side in ("encoder", "decoder")}

    default, flagged = parse([]), parse([f"--{given}-normalize-before"])
    assert flagged == dict(default, **{given: True})


def test_man_norm_post_with_a_pre_norm_flag_is_refused():
    with pytest.raises(PluginOptionError, match="--man-norm post contradicts --encoder-normalize-before"):
        tiny_man(["--man-norm", "post", "--encoder-normalize-before"])


def test_a_config_asking_post_norm_with_false_flags_is_refused():
    """A false flag is dropped from the command line, so on a pre-norm arch it would change nothing."""
    from man_recipes.config import ConfigError, load_config, option_args, validate

    cfg = load_config("configs/multi30k-cpu/man.yaml")
    assert cfg["model"]["encoder-normalize-before"] is True
    post = dict(cfg, model=dict(cfg["model"], **{"encoder-normalize-before": False, "decoder-normalize-before": False}))
    with pytest.raises(ConfigError, match="model.encoder-normalize-before: false changes nothing on "
                                          "transformer_man_small, which is pre-norm by default; set model.man-norm: post"):
        validate(post)
    fixed = dict(post, model=dict(post["model"], **{"man-norm": "post"}))
    assert validate(fixed) is fixed and "--man-norm" in option_args(fixed["model"])
    transformer = dict(post, arch="transformer_iwslt_de_en")  # fairseq's own archs: false is their default
    assert validate(transformer) is transformer


def test_a_post_norm_checkpoint_saved_before_man_norm_loads_as_post_norm(tmp_path):
    """A checkpoint's saved options lack --man-norm when it was trained before the option existed:
    its own --encoder/decoder-normalize-before decide, not the arch's new pre-norm default."""
    from fairseq import checkpoint_utils

    torch.manual_seed(0)
    model, task, args = build_fairseq_model("transformer_man_small", TINY_MAN + ["--man-norm", "post"],
                                            dict_size=40, tmp_dir=tmp_path)
    old = argparse.Namespace(**vars(args))
    del old.man_norm
    assert old.encoder_normalize_before is False and old.decoder_normalize_before is False
    path = tmp_path / "old.pt"
    torch.save({"args": old, "model": model.state_dict(), "extra_state": {}, "last_optimizer_state": None,
                "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                       "optimizer_name": "Adam", "lr_scheduler_state": {}, "num_updates": 0}]},
               path)
    (loaded,), cfg, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(tmp_path)})
    assert cfg.model.man_norm == "fairseq"
    for layers in (loaded.encoder.layers, loaded.decoder.layers):
        assert not any(layer.normalize_before for layer in layers)
    model.eval(), loaded.eval()
    src, prev = batch(task, [6, 4], True), batch(task, [5, 5], False, seed=1)
    with torch.no_grad():
        assert torch.equal(model(src, torch.tensor([6, 4]), prev)[0], loaded(src, torch.tensor([6, 4]), prev)[0])


@pytest.mark.parametrize("spec,decoder,msg", [
    ("dman,foo,ffn", False, "unknown sublayer"),
    ("dman,san,cross,ffn", False, "unknown sublayer"),
    ("dman,san,ffn", True, "'cross'"),
    ("", False, "empty"),
])
def test_bad_sublayer_specs_are_clear_errors(spec, decoder, msg):
    with pytest.raises(ValueError, match=msg):
        parse_sublayers(spec, decoder)


def test_bad_options_fail_at_build(capsys):
    with pytest.raises(SystemExit):  # the declared spec, checked by argparse
        tiny_man(["--encoder-sublayers", "dman,attn,ffn"])
    assert "argument --encoder-sublayers: invalid value 'dman,attn,ffn': unknown sublayer(s) ['attn']" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):  # argparse rejects an unknown choice
        tiny_man(["--attention-head-activation", "tanh"])
    assert "argument --attention-head-activation: invalid choice: 'tanh'" in capsys.readouterr().err


@pytest.mark.parametrize("arch,dict_size,low,high", [
    ("transformer_man_small", 10000, 36.7, 37.6),
    ("transformer_man_base", 37000, 63.1, 64.1),
    ("transformer_man_big", 37000, 214.2, 216.5),
])
def test_parameter_parity_with_table1(arch, dict_size, low, high):
    model, _, _ = build_fairseq_model(arch, dict_size=dict_size)
    millions = round(num_params(model) / 1e6, 1)
    assert low <= millions <= high, f"{arch}: {millions}M parameters"
