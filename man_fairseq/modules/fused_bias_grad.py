"""A learnable attention bias through PyTorch's fused (flash) CPU kernel, with the bias's own gradient.

PyTorch's CPU attention sends a float mask that needs a gradient (DMAN, the additive windows) to the
math kernel, which keeps the ``(B, H, T, S)`` probabilities from the forward to the backward pass; no
fused CPU kernel computes a mask's gradient. Here the forward pass calls the fused CPU kernel
(``aten::_scaled_dot_product_flash_attention_for_cpu``) with the bias detached as a float mask and
keeps ``(q, k, v, out, logsumexp)`` plus the bias's small terms. The backward pass rebuilds the
probabilities from the log-sum-exp and takes every gradient from them by batched products::

    P  = exp(q k^T * scale + bias + mask - lse)
    dS = P * (dO v^T - rowsum(dO * O))
    dv = P^T dO,  dq = dS k * scale,  dk = dS^T q * scale

(PyTorch's fused backward kernel gives dq, dk, dv but not dS, and called per block it costs more:
``_block_backward``.) Both passes go one block at a time: a few whole sentences (all heads, all query
rows), or the query rows of one sentence where a sentence alone is larger than ``BLOCK_ELEMENTS``
(``plan_blocks``), so the attention makes no tensor larger than that (every row of the output,
log-sum-exp and dS depends on its own sentence and query only; dk and dv are summed over the blocks).
The causal and padding mask's ``-inf`` entries are handed to the bias as a boolean ``blocked`` mask to
fold into its own small terms (its finite entries, if any, are added to the scores). Each block's
``dS`` is handed to the bias's reducer:

* a bias module with ``fused_bias_terms(ctx)`` (its small terms, under autograd),
  ``fused_bias_block(terms, batch, rows, blocked)`` (the bias of the sentences ``batch`` and query rows
  ``rows``, two slices, ``-inf`` where ``blocked``, (b, H, r, S)) and ``fused_bias_grad(terms, batch, rows, dS,
  bias, grads)`` (adds the block's gradient of each term to ``grads``; ``bias`` is the block's bias,
  which it may overwrite) is reduced by its own formula (DMAN: ``mask_bias.DynamicMaskBias``);
* any other bias module by :class:`WholeBias`: its bias computed under autograd as usual is the
  one term, ``dS`` is summed to its broadcast shape, and autograd carries that gradient back
  through the module (the bias tensor and its graph are kept, as on the other paths).
"""

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

# Elements of one (b, H, r, S) block at most (a sentence larger than this is split by query rows).
# Measured (docs/speed.md#a-learnable-bias-through-the-fused-cpu-kernel): whole sentences per block
# rather than a few query rows of every sentence, and blocks of this size rather than larger ones.
BLOCK_ELEMENTS = 1 << 20

Block = Tuple[slice, slice]  # (sentences, query rows)


