"""--attention-backend (issue 13): the kernel policy, FlexAttention == explicit path, the option wiring.

FlexAttention has no backward on CPU, so its CPU checks are forward passes under ``no_grad``
(eager, unfused); gradients are compared in tests/gpu/.
"""

import logging

import pytest
import torch
from conftest import TINY_MODEL, build_fairseq_model
from torch._dynamo.exc import BackendCompilerFailed

from man_fairseq.modules import attention_backend as backends
from man_fairseq.modules import flex_backend as flex
from man_fairseq.modules.attention_backend import (
    CUDNN,
    EFFICIENT,
    EXPLICIT,
    EXTENDED,
    FLASH,
    FLEX,
    FUSED_BIAS_GRAD,
    MATH,
    SDPA,
    choose_kernel,
    prepare_sdpa_mask,
)
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from man_fairseq.modules.flex_backend import FlexMods, bucket_batch, bucket_length, is_future_mask, pad_dims
from man_fairseq.modules.localness import WINDOW_STRATEGIES, LocalnessBias
from man_fairseq.modules.mask_bias import DynamicMaskBias, StaticWindowBias

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


# ---------------------------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, path, kernels",
    [
        # auto on CUDA: any mask -> memory-efficient (math fallback), training and evaluation alike
        (dict(backend="auto", device_type="cuda", dtype=BF16, has_mask=True, requires_grad=True), SDPA, (EFFICIENT, MATH)),
        (dict(backend="auto", device_type="cuda", dtype=BF16, has_mask=True, requires_grad=False), SDPA, (EFFICIENT, MATH)),
        (dict(backend="auto", device_type="cuda", dtype=F16, has_mask=True), SDPA, (EFFICIENT, MATH)),
        (dict(backend="auto", device_type="cuda", dtype=F32, has_mask=True), SDPA, (EFFICIENT, MATH)),
        # plain attention: flash allowed in half precision only; cuDNN never (a graph per new shape)
        (dict(backend="auto", device_type="cuda", dtype=F16, has_mask=False), SDPA, (FLASH, EFFICIENT, MATH)),
        (dict(backend="auto", device_type="cuda", dtype=BF16, has_mask=False), SDPA, (FLASH, EFFICIENT, MATH)),
        (dict(backend="auto", device_type="cuda", dtype=F32, has_mask=False), SDPA, (EFFICIENT, MATH)),
        (dict(backend="auto", device_type="cuda", dtype=F64, has_mask=True), SDPA, (MATH,)),
        # sdpa: the dispatcher, but never cuDNN with a float mask
        (dict(backend="sdpa", device_type="cuda", dtype=BF16, has_mask=True), SDPA, (FLASH, EFFICIENT, MATH)),
        (dict(backend="sdpa", device_type="cuda", dtype=BF16, has_mask=False), SDPA, ()),
        # CPU: dispatcher free (no cuDNN kernel there)
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True), SDPA, ()),
        (dict(backend="sdpa", device_type="cpu", dtype=F64, has_mask=True), SDPA, ()),
        # explicit, and anything that needs the probabilities
        (dict(backend="explicit", device_type="cuda", dtype=BF16, has_mask=True), EXPLICIT, ()),
        (dict(backend="auto", device_type="cuda", dtype=BF16, has_mask=True, needs_probabilities=True), EXPLICIT, ()),
        (dict(backend="flex", device_type="cuda", dtype=BF16, has_mask=True, flex_supported=True,
              needs_probabilities=True), EXPLICIT, ()),
        # flex where it can run
        (dict(backend="flex", device_type="cuda", dtype=BF16, has_mask=True, flex_supported=True, requires_grad=True), FLEX, ()),
        (dict(backend="flex", device_type="cpu", dtype=F64, has_mask=True, flex_supported=True), FLEX, ()),
        # flex falls back to auto: no flex_mods, dropout, CPU backward
        (dict(backend="flex", device_type="cuda", dtype=BF16, has_mask=True, flex_supported=False), SDPA, (EFFICIENT, MATH)),
        (dict(backend="flex", device_type="cuda", dtype=BF16, has_mask=True, flex_supported=True, dropout=True),
         SDPA, (EFFICIENT, MATH)),
        (dict(backend="flex", device_type="cpu", dtype=F32, has_mask=True, flex_supported=True, requires_grad=True), SDPA, ()),
        # ... and a head dimension under 16 on CUDA (flex's compiled kernel rejects it); 16 runs
        (dict(backend="flex", device_type="cuda", dtype=F16, has_mask=True, flex_supported=True, head_dim=8),
         SDPA, (EFFICIENT, MATH)),
        (dict(backend="flex", device_type="cuda", dtype=F16, has_mask=True, flex_supported=True, head_dim=16), FLEX, ()),
        (dict(backend="flex", device_type="cpu", dtype=F64, has_mask=True, flex_supported=True, head_dim=8), FLEX, ()),
        # a bias written as extra query/key dimensions (localness): the same SDPA kernels on the
        # extended q/k, in fp32/fp64 only; explicit, probabilities and a running flex take precedence
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, requires_grad=True, extendable=True), EXTENDED, ()),
        (dict(backend="sdpa", device_type="cpu", dtype=F64, has_mask=True, extendable=True), EXTENDED, ()),
        (dict(backend="auto", device_type="cuda", dtype=F32, has_mask=True, extendable=True), EXTENDED, (EFFICIENT, MATH)),
        (dict(backend="auto", device_type="cuda", dtype=BF16, has_mask=True, extendable=True), SDPA, (EFFICIENT, MATH)),
        (dict(backend="sdpa", device_type="cuda", dtype=F16, has_mask=True, extendable=True), SDPA, (FLASH, EFFICIENT, MATH)),
        (dict(backend="flex", device_type="cpu", dtype=F32, has_mask=True, flex_supported=True, requires_grad=True,
              extendable=True), EXTENDED, ()),
        (dict(backend="flex", device_type="cuda", dtype=F32, has_mask=True, flex_supported=True, extendable=True), FLEX, ()),
        (dict(backend="explicit", device_type="cpu", dtype=F32, has_mask=True, extendable=True), EXPLICIT, ()),
        (dict(backend="auto", device_type="cpu", dtype=F32, has_mask=True, needs_probabilities=True, extendable=True),
         EXPLICIT, ()),
    ],
)
def test_kernel_policy(kwargs, path, kernels):
    choice = choose_kernel(**kwargs)
    assert (choice.path, choice.sdpa_backends) == (path, kernels), choice.reason
    if kwargs["backend"] == "flex" and path != FLEX:
        assert choice.reason.startswith("flex") or path == EXPLICIT


