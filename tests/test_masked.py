"""The composed arch (``transformer_masked``, issue 78): several mechanisms on one attention.

For combinations of two and three mechanisms on each attention type: the output equals the naive
float64 formula (softmax of the summed logits, then the post-softmax transforms in the documented
order), on the fastest path the core chooses and on the explicit one; gradients pass gradcheck and
the fast path's parameter gradients equal the explicit path's; padding on either side; incremental
decoding with beam reordering equals the full pass.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL, build_fairseq_model
from model_families import tokens

from man_fairseq.modules.biased_attention import AttentionContext, BiasedMultiheadAttention
from man_fairseq.modules.calibration import CalibrationTransform
from man_fairseq.modules.combined_mask import BiasSum, TransformChain
from man_fairseq.modules.diff_window import MultiplicativeWindow

CRITERION = ["--criterion", "calibrated_label_smoothed_cross_entropy"]

# name -> (options, the attention type the combination is on, the mechanisms its parts come from)
COMBINATIONS = {
    # encoder self-attention
    "enc_dman_localness": (["--encoder-sublayers", "dman,ffn", "--localness-attention-types", "encoder_self",
                            "--localness-layers", "all"], "encoder_self"),
    "enc_dman_localness_aw": (["--encoder-sublayers", "dman,ffn", "--localness-attention-types", "encoder_self",
                               "--localness-layers", "all", "--diffwin-encoder", "aw", "--diffwin-layers", "2"],
                              "encoder_self"),
    "enc_sman2_localness_aw_segment": (["--encoder-sublayers", "sman2,ffn", "--static-mask-window", "2",
                                        "--localness-attention-types", "encoder_self", "--localness-layers", "all",
                                        "--localness-window", "head", "--diffwin-encoder", "aw",
                                        "--diffwin-encoder-mask", "segment", "--diffwin-segment-size", "2",
                                        "--diffwin-layers", "2"], "encoder_self"),
    "enc_localness_mw": (["--localness-attention-types", "encoder_self", "--localness-layers", "all",
                          "--localness-window", "layer", "--diffwin-encoder", "mw", "--diffwin-layers", "2"],
                         "encoder_self"),
    "enc_dman_localness_mw": (["--encoder-sublayers", "dman,ffn", "--localness-attention-types", "encoder_self",
                               "--localness-layers", "all", "--diffwin-encoder", "mw", "--diffwin-layers", "2"],
                              "encoder_self"),
    # decoder self-attention
    "dec_dman_localness": (["--decoder-sublayers", "dman,cross,ffn", "--localness-attention-types", "decoder_self",
                            "--localness-layers", "all"], "decoder_self"),
    "dec_dman_localness_mw": (["--decoder-sublayers", "dman,cross,ffn", "--localness-attention-types",
                               "decoder_self", "--localness-layers", "all", "--diffwin-decoder", "mw",
                               "--diffwin-layers", "2", "--diffwin-mw-renormalize"], "decoder_self"),
    "dec_localness_aw": (["--localness-attention-types", "decoder_self", "--localness-layers", "all",
                          "--localness-window", "fixed", "--diffwin-decoder", "aw", "--diffwin-layers", "2"],
                         "decoder_self"),
    # cross-attention
    "cross_localness_calibration": (["--localness-attention-types", "cross", "--localness-layers", "all",
                                     "--calibration-layers", "all", "--calibration-fusion", "gate"], "cross"),
    "cross_aw_calibration": (["--diffwin-cross", "aw", "--diffwin-cross-mask", "segment", "--diffwin-layers", "2",
                              "--calibration-layers", "all", "--calibration-fusion", "anneal",
                              "--calibration-anneal-steps", "10"], "cross"),
    "cross_localness_mw_calibration": (["--localness-attention-types", "cross", "--localness-layers", "all",
                                        "--diffwin-cross", "mw", "--diffwin-layers", "2",
                                        "--calibration-layers", "all", "--calibration-fusion", "fixed_softmax"],
                                       "cross"),
    "cross_localness_aw_calibration": (["--localness-attention-types", "cross", "--localness-layers", "all",
                                        "--diffwin-cross", "aw", "--diffwin-layers", "2",
                                        "--calibration-layers", "all"], "cross"),
}


def build(options, backend="auto", seed=0):
    torch.manual_seed(seed)
    extra = TINY_MODEL + ["--dropout", "0", "--activation-fn", "gelu", "--attention-backend", backend, *options]
    if "--calibration-layers" in options:
        extra += CRITERION
    model, task, _ = build_fairseq_model("transformer_masked_base", extra, dict_size=40)
    model.set_num_updates(7)  # anneal: both terms of its mixture matter
    return model.double(), task


def attentions_of(model, kind):
    """The attentions of type ``kind``, layer by layer (MAN's layer form or fairseq's)."""
    layers = model.encoder.layers if kind == "encoder_self" else model.decoder.layers
    return [module for layer in layers for module in layer.modules()
            if isinstance(module, BiasedMultiheadAttention) and module.encoder_decoder_attention == (kind == "cross")]


def parts(attention):
    biases = attention.bias_module
    biases = [] if biases is None else list(biases.biases) if isinstance(biases, BiasSum) else [biases]
    transforms = attention.post_softmax
    transforms = [] if transforms is None else list(transforms.transforms) \
        if isinstance(transforms, TransformChain) else [transforms]
    return biases, transforms


def naive_output(attention, query, key, key_padding_mask, attn_mask):
    """out_proj((calib ∘ mw)(softmax(q k^T / sqrt(d) + Σ biases + causal + padding)) v), in float64."""
    bsz = query.size(1)
    shape = attention._shape
    q, k, v = shape(attention.q_proj(query), bsz), shape(attention.k_proj(key), bsz), shape(attention.v_proj(key), bsz)
    ctx = AttentionContext(query=query, key=key, q=q, k=k, key_padding_mask=key_padding_mask, query_start=0,
                           incremental_state=None, self_attention=attention.self_attention)
    biases, transforms = parts(attention)
    scores = torch.matmul(q, k.transpose(-1, -2)) * attention.scaling
    for bias in biases:
        scores = scores + bias(ctx)
    if attn_mask is not None:
        scores = scores + attn_mask
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    probs = F.softmax(scores, dim=-1)
    for transform in transforms:
        probs = transform(probs, ctx)
    out = torch.matmul(probs, v).permute(2, 0, 1, 3).reshape(query.shape)
    return attention.out_proj(out)


def capture_calls(model, attention, sample):
    """The (query, key, key_padding_mask, attn_mask) ``attention`` is called with in a full pass."""
    calls = []

    def hook(module, args, kwargs):
        names = ("query", "key", "value", "key_padding_mask", "incremental_state", "need_weights", "static_kv",
                 "attn_mask")
        given = dict(zip(names, args), **kwargs)
        calls.append((given["query"], given["key"], given.get("key_padding_mask"), given.get("attn_mask")))

    handle = attention.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**sample)
    finally:
        handle.remove()
    return calls[0]


def padded_sample(task, left, lengths=(7, 4, 6), tgt_lengths=(5, 3, 4), seed=0):
    d = task.source_dictionary
    src = tokens(d, lengths, left, seed)
    prev = tokens(d, tgt_lengths, False, seed + 1)
    return {"src_tokens": src, "src_lengths": torch.tensor(lengths), "prev_output_tokens": prev}


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_combination_equals_the_naive_formula_on_the_fast_and_explicit_paths(name):
    options, kind = COMBINATIONS[name]
    model, task = build(options)
    model.eval()
    sample = padded_sample(task, left=True)
    for attention in attentions_of(model, kind):
        biases, transforms = parts(attention)
        assert len(biases) + len(transforms) + (attention.__class__ is not BiasedMultiheadAttention) >= 2
        # the documented order: a multiplicative window before calibration
        kinds = [type(t) for t in transforms]
        if CalibrationTransform in kinds:
            assert kinds.index(CalibrationTransform) == len(kinds) - 1
        query, key, pad, attn_mask = capture_calls(model, attention, sample)
        key = query if key is None else key
        with torch.no_grad():
            want = naive_output(attention, query, key, pad, attn_mask)
            # flex: eager on the CPU (no backward needed here); with a transform it falls back, saying so
            for backend in ("auto", "explicit", "flex"):
                attention.attention_backend = backend
                got, _ = attention(query, key, key, key_padding_mask=pad, attn_mask=attn_mask, need_weights=False,
                                   static_kv=kind == "cross")
                real = slice(None)  # pad queries of a self-attention are unused; compare the real ones
                if kind == "encoder_self":
                    real = ~pad.t()
                torch.testing.assert_close(got[real], want[real], rtol=1e-10, atol=1e-10, msg=f"{name} {backend}")


def test_the_fast_path_is_the_one_the_mechanisms_allow():
    """A lone localness bias keeps its extra-columns kernel; a learnable sum takes the fused CPU
    kernel with the bias's gradient; a post-softmax transform takes the written-out softmax."""
    model, task = build(COMBINATIONS["enc_dman_localness"][0] + ["--decoder-sublayers", "san,cross,ffn",
                                                                   "--localness-attention-types",
                                                                   "encoder_self,decoder_self"])
    model.train()
    model(**padded_sample(task, left=True))[0].sum().backward()
    enc = attentions_of(model, "encoder_self")[0]
    dec = attentions_of(model, "decoder_self")[0]
    assert enc.last_kernel.path == "fused-bias-grad"  # DMAN + localness, both learn
    assert dec.last_kernel.path == "extended"  # localness alone
    model.eval()
    enc.attention_backend = "flex"
    with torch.no_grad():
        model(**padded_sample(task, left=True))
    assert enc.last_kernel.path == "flex"  # DMAN + localness: each part's score modification
    model, task = build(COMBINATIONS["cross_localness_calibration"][0])
    model.eval()
    with torch.no_grad():
        model(**padded_sample(task, left=True))
    assert attentions_of(model, "cross")[0].last_kernel.path == "explicit"