def plan_blocks(bsz: int, heads: int, tgt_len: int, src_len: int, elements: Optional[int] = None) -> List[Block]:
    """The blocks of a call: as many whole sentences as fit in ``elements``, else one sentence's query rows."""
    elements = BLOCK_ELEMENTS if elements is None else elements
    per_sentence = heads * tgt_len * src_len
    if per_sentence <= elements:
        n = elements // max(1, per_sentence)
        return [(slice(b, min(b + n, bsz)), slice(0, tgt_len)) for b in range(0, bsz, n)]
    rows = max(1, elements // max(1, heads * src_len))
    return [(slice(b, b + 1), slice(r, min(r + rows, tgt_len))) for b in range(bsz) for r in range(0, tgt_len, rows)]


def part(x: Optional[Tensor], batch: slice, rows: slice) -> Optional[Tensor]:
    """The sentences and query rows of a (B|1, .., T|1, S) tensor; a dimension of size 1 (broadcast) stays whole."""
    if x is None:
        return None
    if x.size(0) > 1:
        x = x[batch]
    return x if x.size(-2) == 1 else x[..., rows, :]


def _as_4d(x: Tensor) -> Tensor:
    return x.view((1,) * (4 - x.dim()) + tuple(x.shape))


class WholeBias:
    """The generic reducer: the whole bias tensor (under autograd) is the one term."""

    def __init__(self, bias: Tensor):
        self.bias = _as_4d(bias)

    def terms(self):
        return (self.bias,)

    @staticmethod
    def block(terms, batch: slice, rows: slice, blocked: Optional[Tensor]) -> Tensor:
        bias = part(terms[0], batch, rows)
        return bias if blocked is None else bias.masked_fill(blocked, float("-inf"))

    @staticmethod
    def grad(terms, batch: slice, rows: slice, grad_scores: Tensor, bias_block: Tensor,
             grads: List[Optional[Tensor]]) -> None:
        bias = terms[0]
        summed = [d for d in range(4) if bias.size(d) == 1 and grad_scores.size(d) > 1]
        g = grad_scores.sum(summed, keepdim=True) if summed else grad_scores
        if grads[0] is None:
            grads[0] = torch.zeros(bias.shape, dtype=grad_scores.dtype, device=grad_scores.device)
        part(grads[0], batch, rows).add_(g)


class ModuleBias:
    """A bias module's own reducer (``fused_bias_terms`` / ``fused_bias_block`` / ``fused_bias_grad``)."""

    def __init__(self, module, ctx):
        self._terms = module.fused_bias_terms(ctx)
        self.block = module.fused_bias_block
        self.grad = module.fused_bias_grad

    def terms(self):
        return self._terms


def bias_learns(bias_module, ctx) -> bool:
    """A training call whose bias module has parameters that need a gradient. Not while decoding
    incrementally, nor for a bias that may mask every key of a query (the core's dead-row fill
    needs the whole mask)."""
    if bias_module is None or not torch.is_grad_enabled() or ctx.incremental_state is not None:
        return False
    if getattr(bias_module, "can_mask_all_keys", False):
        return False
    return any(p.requires_grad for p in bias_module.parameters())


def reducer_for(bias_module, ctx):
    if hasattr(bias_module, "fused_bias_terms"):
        return ModuleBias(bias_module, ctx)
    return WholeBias(bias_module(ctx))


class _FusedBiasAttention(torch.autograd.Function):
    """(q, k, v, blocked, rest, scale, blocks, reducer, *bias terms) -> (B, H, T, D)."""

    @staticmethod
    def forward(fctx, q, k, v, blocked, rest, scale, blocks, reducer, *terms):
        # contiguous once: the kernels would copy a strided k and v at every block
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = lse = None
        with torch.no_grad():
            for batch, rows in blocks:
                _, mask = _block_bias(reducer, terms, blocked, rest, batch, rows, q, k)
                out_b, lse_b = _FORWARD(q[batch, :, rows], k[batch], v[batch], 0.0, False, attn_mask=mask, scale=scale)
                if len(blocks) == 1:
                    out, lse = out_b, lse_b
                    break
                if out is None:
                    out = out_b.new_empty(q.shape[:-1] + out_b.shape[-1:])
                    lse = lse_b.new_empty(q.shape[:-1])
                out[batch, :, rows] = out_b
                lse[batch, :, rows] = lse_b
        fctx.save_for_backward(q, k, v, out, lse, blocked, rest, *terms)
        fctx.scale, fctx.blocks, fctx.reducer = scale, blocks, reducer
        return out

    @staticmethod
    def backward(fctx, grad_out: Tensor):
        q, k, v, out, lse, blocked, rest, *terms = fctx.saved_tensors
        scale, reducer = fctx.scale, fctx.reducer
        need_terms = fctx.needs_input_grad[8:]
        grad_q = torch.empty_like(q)
        grad_k = torch.zeros_like(k)  # q, k, v were saved contiguous: so are these
        grad_v = torch.zeros_like(v)
        grads: List[Optional[Tensor]] = [None] * len(terms)
        grad_out = grad_out.contiguous()
        for batch, rows in fctx.blocks:
            bias, mask = _block_bias(reducer, terms, blocked, rest, batch, rows, q, k)
            grad_scores = _block_backward(q[batch, :, rows], k[batch], v[batch], out[batch, :, rows],
                                          grad_out[batch, :, rows], lse[batch, :, rows], mask, scale,
                                          grad_q[batch, :, rows], grad_k[batch], grad_v[batch])
            if any(need_terms):
                reducer.grad(terms, batch, rows, grad_scores, bias, grads)
        grads = [g if need else None for g, need in zip(grads, need_terms)]
        return (grad_q, grad_k, grad_v, None, None, None, None, None, *grads)


def _block_backward(q_b, k_b, v_b, out_b, go_b, lse_b, mask, scale, grad_q_b, grad_k_b, grad_v_b) -> Tensor:
    """One block's q gradient (written), its k and v gradients (added) and its dS (returned, (b, H, r, S)).

    By batched products from P rebuilt with the saved log-sum-exp, not by the fused backward kernel:
    that kernel returns zero-filled full-size k and v gradients per block and recomputes P itself,
    which dS needs too (measured: docs/speed.md#a-learnable-bias-through-the-fused-cpu-kernel)."""
    shape = mask.shape
    q3, go3 = q_b.reshape(-1, *q_b.shape[2:]), go_b.reshape(-1, *go_b.shape[2:])
    k3, v3 = k_b.flatten(0, 1), v_b.flatten(0, 1)
    p = torch.baddbmm(mask.view(-1, *shape[2:]), q3, k3.transpose(-1, -2), alpha=scale)
    p = p.sub_(lse_b.reshape(-1, shape[2], 1).to(p.dtype)).exp_()
    grad_v_b.flatten(0, 1).baddbmm_(p.transpose(-1, -2), go3)
    # dS = P * (dO v^T - rowsum(dO * O)), in place
    ds = torch.bmm(go3, v3.transpose(-1, -2))
    ds = ds.sub_((go_b * out_b).sum(-1, keepdim=True).reshape(-1, shape[2], 1)).mul_(p)
    del p
    grad_k_b.flatten(0, 1).baddbmm_(ds.transpose(-1, -2), q3, alpha=scale)
    grad_q_b.copy_(torch.bmm(ds, k3).mul_(scale).view(grad_q_b.shape))
    return ds.view(shape)


def _block_bias(reducer, terms: Sequence[Tensor], blocked: Optional[Tensor], rest: Optional[Tensor], batch: slice,
                rows: slice, q: Tensor, k: Tensor) -> Tuple[Tensor, Tensor]:
    """A block's bias, ``-inf`` where the fixed mask blocks, (b, H, r, S) contiguous in q's dtype, and its
    mask for the scores (the bias plus the fixed mask's finite entries, if any)."""
    bias = reducer.block(terms, batch, rows, part(blocked, batch, rows)).to(q.dtype)
    shape = (batch.stop - batch.start, q.size(1), rows.stop - rows.start, k.size(2))  # plan_blocks' slices
    bias = bias.expand(shape).contiguous() if bias.shape != shape else bias.contiguous()
    return bias, (bias if rest is None else bias + part(rest, batch, rows))


def split_fixed(fixed: Optional[Tensor], dtype: torch.dtype) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """A fixed float mask as (blocked, rest): its ``-inf`` entries as a boolean mask for the bias to fold
    into its terms, and its other entries, or None where all are 0 (causal and padding masks; checked in
    eager mode only: under torch.compile a read of the values would break the graph, so they are added)."""
    if fixed is None:
        return None, None
    fixed = _as_4d(fixed.detach().to(dtype))
    blocked = torch.isneginf(fixed)
    rest = fixed.masked_fill(blocked, 0.0)
    if not torch.compiler.is_compiling() and not bool(rest.any()):
        rest = None
    return blocked, rest


def fused_bias_attention(q: Tensor, k: Tensor, v: Tensor, fixed: Optional[Tensor], scale: float, bias_module,
                         ctx, elements: Optional[int] = None) -> Tensor:
    """Attention of (B, H, T, D) q, k, v with the bias module's bias (under ``ctx``, the core's
    AttentionContext) plus the ``fixed`` float mask (causal, padding: no gradient); ``elements``: the
    block size (default ``BLOCK_ELEMENTS``)."""
    reducer = reducer_for(bias_module, ctx)
    blocks = plan_blocks(q.size(0), q.size(1), q.size(2), k.size(2), elements)
    blocked, rest = split_fixed(fixed, q.dtype)
    return _FusedBiasAttention.apply(q, k, v, blocked, rest, scale, blocks, reducer, *reducer.terms())
