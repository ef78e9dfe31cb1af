"""Attention calibration (docs/calibration.md): formulas, padding, gradient routing, incremental decoding,
options, and the real fairseq CLIs."""

import datetime
import math
import sys

import pytest
import torch

import man_fairseq  # noqa: F401  (registers models and criterions)
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, build_fairseq_model, run_cli
from fairseq.data import Dictionary
from man_fairseq.criterions.calibrated_label_smoothed_cross_entropy import (
    CalibratedLabelSmoothedCrossEntropyCriterion,
    MaskSaturation,
    unwrap_model,
)
from man_fairseq.modules.biased_attention import AttentionContext
from man_fairseq.modules.calibration import (
    PERTURBED,
    CalibrationTransform,
    calibration_mode,
    calibration_modules,
)

# ----------------------------------------------------------------------------------------------
# helpers


def make_dictionary(size=20):
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


SMALL_SIZES = [
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--dropout", "0", "--attention-dropout", "0",
]


def criterion_args(alpha=0.7, eps=0.1):
    return ["--criterion", "calibrated_label_smoothed_cross_entropy", "--label-smoothing", str(eps),
            "--perturbation-weight", str(alpha)]


def build_model(extra=(), arch="transformer_calibrated_small", small=True, dictionary=None, double=True):
    """The model as fairseq-train builds it: fairseq's parser, translation task, arch defaults."""
    size = len(dictionary or make_dictionary())
    model, _, _ = build_fairseq_model(arch, (SMALL_SIZES if small else []) + list(extra),
                                      dict_size=size, share_all=False)
    return model.double() if double else model


def make_batch(dictionary, bsz=3, src_len=6, tgt_len=5, seed=0, left_pad_source=True):
    """Source with pads (on the left by default, like fairseq), target right padded."""
    g = torch.Generator().manual_seed(seed)
    nspecial = dictionary.nspecial
    lo, hi = nspecial, len(dictionary)
    src = torch.randint(lo, hi, (bsz, src_len), generator=g)
    src_lengths = torch.tensor([src_len - i % 3 for i in range(bsz)])
    tgt = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    tgt_lengths = torch.tensor([tgt_len - (i + 1) % 2 for i in range(bsz)])
    for b in range(bsz):
        n = src_len - src_lengths[b]
        src[b, src_len - 1] = dictionary.eos()
        if n > 0:
            # real tokens end with eos; pads on one side
            real = src[b, :src_lengths[b]].clone()
            real[-1] = dictionary.eos()
            if left_pad_source:
                src[b] = torch.cat([torch.full((n,), dictionary.pad()), real])
            else:
                src[b] = torch.cat([real, torch.full((n,), dictionary.pad())])
        tgt[b, tgt_lengths[b] - 1] = dictionary.eos()
        tgt[b, tgt_lengths[b]:] = dictionary.pad()
    prev = torch.full_like(tgt, dictionary.pad())
    prev[:, 0] = dictionary.eos()
    prev[:, 1:] = tgt[:, :-1]
    prev = prev.masked_fill(tgt.eq(dictionary.pad()), dictionary.pad())
    return {
        "net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
        "target": tgt,
        "ntokens": int(tgt.ne(dictionary.pad()).sum()),
        "nsentences": bsz,
    }


def make_criterion(dictionary, alpha=0.7, eps=0.1):
    """The criterion as fairseq-train builds it (task.build_criterion from the parsed options)."""
    *_, crit = build_fairseq_model("transformer_calibrated_small", SMALL_SIZES + criterion_args(alpha, eps),
                                   dict_size=len(dictionary), share_all=False, criterion=True)
    return crit


