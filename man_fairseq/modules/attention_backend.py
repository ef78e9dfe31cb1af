"""Which attention kernel the core runs, decided on purpose.

``--attention-backend`` takes one of

* ``auto`` (default): a fixed policy. PyTorch's fused ``scaled_dot_product_attention`` (SDPA) is
  pinned to the **memory-efficient** kernel (math as fallback) whenever any float mask is present
  (a bias, a causal mask, padding), in training *and* evaluation, with the mask contiguous in the
  last dimension and in the query's dtype. Flash is allowed only for plain attention (no mask at
  all, e.g. an encoder batch without padding) in fp16/bf16. So training and evaluation run the
  same kernel whenever a mask is present. cuDNN is never allowed: with a float mask it refuses one that requires grad
  (``check_attn_mask_shape``) but takes one that does not, where pytorch#196678 (NaN ``grad_q``
  at ``seq_len % 128 == 64``) and pytorch#191612 (fp32 mask read as fp16/bf16) live; and on plain
  attention it builds an execution graph for every new shape, which training batches of varying
  lengths rarely repeat (on an H200 a bf16 update on CNN/DM batches took 143 ms where cuDNN met
  new shapes and 31 ms where it had them already, results/gpu/2026-11-29-h200.md).
  On CPU the dispatcher is left free: it has no cuDNN kernel and no known mask bug.
* ``sdpa``: PyTorch's dispatcher chooses, with one guard: no cuDNN while a float mask is present
  (flash refuses masks, so that leaves memory-efficient or math). Without a mask it is unrestricted.
* ``flex``: ``torch.nn.attention.flex_attention`` for the biases that are functions of small
  tensors (DMAN, localness, static windows) plus causal and padding masks, with no
  ``(B, H, T, S)`` tensor (called in ``flex_backend.py``); compiled (``torch.compile``) on CUDA
  with lengths bucketed to multiples of :data:`~.flex_backend.FLEX_BUCKET` so that variable
  sentence lengths reuse a few compiled kernels. It is not ``auto``'s choice: its GPU speed is not
  measured yet (results/speed/README.md).
  Falls back to ``auto`` (:func:`choose_kernel` says why; the core logs each cause once) where flex
  cannot run: a bias module without ``flex_mods`` (the differentiable windows' cumulative sums), a
  post-softmax transform (calibration, multiplicative windows), returned attention weights,
  attention dropout > 0 (flex has no dropout), training on CPU (flex has no CPU backward), and a
  head dimension under 16 on CUDA (flex's compiled kernel needs at least 16).
* ``explicit``: ``softmax(q k^T * scale + mask)`` written out, the reference path.

Under ``auto`` and ``sdpa`` (and ``flex`` where it falls back), a bias module that can write its
bias as extra query/key dimensions (``extended_query_key``: localness, see
``localness_extension.py``) takes the ``extended`` path: SDPA on the extended q/k, the bias no
float mask, so on the CPU the fused kernel runs where a bias that needs a gradient would force the
math kernel. Not in half precision: the extra dimensions need float32 (``s^2``), a kernel takes one
dtype for q and k, and on CUDA the memory-efficient kernel already differentiates a float mask.
The bias module may still decline a call (its error bound), and the core then adds the bias as
a float mask (``sdpa``).

Under ``auto`` (and ``flex`` where it falls back) on the CPU, a call whose bias learns (a bias module
with parameters that need a gradient, in training: DMAN, the additive windows) takes the
``fused-bias-grad`` path (``fused_bias_grad.py``): the fused CPU kernel with the bias detached as a
float mask, the bias's gradient rebuilt by blocks of sentences from the saved log-sum-exp, where
PyTorch would run its math kernel and keep the ``(B, H, T, S)`` probabilities. Not with attention
dropout (the path has none) nor in half precision (P rebuilt in half); ``reason`` says so. ``sdpa``
stays PyTorch's dispatcher, ``explicit`` the reference.

Under ``auto`` (and ``flex`` where it falls back) on the CPU, a bias module that is a hard band in
self-attention (``band_bound``: SMAN's static windows, ``|t - s| <= b``) takes the ``banded`` path
(``banded_attention.py``): only the keys inside the band are scored, in blocks of query rows, where the
band computes at most a fifth of the full path's scores (``band_is_cheaper``: at CNN/DM's 400-token
sources with b = 4, 0.06 of them; at 32 tokens 0.75, which stays on the full kernel). Attention dropout is
applied to the band's weights (the weights outside are zero either way). Not on CUDA: its speed there is
not measured (the memory-efficient kernel, or ``flex``'s block mask, serve it). ``sdpa`` and ``explicit``
compute every key.

Whatever the option, a post-softmax transform, returned weights or a subclass that reads the
probabilities (relative value embeddings) always take the explicit path.
"""

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