@pytest.mark.parametrize("name", ["enc_dman_localness_aw", "dec_dman_localness_mw", "cross_localness_mw_calibration",
                                  "enc_sman2_localness_aw_segment"])
def test_gradcheck_and_fast_path_parameter_gradients(name):
    options, kind = COMBINATIONS[name]
    model, task = build(options)
    model.train()
    sample = padded_sample(task, left=False, lengths=(4, 3), tgt_lengths=(3, 2))
    attention = attentions_of(model, kind)[0]
    query, key, pad, attn_mask = capture_calls(model, attention, sample)
    query = query.detach().requires_grad_()
    key = query if key is None or kind != "cross" else key.detach()

    def f(x):
        k = x if kind != "cross" else key
        return attention(x, k, k, key_padding_mask=pad, attn_mask=attn_mask, need_weights=False,
                         static_kv=kind == "cross")[0]

    assert torch.autograd.gradcheck(f, (query,), eps=1e-6, atol=1e-6)
    grads = {}
    for backend in ("auto", "explicit"):
        attention.attention_backend = backend
        attention.zero_grad()
        f(query).pow(2).sum().backward()
        grads[backend] = {n: p.grad.clone() for n, p in attention.named_parameters() if p.grad is not None}
    assert grads["auto"].keys() == grads["explicit"].keys() and len(grads["auto"]) > 4
    for n in grads["auto"]:
        torch.testing.assert_close(grads["auto"][n], grads["explicit"][n], rtol=1e-9, atol=1e-10, msg=n)