def test_cudnn_never_sees_a_float_mask():
    """The guard against pytorch#196678 / #191612, over every option combination."""
    for backend in ("auto", "sdpa", "flex"):
        for dtype in (F16, BF16, F32):
            for requires_grad in (False, True):
                for flex_supported in (False, True):
                    choice = choose_kernel(backend, "cuda", dtype, has_mask=True, requires_grad=requires_grad,
                                           flex_supported=flex_supported)
                    assert CUDNN not in choice.sdpa_backends, (backend, dtype, choice)
                    if choice.path == SDPA:
                        assert choice.sdpa_backends, "a masked call must never leave the dispatcher free on CUDA"


def test_auto_never_allows_cudnn():
    """auto leaves cuDNN out with or without a mask: on plain attention it builds an execution graph
    per new shape (results/gpu/2026-11-29-h200.md), and training batches rarely repeat one."""
    for backend in ("auto", "flex"):
        for dtype in (F16, BF16, F32):
            for has_mask in (False, True):
                choice = choose_kernel(backend, "cuda", dtype, has_mask=has_mask, flex_supported=False)
                assert choice.path == SDPA and choice.sdpa_backends, (backend, dtype, has_mask, choice)
                assert CUDNN not in choice.sdpa_backends, (backend, dtype, has_mask, choice)


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        choose_kernel("fast", "cpu", F32, has_mask=False)