def make_context(bsz=2, tgt_len=3, src_len=5, dim=4, key_dim=6, heads=2, pad=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(tgt_len, bsz, dim, generator=g, dtype=torch.float64)
    key = torch.randn(src_len, bsz, key_dim, generator=g, dtype=torch.float64)
    logits = torch.randn(bsz, heads, tgt_len, src_len, generator=g, dtype=torch.float64)
    if pad is not None:
        logits = logits.masked_fill(pad[:, None, None, :], float("-inf"))
    probs = logits.softmax(-1)
    ctx = AttentionContext(
        query=query, key=key, q=torch.zeros(bsz, heads, tgt_len, dim // heads, dtype=torch.float64),
        k=torch.zeros(bsz, heads, src_len, dim // heads, dtype=torch.float64), key_padding_mask=pad,
        query_start=0, incremental_state=None, self_attention=False,
    )
    return probs, ctx


def naive_mask(t: CalibrationTransform, ctx):
    """m[b,h,t,s] by explicit loops over heads and positions."""
    with torch.no_grad():
        return _naive_mask(t, ctx)


def _naive_mask(t, ctx):
    wq, bq = t.perturbation.q_proj.weight, t.perturbation.q_proj.bias
    wk, bk = t.perturbation.k_proj.weight, t.perturbation.k_proj.bias
    d = t.head_dim
    tl, bsz, _ = ctx.query.shape
    sl = ctx.key.shape[0]
    m = torch.zeros(bsz, t.num_heads, tl, sl, dtype=torch.float64)
    for b in range(bsz):
        for h in range(t.num_heads):
            rows = slice(h * d, (h + 1) * d)
            for i in range(tl):
                qv = ctx.query[i, b] @ wq[rows].T + bq[rows]
                for s in range(sl):
                    if ctx.key_padding_mask is not None and ctx.key_padding_mask[b, s]:
                        continue  # pad key: m = 0
                    kv = ctx.key[s, b] @ wk[rows].T + bk[rows]
                    m[b, h, i, s] = 1 / (1 + math.exp(-float(qv @ kv) / math.sqrt(d)))
    return m


def transform(**kw):
    t = CalibrationTransform(query_dim=4, key_dim=6, num_heads=2, **kw).double()
    torch.manual_seed(3)
    for p in t.parameters():
        torch.nn.init.normal_(p)  # nonzero biases, so a dropped bias would show
    return t


PAD_RIGHT = torch.tensor([[False, False, False, True, True], [False] * 5])
PAD_LEFT = torch.tensor([[True, True, False, False, False], [False] * 5])


# ----------------------------------------------------------------------------------------------
# formulas (float64, naive)


@pytest.mark.parametrize("pad", [None, PAD_RIGHT, PAD_LEFT])
def test_perturbed_weights_match_formula_and_pads(pad):
    t = transform()
    a, ctx = make_context(pad=pad)
    m = naive_mask(t, ctx)
    with calibration_mode(t, PERTURBED) as cm:
        out = t(a, ctx)
    torch.testing.assert_close(cm.captured[0]["m"], m)
    real = torch.ones(2, 5, dtype=torch.float64) if pad is None else (~pad).double()
    mu0 = real / real.sum(-1, keepdim=True)
    expected = torch.zeros_like(a)
    for b in range(2):
        for h in range(2):
            for i in range(3):
                for s in range(5):
                    expected[b, h, i, s] = m[b, h, i, s] * a[b, h, i, s] + (1 - m[b, h, i, s]) * mu0[b, s]
    torch.testing.assert_close(out, expected)
    # pad keys: m = 0 and no weight (mu0 covers only the real keys)
    if pad is not None:
        assert (m[pad[:, None, None, :].expand_as(m)] == 0).all()
        assert (out[pad[:, None, None, :].expand_as(out)] == 0).all()
    # penalty norm over real keys only
    norm = cm.captured[0]["mask_norm"]
    torch.testing.assert_close(norm, (((1 - m) * real[:, None, None, :]) ** 2).sum(-1).sqrt())


def test_degenerate_full_mask_keeps_attention_and_zero_mask_gives_uniform():
    t = transform()
    a, ctx = make_context(pad=PAD_RIGHT)
    with torch.no_grad():
        t.perturbation.q_proj.weight.zero_()
        t.perturbation.q_proj.bias.zero_()
    # logits 0 -> m = 1/2 exactly on real keys
    with calibration_mode(t, PERTURBED) as cm:
        out = t(a, ctx)
    real = (~PAD_RIGHT).double()[:, None, None, :]
    torch.testing.assert_close(cm.captured[0]["m"], 0.5 * real.expand_as(a))
    torch.testing.assert_close(out, 0.5 * a + 0.5 * real / real.sum(-1, keepdim=True))
    # a constant mask keeps a distribution over the real keys
    torch.testing.assert_close(out.sum(-1), torch.ones_like(out.sum(-1)))


@pytest.mark.parametrize("pad", [None, PAD_LEFT])
@pytest.mark.parametrize("variant", ["fixed", "fixed_softmax", "anneal", "gate"])
def test_calibrated_fusions_match_formula(variant, pad):
    lam = 0.37
    kw = dict(fusion=variant, calibration_lambda=lam, anneal_steps=50.0)
    t = transform(**kw)
    t.set_num_updates(20)
    a, ctx = make_context(pad=pad)
    m = naive_mask(t, ctx)
    with calibration_mode(t) as cm:
        out = t(a, ctx)
    torch.testing.assert_close(cm.captured[0]["m"], m)
    expected = torch.zeros_like(a)
    for b in range(2):
        for h in range(2):
            for i in range(3):
                ac = [a[b, h, i, s] * math.exp(1 - m[b, h, i, s]) for s in range(5)]
                real = [pad is None or not pad[b, s] for s in range(5)]
                if variant == "fixed_softmax":
                    z = [math.exp(a[b, h, i, s] + lam * ac[s]) if real[s] else 0.0 for s in range(5)]
                    row = [v / sum(z) for v in z]
                elif variant == "fixed":
                    row = [a[b, h, i, s] + lam * ac[s] for s in range(5)]
                elif variant == "anneal":
                    gamma = math.exp(-20 / 50.0)
                    row = [gamma * a[b, h, i, s] + (1 - gamma) * ac[s] for s in range(5)]
                else:
                    g = 1 / (1 + math.exp(-float((ctx.query[i, b] @ t.gate.weight[h] + t.gate.bias[h]).detach())))
                    row = [g * a[b, h, i, s] + (1 - g) * ac[s] for s in range(5)]
                expected[b, h, i] = torch.tensor(row, dtype=torch.float64)
    torch.testing.assert_close(out, expected)
    if pad is not None:
        assert (out[pad[:, None, None, :].expand_as(out)] == 0).all()


def test_gradcheck_perturbation_and_gate_parameters():
    for mode, fusion in [(PERTURBED, "gate"), ("calibrated", "gate"), ("calibrated", "fixed"), ("calibrated", "anneal")]:
        t = transform(fusion=fusion, anneal_steps=10.0)
        t.set_num_updates(3)
        a, ctx = make_context(pad=PAD_RIGHT)
        # the calibrated mode uses theta_m as constants by design (checked below); the
        # perturbed mode does not use the gate
        names = [n for n, _ in t.named_parameters()
                 if ("perturbation" in n) == (mode == PERTURBED)]
        params = tuple(dict(t.named_parameters())[n].detach().clone().requires_grad_() for n in names)
        query = ctx.query.clone().requires_grad_()
        key = ctx.key.clone().requires_grad_()
        a = a.clone().requires_grad_()

        def f(*inputs):
            *ps, a_, q_, k_ = inputs
            c = AttentionContext(query=q_, key=k_, q=ctx.q, k=ctx.k, key_padding_mask=ctx.key_padding_mask,
                                 query_start=0, incremental_state=None, self_attention=False)
            with calibration_mode(t, mode, capture=False):
                return torch.func.functional_call(t, dict(zip(names, ps)), (a_, c))

        assert torch.autograd.gradcheck(f, params + (a, query, key))
        if mode != PERTURBED:
            t.zero_grad()
            f(*params, a, query, key).sum().backward()
            assert all(p.grad is None for p in t.perturbation.parameters())


# ----------------------------------------------------------------------------------------------
# the joint criterion: gradient routing


@pytest.mark.parametrize("fusion", ["fixed", "gate"])
def test_one_backward_routes_exact_gradients(fusion):
    d = make_dictionary()
    torch.manual_seed(0)
    model = build_model(["--calibration-fusion", fusion], dictionary=d)
    model.train()
    alpha = 0.7
    crit = make_criterion(d, alpha=alpha)
    sample = make_batch(d)
    theta_m = model.perturbation_parameters()
    theta_m_ids = {id(p) for p in theta_m}
    theta = [p for p in model.parameters() if id(p) not in theta_m_ids]
    assert len(theta_m) == 4 * 2 and len(theta) > 0

    # references, computed independently of the criterion's routing
    net_output = model(**sample["net_input"])
    nmt_loss, _ = crit.compute_loss(model, net_output, sample)
    ref_theta = torch.autograd.grad(nmt_loss, theta, allow_unused=True)
    with calibration_mode(model, PERTURBED) as cm:
        p_output = model(**sample["net_input"])  # no detached parameters here
    p_loss, _ = crit.compute_loss(model, p_output, sample)
    real_tgt = sample["target"].ne(d.pad())
    src_real = sample["net_input"]["src_tokens"].ne(d.pad())[:, None, None, :]
    penalty = 0
    for b in range(real_tgt.size(0)):
        for i in range(real_tgt.size(1)):
            if real_tgt[b, i]:
                per_layer_head = [((1 - c["m"][b, h, i]) ** 2 * src_real[b, 0, 0]).sum().sqrt()
                                  for c in cm.captured for h in range(2)]
                penalty = penalty + sum(per_layer_head) / len(per_layer_head)
    objective = -p_loss + alpha * penalty
    ref_theta_m = torch.autograd.grad(objective, theta_m, retain_graph=True)
    leak = torch.autograd.grad(objective, theta, allow_unused=True)
    # the perturbation objective does depend on the NMT parameters: routing is not trivial
    assert sum(float(g.abs().sum()) for g in leak if g is not None) > 1e-3

    model.zero_grad()
    loss, sample_size, log = crit(model, sample)
    loss.backward()
    torch.testing.assert_close(log["loss"], nmt_loss.detach())
    torch.testing.assert_close(log["mask_penalty"], penalty.detach())
    for p, ref in zip(theta_m, ref_theta_m):
        torch.testing.assert_close(p.grad, ref)
    for p, ref in zip(theta, ref_theta):
        assert p.grad is not None  # DDP without find_unused_parameters needs every gradient
        torch.testing.assert_close(p.grad, ref if ref is not None else torch.zeros_like(p))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in theta_m)


def test_perturbation_weight_reaches_gradients(capsys):
    d = make_dictionary()
    grads = []
    for alpha in (0.0, 2.0):
        torch.manual_seed(0)
        model = build_model(dictionary=d)
        loss, _, _ = make_criterion(d, alpha=alpha)(model, make_batch(d))
        loss.backward()
        grads.append(model.perturbation_parameters()[0].grad.clone())
    assert not torch.allclose(grads[0], grads[1])
    with pytest.raises(SystemExit):  # the declared range, checked by argparse
        make_criterion(d, alpha=-1.0)
    assert "argument --perturbation-weight: invalid value '-1.0': must be >= 0" in capsys.readouterr().err


def test_a_saturated_mask_is_reported_once_in_training(caplog, monkeypatch):
    """A mask at m = 1 everywhere makes calibration a no-op (a^c = a): training says so, once;
    a live mask and validation batches say nothing."""
    monkeypatch.setattr(MaskSaturation, "window", 3)
    d = make_dictionary()
    sample = make_batch(d)

    def warnings():
        return [r for r in caplog.records if "perturbation mask has saturated" in r.getMessage()]

    torch.manual_seed(0)
    live = build_model(dictionary=d)
    crit = make_criterion(d)
    for _ in range(4):
        crit(live, sample)
    assert crit.saturation.batches == 1 and not warnings()  # one window checked; at initialisation m is near 0.5

    saturated = build_model(dictionary=d)
    for t in calibration_modules(saturated):
        for proj in (t.perturbation.q_proj, t.perturbation.k_proj):
            torch.nn.init.zeros_(proj.weight)
            torch.nn.init.constant_(proj.bias, 10.0)  # every logit 100 * sqrt(head_dim): m = 1
    crit = make_criterion(d)
    saturated.eval()
    for _ in range(4):
        crit(saturated, sample)
    assert not warnings()  # validation batches do not count
    saturated.train()
    for _ in range(2):
        crit(saturated, sample)
    assert not warnings()  # not a whole window yet
    for _ in range(7):
        crit(saturated, sample)
    [record] = warnings()
    assert "(--perturbation-weight 0.7; docs/calibration.md#when-the-mask-saturates)" in record.getMessage()


def test_low_precision_training_step_float16():
    """The half-precision path (mask and fusion in float32, cast back) trains: finite gradients
    in every parameter, close to the float64 ones."""
    d = make_dictionary()
    sample = make_batch(d)
    grads = {}
    for dtype in (torch.float64, torch.float16):
        torch.manual_seed(0)
        model = build_model(["--calibration-fusion", "gate"], dictionary=d).to(dtype)
        loss, _, log = make_criterion(d)(model, sample)
        loss.backward()
        grads[dtype] = {n: p.grad for n, p in model.named_parameters()}
        assert all(g is not None and g.dtype == dtype and torch.isfinite(g).all() for g in grads[dtype].values())
    for name, g in grads[torch.float64].items():
        low = grads[torch.float16][name].double()
        assert (low - g).norm() <= 0.1 * g.norm() + 1e-3, name


# ----------------------------------------------------------------------------------------------
# model-level behaviour


def decoder_logits(model, sample):
    model.eval()
    with torch.no_grad():
        return model(**sample["net_input"])[0]


@pytest.mark.parametrize("options", [
    ["--calibration-fusion", "fixed"], ["--calibration-fusion", "fixed_softmax"],
    ["--calibration-fusion", "anneal"], ["--calibration-fusion", "gate"],
])
def test_left_and_right_padded_sources_agree(options):
    d = make_dictionary()
    torch.manual_seed(1)
    model = build_model(options, dictionary=d)
    model.set_num_updates(30)  # anneal: both terms of the mixture matter
    left = make_batch(d, left_pad_source=True)
    right = make_batch(d, left_pad_source=False)
    real = left["target"].ne(d.pad())
    torch.testing.assert_close(decoder_logits(model, left)[real], decoder_logits(model, right)[real])


@pytest.mark.parametrize("options", [
    ["--calibration-fusion", "fixed"], ["--calibration-fusion", "fixed_softmax"],
    ["--calibration-fusion", "anneal"], ["--calibration-fusion", "gate"],
])
def test_incremental_decoding_with_beam_reorder_equals_full_forward(options):
    d = make_dictionary()
    torch.manual_seed(2)
    model = build_model(options, dictionary=d)
    model.set_num_updates(5000)
    model.eval()
    sample = make_batch(d, bsz=4, tgt_len=5)
    net = sample["net_input"]
    prev = net["prev_output_tokens"].clone()
    prev[prev.eq(d.pad())] = d.eos() + 5  # keep every target position real here
    # a beam of 2: sources 0 and 2 each twice, every hypothesis with its own target prefix
    beams = torch.tensor([0, 0, 2, 2])
    net["src_tokens"], net["src_lengths"] = net["src_tokens"][beams], net["src_lengths"][beams]
    # beam search reorders: at step 1 beams move within their sentences (the cached mask keys are
    # shared by a sentence's beams and stay in place); at step 2 the first sentence finishes
    # (fairseq's generator shrinks the batch like this)
    orders = {1: torch.tensor([1, 1, 3, 2]), 2: torch.tensor([2, 3])}
    mask_keys = []
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], net["src_lengths"])
        state = {}
        outs = []
        tokens, src, lengths = prev, net["src_tokens"], net["src_lengths"]
        for step in range(prev.size(1)):
            if step in orders:
                new_order = orders[step].clone()  # a new tensor object per step
                model.decoder.reorder_incremental_state_scripting(state, new_order)
                enc = model.encoder.reorder_encoder_out(enc, new_order)
                tokens, src, lengths = (x.index_select(0, new_order) for x in (tokens, src, lengths))
                outs = [o.index_select(0, new_order) for o in outs]
            out, _ = model.decoder(tokens[:, : step + 1], encoder_out=enc, incremental_state=state)
            outs.append(out[:, -1:])
            mask_keys.append([m.get_incremental_state(state, "mask_key")["mask_key"]
                              for m in model.modules() if isinstance(m, CalibrationTransform)])
        incremental = torch.cat(outs, 1)
        full = model(src, lengths, tokens)[0]
    torch.testing.assert_close(incremental, full)
    assert mask_keys[0]
    assert all(a is b for a, b in zip(mask_keys[0], mask_keys[1]))  # step 1: not copied
    assert all(k.size(0) == 2 for k in mask_keys[2])  # step 2: the finished sentence's rows dropped