ATTENTION_BACKENDS = ("auto", "sdpa", "flex", "explicit")

EXPLICIT, SDPA, FLEX, EXTENDED, FUSED_BIAS_GRAD, BANDED = (
    "explicit", "sdpa", "flex", "extended", "fused-bias-grad", "banded")
# SDPBackend member names (torch.nn.attention.SDPBackend)
FLASH, CUDNN, EFFICIENT, MATH = "FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"
HALF_DTYPES = (torch.float16, torch.bfloat16)

# flex's compiled CUDA kernel rejects smaller head dimensions ("NYI: embedding dimension of the query,
# key, and value must be at least 16", torch 2.11 on an H200)
FLEX_MIN_HEAD_DIM = 16


@dataclass(frozen=True)
class KernelChoice:
    """The path the core takes: ``explicit``, ``sdpa`` or ``extended`` (with the allowed SDPA
    kernels, empty = dispatcher free) or ``flex``; ``reason`` says why, for logs and tests."""

    path: str
    sdpa_backends: Tuple[str, ...] = ()
    reason: str = ""


def choose_kernel(
    backend: str,
    device_type: str,
    dtype: torch.dtype,
    has_mask: bool,
    needs_probabilities: bool = False,
    flex_supported: bool = False,
    dropout: bool = False,
    requires_grad: bool = False,
    head_dim: Optional[int] = None,
    extendable: bool = False,
    bias_grad: bool = False,
    hard_band: bool = False,
    band_cheaper: bool = False,
) -> KernelChoice:
    """The attention kernel for one call: a pure function of what the call needs.

    Args:
        backend: ``auto|sdpa|flex|explicit`` (``--attention-backend``).
        device_type: ``cpu`` / ``cuda`` / ...
        dtype: dtype of the projected queries.
        has_mask: any additive float mask (bias, causal, padding) is present.
        needs_probabilities: a post-softmax transform, returned weights or a subclass hook reads
            the ``(B,H,T,S)`` probabilities.
        flex_supported: the bias module (if any) provides ``flex_mods``.
        dropout: attention dropout is active (training with ``--attention-dropout`` > 0).
        requires_grad: a backward pass will follow (q, k, v or the bias need gradients).
        head_dim: the per-head dimension of q, k and v.
        extendable: the bias module can write its bias as extra query/key dimensions.
        bias_grad: the bias module's parameters will get a gradient (training a learnable bias).
        hard_band: the bias module is a hard band (0 inside, -inf outside) in self-attention.
        band_cheaper: the band computes few enough of the full path's scores (``band_is_cheaper``).
    """
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {ATTENTION_BACKENDS}")
    if needs_probabilities:
        return KernelChoice(EXPLICIT, reason="the probabilities are needed (post-softmax transform or weights)")
    if backend == EXPLICIT:
        return KernelChoice(EXPLICIT, reason="--attention-backend explicit")
    fallback = ""
    if backend == FLEX:
        if not flex_supported:
            fallback = "flex: the bias module has no flex_mods; "
        elif dropout:
            fallback = "flex: attention dropout is not supported by flex_attention; "
        elif requires_grad and device_type == "cpu":
            fallback = "flex: no backward on CPU; "
        elif device_type == "cuda" and head_dim is not None and head_dim < FLEX_MIN_HEAD_DIM:
            fallback = f"flex: head dimension {head_dim} < {FLEX_MIN_HEAD_DIM} (flex_attention's CUDA kernel); "
        else:
            return KernelChoice(FLEX, reason="--attention-backend flex")
        backend = "auto"
    choice = _sdpa_choice(backend, device_type, dtype, has_mask, fallback)
    if hard_band and backend == "auto" and device_type == "cpu":
        if band_cheaper:
            return KernelChoice(BANDED, (), choice.reason + "; a hard window: only the keys inside its band")
        return KernelChoice(SDPA, (), choice.reason + "; a hard window whose band would compute more than a "
                            "fifth of the scores: every key")
    if extendable:
        if dtype in HALF_DTYPES:
            return KernelChoice(SDPA, choice.sdpa_backends, choice.reason + "; half precision: the bias as a float mask "
                                "(its extra query/key dimensions need float32)")
        return KernelChoice(EXTENDED, choice.sdpa_backends, choice.reason + "; the bias as extra query/key dimensions")
    if bias_grad and backend == "auto" and device_type == "cpu":
        if dropout:
            return KernelChoice(SDPA, (), choice.reason + "; attention dropout > 0: the bias's gradient through "
                                "PyTorch's math kernel (the fused-bias-grad path has no dropout)")
        if dtype in HALF_DTYPES:
            return KernelChoice(SDPA, (), choice.reason + "; half precision: the bias's gradient through PyTorch's "
                                "math kernel (the fused-bias-grad path rebuilds the probabilities in fp32/fp64 only)")
        return KernelChoice(FUSED_BIAS_GRAD, (), choice.reason + "; a learnable bias: the fused CPU kernel, "
                            "the bias's gradient rebuilt by blocks of sentences")
    return choice