def test_sdpa_mask_is_cast_and_last_dim_contiguous():
    q = torch.zeros(2, 3, 4, 8, dtype=BF16)
    mask = torch.randn(2, 1, 5, 4).transpose(-1, -2)  # fp32, stride(-1) != 1
    out = prepare_sdpa_mask(mask, q)
    assert out.dtype == BF16 and out.stride(-1) == 1
    torch.testing.assert_close(out.float(), mask.to(BF16).float())
    broadcast = torch.zeros(1, 1, 4, 5, dtype=BF16).expand(2, 3, 4, 5)
    kept = prepare_sdpa_mask(broadcast, q)
    assert kept.stride()[:2] == (0, 0), "broadcast dims must not be materialised"
    assert prepare_sdpa_mask(None, q) is None


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["contiguous_branch", "cast_and_contiguous"])
def test_sdpa_mask_keeps_broadcast_dims_on_every_branch(dtype):
    """A broadcast mask whose last dim is strided takes the contiguous branch (and the cast one
    for a half q): neither may materialise the broadcast (B, H) dims."""
    q = torch.zeros(2, 3, 4, 8, dtype=dtype)
    base = torch.randn(1, 1, 5, 4)
    mask = base.transpose(-1, -2).expand(2, 3, 4, 5)  # strides (0, 0, 1, 4)
    assert mask.stride(-1) != 1
    out = prepare_sdpa_mask(mask, q)
    assert out.dtype == dtype and out.stride(-1) == 1 and out.shape == mask.shape
    assert out.stride()[:2] == (0, 0), out.stride()
    torch.testing.assert_close(out.float(), mask.to(dtype).float())
    # a broadcast last dim is made real (the kernels need stride(-1) == 1)
    keys_broadcast = torch.randn(2, 1, 4, 1).expand(2, 3, 4, 5)
    out = prepare_sdpa_mask(keys_broadcast, q)
    assert out.stride(-1) == 1 and out.stride(1) == 0
    torch.testing.assert_close(out.float(), keys_broadcast.to(dtype).float())


# ---------------------------------------------------------------------------------------------
# bucketing helpers
# ---------------------------------------------------------------------------------------------

def test_bucket_lengths():
    assert [bucket_length(n) for n in (1, 16, 17, 33, 64, 65, 128, 129, 300)] == [16, 16, 32, 64, 64, 128, 128, 256, 384]
    assert bucket_length(70, multiple=64) == 128 and bucket_length(40, multiple=64) == 64
    # lengths 1..1024 fall into 3 small buckets + 8 multiples of 128: the bound on flex compilations
    assert len({bucket_length(n) for n in range(1, 1025)}) == 11
    with pytest.raises(ValueError):
        bucket_length(0)


def test_bucket_batch():
    assert [bucket_batch(n) for n in (1, 2, 3, 4, 5, 8, 9, 200)] == [1, 2, 4, 4, 8, 8, 16, 256]
    # batch sizes 1..512 fall into 10 buckets
    assert len({bucket_batch(n) for n in range(1, 513)}) == 10
    with pytest.raises(ValueError):
        bucket_batch(0)


def test_batch_is_bucketed_once_kernels_are_static():
    runner = flex.FlexRunner()
    runner.compiling = True
    assert runner.shape_for(3, 17, 40, "cpu") == flex.FlexShape(3, 32, 64)  # dynamic shapes: batch kept
    runner.dynamic = False  # after the dynamic-shape compilation failed
    assert runner.shape_for(3, 17, 40, "cpu") == flex.FlexShape(4, 32, 64)
    runner.compiling = False  # eager: nothing padded
    assert runner.shape_for(3, 17, 40, "cpu") == flex.FlexShape(3, 17, 40)