def test_every_option_changes_the_output():
    d = make_dictionary()
    sample = make_batch(d)

    def logits(extra, num_updates=0):
        torch.manual_seed(4)
        model = build_model(extra, dictionary=d)
        model.set_num_updates(num_updates)
        return decoder_logits(model, sample)

    base = logits([])
    variants = {
        "fusion anneal": logits(["--calibration-fusion", "anneal"], num_updates=30000),
        "fusion gate": logits(["--calibration-fusion", "gate"]),
        "lambda": logits(["--calibration-lambda", "0.5"]),
        "fixed softmax": logits(["--calibration-fusion", "fixed_softmax"]),
    }
    for name, out in variants.items():
        assert not torch.allclose(base, out), name
    # anneal: the schedule follows the update count, and its time constant matters
    a1 = logits(["--calibration-fusion", "anneal"], num_updates=100)
    a2 = logits(["--calibration-fusion", "anneal"], num_updates=30000)
    a3 = logits(["--calibration-fusion", "anneal", "--calibration-anneal-steps", "50"], num_updates=100)
    assert not torch.allclose(a1, a2) and not torch.allclose(a1, a3)
    # the calibration is really in the decoding path: a plain transformer with the same
    # weights (calibration removed) differs
    torch.manual_seed(4)
    model = build_model([], dictionary=d)
    for layer in model.decoder.layers:
        layer.encoder_attn.post_softmax = None
    assert not torch.allclose(base, decoder_logits(model, sample))