def _sdpa_choice(backend: str, device_type: str, dtype: torch.dtype, has_mask: bool, fallback: str) -> KernelChoice:
    """The SDPA kernels ``auto`` / ``sdpa`` allow (``fallback``: why flex was left, or '')."""
    if device_type != "cuda":
        return KernelChoice(SDPA, (), fallback + f"{device_type}: dispatcher free (no cuDNN kernel)")
    if dtype == torch.float64:
        return KernelChoice(SDPA, (MATH,), fallback + "float64: only the math kernel")
    if backend == SDPA:
        if has_mask:
            return KernelChoice(SDPA, (FLASH, EFFICIENT, MATH), fallback + "sdpa: dispatcher, no cuDNN with a float mask")
        return KernelChoice(SDPA, (), fallback + "sdpa: dispatcher free (no mask)")
    # auto
    if has_mask:
        return KernelChoice(SDPA, (EFFICIENT, MATH), fallback + "auto: mask present -> memory-efficient (math fallback)")
    if dtype in HALF_DTYPES:
        return KernelChoice(SDPA, (FLASH, EFFICIENT, MATH), fallback + "auto: plain half-precision attention "
                            "(no cuDNN: it builds a graph per new shape)")
    return KernelChoice(SDPA, (EFFICIENT, MATH), fallback + "auto: plain fp32 attention (no flash/cuDNN kernel)")


def sdpa_context(choice: KernelChoice):
    """``sdpa_kernel`` pinning the allowed kernels of ``choice`` (a no-op when dispatcher free)."""
    if not choice.sdpa_backends:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in choice.sdpa_backends])


def prepare_sdpa_mask(mask: Optional[Tensor], q: Tensor) -> Optional[Tensor]:
    """The float mask as the memory-efficient kernel needs it: in q's dtype, ``stride(-1) == 1``.

    Broadcast (stride 0) leading dimensions stay broadcast on both the cast and the contiguous
    branch (the kernel expands them itself; ``.to`` or ``.contiguous`` of the expanded view would
    materialise ``(B, H, T, S)``): they are reduced to size 1 first and expanded back after.
    """
    if mask is None:
        return None
    if mask.dtype == q.dtype and mask.stride(-1) == 1:
        return mask
    shape = mask.shape
    lead = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in mask.stride()[:-1])
    mask = mask[lead]
    if mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # an fp32 mask with half q: never let a kernel reinterpret it
    if mask.stride(-1) != 1:
        mask = mask.contiguous()
    return mask.expand(shape)