def test_pad_dims():
    x = torch.arange(6.0).view(2, 3)
    y = pad_dims(x, {1: 5}, value=-1.0)
    assert y.shape == (2, 5) and (y[:, 3:] == -1).all() and torch.equal(y[:, :3], x)
    assert pad_dims(x, {0: 2}) is x
    with pytest.raises(ValueError):
        pad_dims(x, {1: 2})
    both = pad_dims(x, {0: 4, 1: 5}, value=-1.0)  # the batch and a length at once
    assert both.shape == (4, 5) and torch.equal(both[:2, :3], x)
    assert (both[2:] == -1).all() and (both[:, 3:] == -1).all()


def test_future_mask_recognition():
    t = 5
    future = torch.triu(torch.full((t, t), float("-inf")), 1)
    assert is_future_mask(future, 0)
    assert is_future_mask(torch.isneginf(future), 0)
    assert not is_future_mask(future, 1)  # a shifted window is not the plain causal mask
    assert not is_future_mask(future + 0.5, 0)  # extra additive values must be kept
    assert not is_future_mask(torch.zeros(t, t), 0)
    # queries 3..4 of 5 keys (a chunk after a cache)
    assert is_future_mask(torch.triu(torch.full((2, 5), float("-inf")), 4), 3)


def test_flex_mods_compose():
    mods = FlexMods(score_mods=[lambda s, b, h, q, k: s + 1.0, lambda s, b, h, q, k: s * 2.0],
                    mask_mods=[lambda b, h, q, k: q >= k, lambda b, h, q, k: k > 0])
    one = torch.tensor(0)
    assert float(mods.score_mod()(torch.tensor(1.0), one, one, one, one)) == 4.0
    keep = mods.mask_mod()
    assert bool(keep(one, one, torch.tensor(2), torch.tensor(1)))
    assert not bool(keep(one, one, torch.tensor(2), torch.tensor(0)))
    assert FlexMods().score_mod() is None and FlexMods().mask_mod() is None


def test_flex_runner_falls_back_to_static_compilation():
    """The dynamic-shape compile failing (torch 2.13 CPU inductor) must not lose the call."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled_with = []

    def fake_compile(fn, dynamic=None):
        compiled_with.append(dynamic)

        def run(*args, **kwargs):
            if dynamic is None:
                raise BackendCompilerFailed(fn, RuntimeError("C++ compile error"), None)
            return fn(*args, **kwargs)

        return run

    runner = flex.FlexRunner()
    runner.compile = fake_compile
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) for n in (5, 7, 7))
    # the warning names the error and its first line, for a report from a node one cannot log into
    with pytest.warns(UserWarning, match=r"dynamic-shape compilation failed \(RuntimeError: C\+\+ compile error\)"):
        out = runner(q, k, v, None, None, 0.5, compiled=True)
    torch.testing.assert_close(out, flex_attention(q, k, v, scale=0.5))
    assert compiled_with == [None, False] and runner.dynamic is False
    runner(q[:1], k[:1], v[:1], None, None, 0.5, compiled=True)
    assert compiled_with == [None, False] and len(runner.signatures) == 2  # reused, new shape counted


@pytest.mark.parametrize("error", [
    RuntimeError("IndexError in a score_mod while tracing"),
    BackendCompilerFailed(None, torch.OutOfMemoryError("out of memory"), None),
], ids=["score_mod_bug", "out_of_memory"])
def test_flex_runner_does_not_mistake_other_errors_for_dynamic_shapes(error):
    def failing_compile(fn, dynamic=None):
        def run(*args, **kwargs):
            raise error

        return run

    runner = flex.FlexRunner()
    runner.compile = failing_compile
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(type(error)):
        runner(q, q, q, None, None, 0.5, compiled=True)
    assert runner.dynamic is None, "retried with static shapes"


def test_flex_runner_limit_lifts_dynamos_per_function_cap_too():
    """dynamo also stops at ``accumulated_recompile_limit`` compilations of one function (256 in
    torch 2.13): a runner limit above it must raise that one as well."""
    runner = flex.FlexRunner()
    runner.recompile_limit = 400
    with runner._limits():
        config = torch._dynamo.config
        assert config.recompile_limit == 400 and config.accumulated_recompile_limit >= 400
        assert config.fail_on_recompile_limit_hit


def test_flex_runner_fails_loudly_at_the_recompile_limit():
    """Static kernels past the limit raise instead of dynamo's silent eager fallback."""
    from functools import partial

    from torch._dynamo.exc import FailOnRecompileLimitHit

    runner = flex.FlexRunner()
    runner.compile = partial(torch.compile, backend="eager")  # graphs counted, no C++ codegen
    runner.dynamic, runner.recompile_limit = False, 2
    for n in (16, 32):
        q = torch.zeros(1, 1, n, 16)
        runner(q, q, q, None, None, 0.25, compiled=True)
    q = torch.zeros(1, 1, 64, 16)
    with pytest.raises(FailOnRecompileLimitHit):
        runner(q, q, q, None, None, 0.25, compiled=True)