def test_unknown_options_fail_at_build(capsys):
    with pytest.raises(SystemExit):  # argparse choices, through fairseq's own parser
        build_model(["--calibration-fusion", "sum"])
    assert "argument --calibration-fusion: invalid choice: 'sum'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the declared range, checked by argparse too
        build_model(["--calibration-anneal-steps", "0"])
    assert "argument --calibration-anneal-steps: invalid value '0': must be > 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="fusion"):
        CalibrationTransform(4, 4, 2, fusion="sum")


def test_num_updates_buffer_survives_state_dict_and_half():
    torch.manual_seed(0)
    model = build_model(["--calibration-fusion", "anneal"], double=False)
    model.set_num_updates(123456)  # beyond the fp16 range on purpose
    state = model.state_dict()
    fresh = build_model(["--calibration-fusion", "anneal"], double=False)
    fresh.load_state_dict(state)
    fresh.half()
    assert all(int(m.num_updates) == 123456 for m in calibration_modules(fresh))
    assert len(calibration_modules(fresh)) == 2


def test_extra_parameters_at_base_width():
    """Perturbation model at base width: 2 projections (512x512 + bias) per decoder layer."""
    d = make_dictionary(200)
    model = build_model([], arch="transformer_calibrated_base", small=False, dictionary=d, double=False)
    extra = sum(p.numel() for p in model.perturbation_parameters())
    assert extra == 6 * 2 * (512 * 512 + 512)
    gate_model = build_model(["--calibration-fusion", "gate"], arch="transformer_calibrated_base", small=False,
                             dictionary=d, double=False)
    gate_extra = sum(p.numel() for p in gate_model.parameters()) - sum(p.numel() for p in model.parameters())
    assert gate_extra == 6 * (512 * 8 + 8)


