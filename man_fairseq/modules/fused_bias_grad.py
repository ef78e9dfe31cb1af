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
``_block_backward``.) Both passes go one block of queries at a time, so the attention makes no
tensor larger than ``(B, H, block, S)`` (every row of the output, log-sum-exp and dS depends on its own query
only; dk and dv are summed over the blocks). Each block's ``dS`` is handed to the bias's reducer:

* a bias module with ``fused_bias_terms(ctx)`` (its small terms, under autograd),
  ``fused_bias_block(terms, rows)`` (the bias of the query rows ``rows``, a slice) and
  ``fused_bias_grad(terms, rows, dS, grads)`` (adds the block's gradient of each term to
  ``grads``) is reduced by its own formula (DMAN: ``mask_bias.DynamicMaskBias``);
* any other bias module by :class:`WholeBias`: its bias computed under autograd as usual is the
  one term, ``dS`` is summed to its broadcast shape, and autograd carries that gradient back
  through the module (the bias tensor and its graph are kept, as on the other paths).
"""

from typing import List, Optional, Sequence

import torch
from torch import Tensor

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

# Elements of one (B, H, block, S) block: the rows per block are this over B*H*S (at least 1).
# Measured (docs/speed.md#a-learnable-bias-through-the-fused-cpu-kernel): as fast as 4x larger blocks
# with the memory of smaller ones; smaller blocks and the whole call in one block were slower.
BLOCK_ELEMENTS = 1 << 20


def rows_per_block(bsz: int, heads: int, src_len: int) -> int:
    return max(1, BLOCK_ELEMENTS // max(1, bsz * heads * src_len))


def _blocks(tgt_len: int, rows: int) -> List[slice]:
    return [slice(start, min(start + rows, tgt_len)) for start in range(0, tgt_len, rows)]


def _query_rows(mask: Tensor, rows: slice) -> Tensor:
    """The query rows of a (.., T|1, S) tensor; a tensor broadcast over the queries stays whole."""
    return mask if mask.size(-2) == 1 else mask[..., rows, :]


class WholeBias:
    """The generic reducer: the whole bias tensor (under autograd) is the one term."""

    def __init__(self, bias: Tensor):
        self.bias = bias

    def terms(self):
        return (self.bias,)

    @staticmethod
    def block(terms, rows: slice) -> Tensor:
        return _query_rows(terms[0], rows)

    @staticmethod
    def grad(terms, rows: slice, grad_scores: Tensor, grads: List[Optional[Tensor]]) -> None:
        bias = terms[0]
        shape = (1,) * (4 - bias.dim()) + tuple(bias.shape)
        summed = [d for d in range(4) if shape[d] == 1 and grad_scores.size(d) > 1]
        g = grad_scores.sum(summed, keepdim=True) if summed else grad_scores
        if grads[0] is None:
            grads[0] = torch.zeros(shape, dtype=grad_scores.dtype, device=grad_scores.device)
        _query_rows(grads[0], rows).add_(g)


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
    """(q, k, v, fixed mask, scale, rows per block, reducer, *bias terms) -> (B, H, T, D)."""

    @staticmethod
    def forward(fctx, q, k, v, fixed, scale, rows, reducer, *terms):
        # contiguous once: the kernels would copy a strided k and v at every block
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        outs, lses = [], []
        with torch.no_grad():
            for block in _blocks(q.size(2), rows):
                mask = _block_mask(reducer, terms, fixed, block, q, k)
                out, lse = _FORWARD(q[:, :, block], k, v, 0.0, False, attn_mask=mask, scale=scale)
                outs.append(out)
                lses.append(lse)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        lse = lses[0] if len(lses) == 1 else torch.cat(lses, dim=2)
        fctx.save_for_backward(q, k, v, out, lse, fixed, *terms)
        fctx.scale, fctx.rows, fctx.reducer = scale, rows, reducer
        return out

    @staticmethod
    def backward(fctx, grad_out: Tensor):
        q, k, v, out, lse, fixed, *terms = fctx.saved_tensors
        scale, reducer = fctx.scale, fctx.reducer
        need_terms = fctx.needs_input_grad[7:]
        grad_q = torch.empty_like(q)
        grad_k = torch.zeros_like(k)  # q, k, v were saved contiguous: so are these
        grad_v = torch.zeros_like(v)
        grads: List[Optional[Tensor]] = [None] * len(terms)
        grad_out = grad_out.contiguous()
        k_t = k.transpose(-1, -2).flatten(0, 1)  # (B*H, D, S) for the rebuilt scores
        for block in _blocks(q.size(2), fctx.rows):
            mask = _block_mask(reducer, terms, fixed, block, q, k)
            q_b, out_b, go_b = q[:, :, block], out[:, :, block], grad_out[:, :, block]
            grad_q[:, :, block] = _block_backward(q_b, k_t, k, v, out_b, go_b, lse[:, :, block], mask, scale,
                                                  grad_k, grad_v, reducer, terms, block, grads, any(need_terms))
        grads = [g if need else None for g, need in zip(grads, need_terms)]
        return (grad_q, grad_k, grad_v, None, None, None, None, *grads)


def _block_backward(q_b, k_t, k, v, out_b, go_b, lse_b, mask, scale, grad_k, grad_v, reducer, terms, block, grads,
                    bias_grad: bool) -> Tensor:
    """One block's q gradient (returned), its k and v gradients (added) and its dS (to the reducer).

    By batched products from P rebuilt with the saved log-sum-exp, not by the fused backward kernel:
    that kernel returns zero-filled full-size k and v gradients per block and recomputes P itself,
    which dS needs too (measured: docs/speed.md#a-learnable-bias-through-the-fused-cpu-kernel)."""
    q3, go3 = q_b.flatten(0, 1), go_b.flatten(0, 1)
    p = torch.baddbmm(mask.flatten(0, 1), q3, k_t, alpha=scale)
    p = p.sub_(lse_b.flatten(0, 1)[..., None]).exp_()
    grad_v.flatten(0, 1).baddbmm_(p.transpose(-1, -2), go3)
    # dS = P * (dO v^T - rowsum(dO * O)), in place
    ds = torch.bmm(go3, v.flatten(0, 1).transpose(-1, -2))
    ds = ds.sub_((go_b * out_b).sum(-1, keepdim=True).flatten(0, 1)).mul_(p)
    del p
    if bias_grad:
        reducer.grad(terms, block, ds.view(mask.shape), grads)
    grad_k.flatten(0, 1).baddbmm_(ds.transpose(-1, -2), q3, alpha=scale)
    return torch.bmm(ds, k.flatten(0, 1)).mul_(scale).view(q_b.shape)


def _block_mask(reducer, terms: Sequence[Tensor], fixed: Optional[Tensor], block: slice, q: Tensor, k: Tensor) -> Tensor:
    """The bias of the query rows ``block`` plus the fixed (causal / padding) mask, (B, H, rows, S) in q's dtype."""
    mask = reducer.block(terms, block).to(q.dtype)
    if fixed is not None:
        mask = mask + _query_rows(fixed, block)
    shape = (q.size(0), q.size(1), block.stop - block.start, k.size(2))
    return mask.expand(shape).contiguous() if mask.shape != shape else mask


def fused_bias_attention(q: Tensor, k: Tensor, v: Tensor, fixed: Optional[Tensor], scale: float, bias_module,
                         ctx, rows: Optional[int] = None) -> Tensor:
    """Attention of (B, H, T, D) q, k, v with the bias module's bias (under ``ctx``, the core's
    AttentionContext) plus the ``fixed`` float mask (causal, padding: no gradient)."""
    reducer = reducer_for(bias_module, ctx)
    if rows is None:
        rows = rows_per_block(q.size(0), q.size(1), k.size(2))
    if fixed is not None:
        fixed = fixed.detach().to(q.dtype)
        fixed = fixed.view((1,) * (4 - fixed.dim()) + tuple(fixed.shape))
    return _FusedBiasAttention.apply(q, k, v, fixed, scale, rows, reducer, *reducer.terms())