# ---------------------------------------------------------------------------------------------
# flex == explicit, one attention module (float64, forward: no flex backward on CPU)
# ---------------------------------------------------------------------------------------------

C, H = 16, 4


def future_mask(t, dtype=F64):
    return torch.triu(torch.full((t, t), float("-inf"), dtype=dtype), 1)


def padding(lengths, left):
    t = max(lengths)
    pad = torch.zeros(len(lengths), t, dtype=torch.bool)
    for i, n in enumerate(lengths):
        if left:
            pad[i, : t - n] = True
        else:
            pad[i, n:] = True
    return pad


def make_attention(bias_module, cross=False, seed=0):
    torch.manual_seed(seed)
    attn = BiasedMultiheadAttention(C, H, self_attention=not cross, encoder_decoder_attention=cross,
                                    bias_module=bias_module)
    return attn.double().eval()


def run(attn, backend, x, pad=None, attn_mask=None, key=None):
    attn.attention_backend = backend
    with torch.no_grad():
        kv = x if key is None else key
        out, _ = attn(x, kv, kv, key_padding_mask=pad, attn_mask=attn_mask, need_weights=False)
    return out, attn.last_kernel


def assert_backends_agree(attn, x, pad=None, attn_mask=None, key=None, real_queries=None, bucketed=(False, True)):
    ref, choice = run(attn, "explicit", x, pad, attn_mask, key)
    assert choice.path == EXPLICIT
    for bucketing in bucketed:
        # bucketed: lengths and (as with static kernels) the batch, 3 sentences padded to 4
        flex.FLEX_RUNNER.bucketing = flex.FLEX_RUNNER.batch_bucketing = bucketing
        try:
            out, choice = run(attn, "flex", x, pad, attn_mask, key)
        finally:
            flex.FLEX_RUNNER.bucketing = flex.FLEX_RUNNER.batch_bucketing = None
        assert choice.path == FLEX, choice.reason
        if real_queries is not None:
            out, ref_ = out[real_queries], ref[real_queries]
        else:
            ref_ = ref
        torch.testing.assert_close(out, ref_, rtol=1e-10, atol=1e-10)
    sdpa, choice = run(attn, "sdpa", x, pad, attn_mask, key)
    assert choice.path == (EXTENDED if hasattr(attn.bias_module, "extended_query_key") else SDPA), choice.reason
    torch.testing.assert_close(sdpa, ref, rtol=1e-10, atol=1e-10)


def real_query_mask(pad):
    return ~pad.t()  # (T, B) like the output's first two dims


def inputs(t, b=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, b, C, generator=g, dtype=F64)


@pytest.mark.parametrize("left", [True, False])
def test_flex_dman_encoder_with_padding(left):
    attn = make_attention(DynamicMaskBias(C, H, max_relative_distance=3))
    pad = padding([9, 5, 7], left)
    assert_backends_agree(attn, inputs(9), pad, real_queries=real_query_mask(pad))