def test_export_statistics_formulas():
    from man_recipes.analysis.calibration_stats import entropy_bits, jsd_bits, layer_statistics

    p = torch.tensor([1.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert float(jsd_bits(p, q)) == pytest.approx(1.0)  # disjoint supports: 1 bit
    assert float(jsd_bits(p, p)) == pytest.approx(0.0)
    assert float(entropy_bits(torch.full((4,), 0.25))) == pytest.approx(2.0)
    # one sentence, one head, one target token, keys [real, real, pad]; the unnormalised fused
    # weights (anneal / no-softmax) are renormalised over the real keys
    attn = torch.tensor([[[[0.5, 0.5, 0.0]]]])
    fused = torch.tensor([[[[0.3, 0.1, 0.0]]]])
    m = torch.tensor([[[[0.2, 0.6, 0.0]]]])
    rows, n = layer_statistics([{"attn": attn, "calibrated": fused, "m": m}],
                               torch.tensor([[True, True, False]]), torch.tensor([[True]]))
    fused_n = torch.tensor([0.75, 0.25], dtype=torch.float64)
    mid = (torch.tensor([0.5, 0.5], dtype=torch.float64) + fused_n) / 2
    naive_jsd = 0.5 * sum(0.5 * math.log2(0.5 / mid[i]) for i in range(2)) + \
        0.5 * sum(fused_n[i] * math.log2(fused_n[i] / mid[i]) for i in range(2))
    assert n == 1
    assert rows[0]["jsd"] == pytest.approx(float(naive_jsd))
    assert rows[0]["entropy_original"] == pytest.approx(1.0)
    assert rows[0]["entropy_calibrated"] == pytest.approx(-(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))
    assert rows[0]["mask_mean"] == pytest.approx(0.4)


# ----------------------------------------------------------------------------------------------
# real CLIs


def checkpoint_num_updates(path):
    state = torch.load(path, map_location="cpu", weights_only=False)
    values = {int(v) for k, v in state["model"].items() if k.endswith("post_softmax.num_updates")}
    return values, state


def test_cli_train_resume_generate_export(toy_data_bin, tmp_path):
    save = tmp_path / "ckpt"
    common = [
        "fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_calibrated_small",
        *TINY_MODEL, *TINY_TRAIN, "--save-dir", save, "--calibration-fusion", "anneal",
        "--calibration-anneal-steps", "4",
    ]
    # the criterion of TINY_TRAIN is replaced (argparse: the last one wins)
    crit = ["--criterion", "calibrated_label_smoothed_cross_entropy", "--perturbation-weight", "0.5"]
    out = run_cli(common + crit + ["--max-update", "4"]).stdout
    assert "perturbed_loss" in out and "mask_penalty" in out
    # the trainer hands the model the count of *completed* updates before each update, so
    # the last of 4 updates ran with s = 3 (and generation uses that s)
    values, first = checkpoint_num_updates(save / "checkpoint_last.pt")
    assert values == {3}
    # resume (interrupted run continued), with --update-freq 2: the anneal schedule continues
    out = run_cli(common + crit + ["--max-update", "6", "--update-freq", "2"]).stdout
    assert "Loaded checkpoint" in out and "@ 4 updates" in out
    values, second = checkpoint_num_updates(save / "checkpoint_last.pt")
    assert values == {5}
    pert = [k for k in second["model"] if ".perturbation." in k]
    assert pert and any(not torch.equal(first["model"][k], second["model"][k]) for k in pert)

    gen = run_cli([
        "fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
        "--beam", "3", "--batch-size", "8", "--gen-subset", "valid", "--cpu", "--max-len-b", "12",
    ]).stdout
    hyps = [line for line in gen.splitlines() if line.startswith("H-")]
    assert len(hyps) == 40

    export = tmp_path / "export"
    run_cli([
        sys.executable, "-m", "man_recipes.cli.export_calibration", toy_data_bin, "--path", save / "checkpoint_last.pt",
        "--gen-subset", "valid", "--output-dir", export, "--num-heatmaps", "2", "--cpu",
    ])
    table = (export / "calibration_stats.md").read_text()
    assert "| layer |" in table and table.count("\n| ") >= 3  # header + 2 layers
    assert (export / "calibration_stats.png").stat().st_size > 0
    assert len(list((export / "heatmaps").glob("*.png"))) == 2
    masks = torch.load(export / "masks.pt", weights_only=False)
    assert len(masks) == 40
    first_mask = next(iter(masks.values()))["mask"]
    assert first_mask.dim() == 4 and first_mask.shape[0] == 2  # (layers, heads, tgt, src)
    assert float(first_mask.min()) >= 0 and float(first_mask.max()) <= 1


# ----------------------------------------------------------------------------------------------
# PyTorch DDP (gloo, CPU) without find_unused_parameters


DDP_TIMEOUT_S = 120  # gloo's own default is 30 minutes


def _ddp_worker(rank, world, store_path, result_path):
    import torch.distributed as dist
    from fairseq.distributed import ModuleProxyWrapper

    torch.set_num_threads(1)
    # a file store in the test's tmp_path: no port to find (bind-and-close races), bounded waits
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=DDP_TIMEOUT_S))
    try:
        d = make_dictionary()
        torch.manual_seed(0)
        model = build_model(["--calibration-fusion", "gate"], dictionary=d)
        # fairseq's own wrapping for --ddp-backend pytorch_ddp
        ddp = ModuleProxyWrapper(torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=False))
        assert unwrap_model(ddp) is model
        crit = make_criterion(d)
        for it in range(2):  # DDP raises in the 2nd iteration if a gradient was missing in the 1st
            ddp.zero_grad()
            loss, _, _ = crit(ddp, make_batch(d, bsz=2, seed=10 * it + rank))
            (loss * world).backward()  # DDP averages over ranks; x world gives their sum
        if rank == 0:
            torch.save({k: p.grad.clone() for k, p in model.named_parameters()}, result_path)
        del ddp  # DDP's reducer holds the process group: release it before tearing the group down
        # every rank is done with gloo before any rank tears it down: a rank that destroys the
        # group while its peer still talks to it aborts at exit (SIGABRT, issue 10)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn_and_join(fn, args, nprocs, timeout):
    """torch.multiprocessing.spawn with a deadline: the workers are killed and the test fails
    instead of hanging CI."""
    import time

    import torch.multiprocessing as mp

    context = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{nprocs} worker processes did not finish within {timeout}s")


def test_pytorch_ddp_one_backward_without_find_unused_parameters(tmp_path):
    result = tmp_path / "grads.pt"
    spawn_and_join(_ddp_worker, (2, str(tmp_path / "store"), str(result)), nprocs=2, timeout=2 * DDP_TIMEOUT_S)
    d = make_dictionary()
    torch.manual_seed(0)
    model = build_model(["--calibration-fusion", "gate"], dictionary=d)
    crit = make_criterion(d)
    for rank in range(2):
        loss, _, _ = crit(model, make_batch(d, bsz=2, seed=10 + rank))
        loss.backward()
    ddp_grads = torch.load(result)
    for name, p in model.named_parameters():
        torch.testing.assert_close(ddp_grads[name], p.grad, msg=name)