ALL_THREE = ["--encoder-sublayers", "dman,san,ffn", "--decoder-sublayers", "dman,cross,ffn",
             "--localness-attention-types", "encoder_self,decoder_self,cross", "--localness-layers", "all",
             "--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw", "--diffwin-layers", "1",
             "--calibration-layers", "all", "--calibration-fusion", "anneal", "--calibration-anneal-steps", "10"]


# the same on the Transformer's sublayer orders: fairseq's layer form on both sides
ALL_THREE_FAIRSEQ_LAYERS = ALL_THREE[4:]


@pytest.mark.parametrize("options", [ALL_THREE, ALL_THREE + ["--relative-positions"], ALL_THREE_FAIRSEQ_LAYERS,
                                     COMBINATIONS["cross_localness_mw_calibration"][0]])
def test_left_and_right_padding_agree(options):
    model, task = build(options)
    model.eval()
    with torch.no_grad():
        left = model(**padded_sample(task, left=True))[0]
        right = model(**padded_sample(task, left=False))[0]
    real = padded_sample(task, left=False)["prev_output_tokens"].ne(task.target_dictionary.pad())
    torch.testing.assert_close(left[real], right[real], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("options", [ALL_THREE, ALL_THREE + ["--relative-positions"],
                                     ALL_THREE_FAIRSEQ_LAYERS + ["--relative-positions"]])
def test_incremental_decoding_with_beam_reorder_equals_the_full_pass(options):
    model, task = build(options)
    model.eval()
    d = task.target_dictionary
    # a beam of 2: each source twice, every hypothesis with its own target prefix
    src = tokens(d, (6, 4), True, 3).repeat_interleave(2, dim=0)
    lengths = src.ne(d.pad()).sum(1)
    prev = torch.randint(d.nspecial, len(d), (4, 5))
    prev[:, 0] = d.eos()
    model.set_beam_size(2)
    orders = {2: torch.tensor([1, 0, 3, 3]), 3: torch.tensor([2, 3])}
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        state, outs = {}, []
        for step in range(prev.size(1)):
            if step in orders:
                order = orders[step]
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                prev, src, lengths = (x.index_select(0, order) for x in (prev, src, lengths))
                outs = [o.index_select(0, order) for o in outs]
            out, _ = model.decoder(prev[:, : step + 1], encoder_out=enc, incremental_state=state)
            outs.append(out[:, -1:])
        full = model(src, lengths, prev)[0]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-9, atol=1e-9)


def test_a_multiplicative_window_applies_before_calibration():
    model, _ = build(COMBINATIONS["cross_localness_mw_calibration"][0])
    chain = attentions_of(model, "cross")[0].post_softmax
    assert [type(t) for t in chain.transforms] == [MultiplicativeWindow, CalibrationTransform]