def test_flex_dman_causal_decoder_and_incremental_steps():
    attn = make_attention(DynamicMaskBias(C, H, max_relative_distance=3))
    x = inputs(8)
    assert_backends_agree(attn, x, attn_mask=future_mask(8))
    full, _ = run(attn, "flex", x, attn_mask=future_mask(8))
    state, steps = {}, []
    attn.attention_backend = "flex"
    with torch.no_grad():
        for t in range(8):
            out, _ = attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)
            assert attn.last_kernel.path == FLEX
            steps.append(out)
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("window", ["sqrt_half_length", 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("left", [True, False])
def test_flex_static_windows(window, causal, left):
    attn = make_attention(StaticWindowBias(window, causal=causal))
    pad = padding([11, 4, 8], left)
    mask = future_mask(11) if causal else None
    # rows of pad queries may see no key at all: flex gives them 0, the dense path a uniform row
    assert_backends_agree(attn, inputs(11), pad, attn_mask=mask, real_queries=real_query_mask(pad))


@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
@pytest.mark.parametrize("left", [True, False])
def test_flex_localness_self_attention(window, left):
    attn = make_attention(LocalnessBias(C, H, window=window, fixed_window=3.0, head_window_max=6.0))
    pad = padding([10, 6, 3], left)
    assert_backends_agree(attn, inputs(10), pad, real_queries=real_query_mask(pad))


@pytest.mark.parametrize("window", WINDOW_STRATEGIES)
def test_flex_localness_causal_and_cross(window):
    causal = make_attention(LocalnessBias(C, H, window=window, causal=True, fixed_window=3.0, head_window_max=6.0))
    assert_backends_agree(causal, inputs(7), attn_mask=future_mask(7))
    cross = make_attention(LocalnessBias(C, H, window=window), cross=True, seed=2)
    pad = padding([9, 4, 6], left=True)
    assert_backends_agree(cross, inputs(5), pad, key=inputs(9, seed=4))


def test_flex_plain_attention_with_a_general_float_mask():
    """A mask that is not fairseq's causal mask is added as a (T, S) table, values kept."""
    attn = make_attention(None)
    g = torch.Generator().manual_seed(3)
    mask = torch.randn(6, 6, generator=g, dtype=F64)
    mask[0, 1:] = float("-inf")
    assert_backends_agree(attn, inputs(6), attn_mask=mask)


def test_static_kernels_serve_every_batch_size_of_a_bucket(monkeypatch):
    """Once kernels are static, batches of 5..8 sentences share one flex kernel and one block
    mask (6 graphs unpadded, measured), and the outputs stay the explicit path's."""
    from functools import partial

    runner = flex.FlexRunner()
    runner.compile = partial(torch.compile, backend="eager")  # graphs counted, no C++ codegen
    runner.compiling, runner.dynamic = True, False
    monkeypatch.setattr(flex, "FLEX_RUNNER", runner)
    attn = make_attention(DynamicMaskBias(C, H, max_relative_distance=3))
    torch._dynamo.reset()
    before = runner.recompiles()
    for bsz in (5, 6, 7, 8):
        x = inputs(9, b=bsz, seed=bsz)
        pad = padding([9] + [9 - i % 4 for i in range(1, bsz)], left=bsz % 2 == 0)
        ref, _ = run(attn, "explicit", x, pad)
        out, choice = run(attn, "flex", x, pad)
        assert choice.path == FLEX
        real = real_query_mask(pad)
        torch.testing.assert_close(out[real], ref[real], rtol=1e-10, atol=1e-10)
    assert runner.recompiles() - before == 2
    torch._dynamo.reset()


def test_flex_falls_back_where_it_cannot_run():
    attn = make_attention(DynamicMaskBias(C, H))
    attn.attention_backend = "flex"
    x = inputs(5)
    attn(x, x, x, need_weights=False)  # CPU with gradients: no flex backward; auto's path for a learnable bias
    assert attn.last_kernel.path == FUSED_BIAS_GRAD and "no backward on CPU" in attn.last_kernel.reason
    with torch.no_grad():
        _, w = attn(x, x, x, need_weights=True)
    assert w is not None and attn.last_kernel.path == EXPLICIT


def test_a_flex_fallback_is_reported_once_per_cause(monkeypatch, caplog):
    from man_fairseq.modules import biased_attention

    monkeypatch.setattr(biased_attention, "_REPORTED_FLEX_FALLBACKS", set())
    attn = make_attention(DynamicMaskBias(C, H))
    attn.attention_backend = "flex"
    x = inputs(5)
    with caplog.at_level(logging.WARNING, logger="man_fairseq.modules.biased_attention"):
        attn(x, x, x, need_weights=False)  # CPU with gradients
        attn(x, x, x, need_weights=False)
        with torch.no_grad():
            attn(x, x, x, need_weights=False)  # flex runs: nothing to say
            attn(x, x, x, need_weights=True)  # the weights are needed: the explicit path
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["--attention-backend flex: no backward on CPU: these attention calls run fused-bias-grad instead",
                        "--attention-backend flex: the probabilities are needed (post-softmax transform or weights): "
                        "these attention calls run explicit instead"], messages


def test_the_head_dimension_reaches_the_kernel_choice(monkeypatch):
    """flex's CUDA fallback for small heads (see test_kernel_policy) depends on the core passing D."""
    seen = []
    choose = backends.choose_kernel
    monkeypatch.setattr(backends, "choose_kernel", lambda *a, **kw: seen.append(kw["head_dim"]) or choose(*a, **kw))
    attn = make_attention(DynamicMaskBias(C, H))
    x = inputs(5)
    with torch.no_grad():
        attn(x, x, x, need_weights=False)
    assert seen == [C // H]


# ---------------------------------------------------------------------------------------------
# --attention-backend through fairseq's model building, whole models
# ---------------------------------------------------------------------------------------------

FAMILIES = {
    "man": ("transformer_man_base", ["--encoder-sublayers", "dman,san,ffn",
                                     "--decoder-sublayers", "dman,san,cross,ffn",
                                     "--dman-max-relative-distance", "3"]),
    "man_static": ("transformer_man_base", ["--encoder-sublayers", "sman1,sman2,ffn",
                                            "--decoder-sublayers", "sman1,sman2,cross,ffn"]),
    "localness": ("transformer_localness_base", ["--localness-layers", "all", "--localness-attention-types",
                                                 "encoder_self,decoder_self,cross"]),
    "localness_layer": ("transformer_localness_base", ["--localness-window", "layer", "--localness-layers", "all",
                                                       "--localness-attention-types", "encoder_self,decoder_self"]),
    "diffwin": ("transformer_diffwin_base", []),
    "calibration": ("transformer_calibrated_base", []),
    "relative_positions": ("transformer_localness_base", ["--relative-positions",
                                                          "--relative-position-attention-types", "encoder_self"]),
}
FLEX_CAPABLE = {"man", "man_static", "localness", "localness_layer"}


def tiny(family, backend, seed=0):
    arch, extra = FAMILIES[family]
    torch.manual_seed(seed)
    model, task, args = build_fairseq_model(
        arch, TINY_MODEL + ["--dropout", "0", "--attention-backend", backend] + extra, dict_size=40)
    model.make_generation_fast_(need_attn=False)  # as fairseq-generate: no alignment weights
    model.double().eval()
    return model, task, args


def toks(task, lengths, left, seed):
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    t = max(lengths)
    out = torch.full((len(lengths), t), d.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):
        seq = torch.randint(d.nspecial, len(d), (n - 1,), generator=g).tolist() + [d.eos()]
        if left:
            out[i, t - n :] = torch.tensor(seq)
        else:
            out[i, :n] = torch.tensor(seq)
    return out


def attentions(model):
    return [m for m in model.modules() if isinstance(m, BiasedMultiheadAttention)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_backend_option_reaches_every_attention_and_outputs_agree(family):
    lengths = [9, 4, 7]
    outputs, paths, encoder_paths = {}, {}, {}
    for backend in ("explicit", "sdpa", "flex", "auto"):
        model, task, args = tiny(family, backend)
        assert args.attention_backend == backend
        mods = attentions(model)
        assert mods and all(m.attention_backend == backend for m in mods)
        src = toks(task, lengths, left=True, seed=1)
        prev = toks(task, [6, 6, 6], left=False, seed=2)
        calls = flex.FLEX_RUNNER.calls
        with torch.no_grad():
            outputs[backend] = model(src, torch.tensor(lengths), prev)[0]
        # fairseq's decoder asks the last layer's cross-attention for its weights (alignment),
        # which only the explicit path returns; every self-attention takes the chosen kernel
        paths[backend] = {m.last_kernel.path for m in mods if m.self_attention}
        encoder_paths[backend] = {m.last_kernel.path for m in attentions(model.encoder)}
        if backend == "flex" and family in FLEX_CAPABLE:
            assert flex.FLEX_RUNNER.calls > calls
    assert paths["explicit"] == {EXPLICIT}
    if family == "diffwin":  # cumulative-sum windows have no flex form: flex falls back to auto
        assert paths["flex"] == paths["auto"] and SDPA in paths["flex"], paths
    elif family == "calibration":  # plain self-attention (causal + padding) runs in flex
        assert paths["flex"] == {FLEX}, paths
    elif family == "relative_positions":  # the value embeddings read the probabilities: explicit, whatever
        assert all(p == {EXPLICIT} for p in encoder_paths.values()), encoder_paths  # the option
        assert paths["sdpa"] - {EXPLICIT} and paths["flex"] - {EXPLICIT}, paths  # decoder: no relative positions
    else:
        assert EXPLICIT not in paths["sdpa"] | paths["auto"], paths
    if family in FLEX_CAPABLE:
        assert paths["flex"] == {FLEX}, paths
    for backend in ("sdpa", "flex", "auto"):
        torch.testing.assert_close(outputs[backend], outputs["explicit"], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", ["man", "man_static", "localness"])
def test_flex_incremental_decoding_matches_the_explicit_full_pass(family):
    model, task, _ = tiny(family, "flex")
    ref_model, _, _ = tiny(family, "explicit")
    src = toks(task, [7, 5], left=True, seed=3)
    prev = toks(task, [6, 6], left=False, seed=4)
    with torch.no_grad():
        full = ref_model.decoder(prev, encoder_out=ref_model.encoder(src, torch.tensor([7, 5])))[0]
        enc = model.encoder(src, torch.tensor([7, 5]))
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0])
    assert {m.last_kernel.path for m in attentions(model) if m.self_attention} == {FLEX}
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-9, atol=1e-9)


def test_unknown_backend_fails_at_parse(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_fairseq_model("transformer_man_base", TINY_MODEL + ["--attention-backend", "fast"], dict_size=40)
    assert exit_info.value.code == 2
    assert "argument --attention-backend: invalid choice: 'fast'" in capsys.readouterr().err


def test_cli_backend_reaches_train_and_generate(toy_data_bin, tmp_path):
    """fairseq-train stores --attention-backend; fairseq-generate's --model-overrides changes it."""
    from conftest import TINY_TRAIN, USER_DIR, run_cli

    save = tmp_path / "ck"
    run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--task", "translation", "--arch",
             "transformer_man_base", "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, "--max-update", "2",
             "--save-dir", save, "--attention-backend", "flex", "--no-save-optimizer-state"])
    ckpt = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert ckpt["cfg"]["model"].attention_backend == "flex"

    def generate(backend):
        return run_cli(["fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
                        "--beam", "2", "--batch-size", "8", "--gen-subset", "test", "--cpu", "--max-len-b", "6",
                        "--model-overrides", str({"attention_backend": backend})], check=backend != "bogus")

    hyps = {b: sorted(line for line in generate(b).stdout.splitlines() if line.startswith("H-")) for b in ("explicit", "flex")}
    assert hyps["explicit"] and hyps["flex"] == hyps["explicit"]
    bogus = generate("bogus")
    assert bogus.returncode != 0 and "--attention-backend: unknown 'bogus'" in bogus.stdout
