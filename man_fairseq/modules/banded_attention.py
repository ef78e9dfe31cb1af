"""Attention over the keys of a hard band only (issue 80): SMAN's static windows, ``|t - s| <= b``.

A hard window gives every key outside it exactly zero weight, so the keys outside need no score.
The queries are cut into blocks of ``Q`` consecutive rows; block ``n`` reads the ``Q + 2 * bound``
keys around it (``bound``: the largest half width of the call, no device sync), its own block of keys
and the first ``2 bound`` of the next (:func:`_key_windows`). Per block, the scores are one dense ``(Q, Q + 2 bound)``
product (batched matrix products, as the full path's), masked to ``-inf`` outside each query's band,
beyond the sequence, at padded keys and where ``attn_mask`` says so, then softmax, attention dropout and
the weighted sum of the block's values. The backward pass is its own (:class:`_BandedAttention`): it
keeps q, k, v as given and the band's probabilities, not the windows of k and v autograd would keep,
and takes the gradients (the full path's restricted to the band) by the same block products, a chunk
of blocks at a time. The work per call is ``T * (Q + 2 bound)`` scores instead of ``T * S``:
:func:`band_is_cheaper` says when that pays.

Why blocks rather than a ``(B, H, T, 2b+1, D)`` gather of each query's own window: the gather makes a
tensor ``D`` times larger than the band's scores (``2b + 1`` copies of every key) and multiplies it
element by element, where a block's product runs in BLAS; measured on one CPU thread, one forward and
backward of (B, 4, T, 64) at b = 4: T = 400, B = 20: full 357 ms, gather 727 ms, blocks of 16 rows 108 ms;
T = 32, B = 128: full 64 ms, gather 350 ms, blocks of 16 rows 62 ms (a first version of the blocks, on a
loaded machine; the sublayer and the layer in docs/speed.md).

A query whose band holds no allowed key (a pad query in a padded stretch of its sentence) attends to
its block's window with no mask at all: finite, where the full path attends to every key of the
sentence; such rows are pad positions, which nothing downstream reads.
"""

import logging
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

# Query rows per block, at least the band's width: one forward and backward of (20, 4, 400, 64) at b = 4 took
# 441, 382, 422, 411, 441 ms with blocks of 8, 16, 24, 32, 48 rows (one thread, a loaded machine).
MIN_BLOCK_ROWS = 16
# The band is taken when its scores are at most this fraction of the full path's: its copies of k and v and
# its small products cost more per score. One SMAN2 sublayer (d 256, 4 heads, b = 4) forward and backward,
# 8,000 tokens a batch, one thread, CPU time banded / full: T = 32: 1.13 (the band computes 0.75 of the
# scores), T = 64: 1.09 (0.38), T = 100: 0.96 (0.27), T = 160: 0.89 (0.15), T = 400: 0.61 (0.06).
MAX_BAND_FRACTION = 0.2

# Elements of one chunk's window of k (blocks per chunk: this over B * H * (Q + 2 bound) * D, at least one):
# each pass copies the windows of k and v and makes its gradients' blocks a chunk at a time, not for the
# whole call at once (4 MiB of float32; at B = 20, T = 400, b = 4, d 256, 4 heads: 8 of the 25 blocks).
CHUNK_ELEMENTS = 1 << 20

logger = logging.getLogger(__name__)
_REPORTED = set()


def band_bound(bias_module, ctx, attn_mask: Optional[Tensor]) -> Optional[int]:
    """The bound of the bias module's band where this path can serve the call (a bias module with
    ``band_bound`` and ``half_width``, in self-attention, with no ``attn_mask`` or a (T, S) one), else None."""
    if not ctx.self_attention or not hasattr(bias_module, "band_bound"):
        return None
    if attn_mask is not None and attn_mask.dim() != 2:
        return None
    return bias_module.band_bound(ctx.num_keys)


def attend(bias_module, ctx, choice, bound: int, v: Tensor, attn_mask: Optional[Tensor], scale: float,
           dropout_p: float) -> Tensor:
    """The core's call of :func:`banded_attention` (``ctx``: its AttentionContext), said once per process and
    window in the log (``choice.reason``)."""
    what = f"{type(bias_module).__name__}({bias_module.extra_repr()})"
    if what not in _REPORTED:
        _REPORTED.add(what)
        logger.info(f"{what}: attention on the {choice.path} path ({choice.reason})")
    return banded_attention(ctx.q, ctx.k, v, bias_module.half_width(ctx), bound, ctx.query_start, ctx.key_padding_mask,
                            attn_mask, scale, dropout_p, training=dropout_p > 0)


def block_rows(bound: int, tgt_len: int) -> int:
    """``Q``: query rows per block."""
    return max(1, min(tgt_len, max(MIN_BLOCK_ROWS, 2 * bound)))


def band_is_cheaper(tgt_len: int, src_len: int, bound: Optional[int]) -> bool:
    """Whether the banded path computes at most :data:`MAX_BAND_FRACTION` of the full path's scores (False
    without a band: ``bound`` None)."""
    if bound is None:
        return False
    rows = block_rows(bound, tgt_len)
    padded_rows = -(-tgt_len // rows) * rows
    return padded_rows * (rows + 2 * bound) <= MAX_BAND_FRACTION * tgt_len * src_len


def _key_windows(x: Tensor, lo: int, hi: int, span: int, rows: int, value=0.0) -> Tensor:
    """Keys ``lo .. hi-1`` of x (A, B, S, ...) along dim 2 (``value`` outside ``0 .. S-1``) as the windows of
    ``span`` keys every ``rows``: (A, B, n_blocks, span, ...). Made of whole blocks of ``rows`` keys, each window
    its own block and the first ``span - rows`` keys of the next (``span - rows = 2 bound <= rows`` whenever
    there are two blocks or more), rather than by ``unfold``, whose backward pass cost a fifth of the path's
    time (torch.profiler, T = 400)."""
    src_len, blocks = x.size(2), (hi - lo - span) // rows + 1
    part = x.narrow(2, max(lo, 0), min(hi, src_len) - max(lo, 0))
    whole_blocks = 2 * rows - span if blocks > 1 else 0  # keys that make the last block whole
    before, after = max(0, -lo), max(0, hi - src_len) + whole_blocks
    if before or after:
        part = F.pad(part, [0, 0] * (x.dim() - 3) + [before, after], value=value)
    if blocks == 1:
        return part.unsqueeze(2)
    whole = part.reshape(*x.shape[:2], blocks + 1, rows, *x.shape[3:])
    return torch.cat([whole[:, :, :blocks], whole[:, :, 1:, : span - rows]], dim=3)


def _add_key_windows(grad: Tensor, grad_blocks: Tensor, lo: int, span: int, rows: int) -> None:
    """The inverse of :func:`_key_windows` for gradients: adds (A, B, n_blocks, span, ...), the windows from key
    ``lo``, onto grad (A, B, S, ...): each window's first ``rows`` keys onto its own block, the rest onto the
    first ``span - rows`` keys of the next; keys outside ``0 .. S-1`` dropped."""

    def add(first: int, g: Tensor) -> None:  # g: keys first .. first + len - 1
        start, stop = max(first, 0), min(first + g.size(2), grad.size(2))
        if stop > start:
            grad.narrow(2, start, stop - start).add_(g.narrow(2, start - first, stop - start))

    if grad_blocks.size(2) == 1:
        return add(lo, grad_blocks.squeeze(2))
    add(lo, grad_blocks[:, :, :, :rows].flatten(2, 3))
    rest = grad_blocks.new_zeros(grad_blocks.shape[:3] + (rows,) + grad_blocks.shape[4:])
    rest[:, :, :, : span - rows] = grad_blocks[:, :, :, rows:]
    add(lo + rows, rest.flatten(2, 3))


def _query_blocks(x: Tensor, start: int, stop: int, rows: int) -> Tensor:
    """Rows ``start .. stop-1`` of x (B, H, T, D) as (B, H, n, rows, D), zero beyond T."""
    bsz, heads, tgt_len, dim = x.shape
    part = x[:, :, start: min(stop, tgt_len)]
    return F.pad(part, (0, 0, 0, stop - start - part.size(2))).reshape(bsz, heads, -1, rows, dim)


def _chunks(n_blocks: int, blocks_per_chunk: int, lo: int, span: int, rows: int):
    """(first block, end block, first key, end key) of each chunk of blocks."""
    for n0 in range(0, n_blocks, blocks_per_chunk):
        n1 = min(n0 + blocks_per_chunk, n_blocks)
        yield n0, n1, lo + n0 * rows, lo + (n1 - 1) * rows + span


class _BandedAttention(torch.autograd.Function):
    """(q, k, v, mask, scale, dropout_p, (lo, span, rows, blocks per chunk)) -> (B, H, T, D), the band's
    attention with its own backward pass. Autograd through the forward as written would keep a padded copy
    of q, the windows of k and v (about 1.5 copies of each, made by :func:`_key_windows`); this keeps q, k, v
    as given, the band's probabilities and, with dropout, its bool mask of kept weights, and rebuilds the
    windows in the backward pass::

        W  = P * keep / (1 - p)                    (W = P without dropout)
        dv = W^T dO,  dP = (dO v^T) * keep / (1 - p)
        dS = P * (dP - rowsum(P * dP)),  dq = dS k * scale,  dk = dS^T q * scale

    by batched products per block, dk and dv added back onto the keys (:func:`_add_key_windows`). Both
    passes go a chunk of blocks at a time (:data:`CHUNK_ELEMENTS`), so that the windows' copies and the
    gradients' blocks made at once stay small beside q, k and v."""

    @staticmethod
    def forward(fctx, q, k, v, mask, scale, dropout_p, geometry):
        lo, span, rows, per_chunk = geometry
        bsz, heads, tgt_len, _ = q.shape
        n_blocks = mask.size(-3)
        probs = q.new_empty(bsz, heads, n_blocks, rows, span)
        keep = torch.empty(probs.shape, dtype=torch.bool, device=q.device) if dropout_p > 0 else None
        out = q.new_empty(bsz, heads, n_blocks * rows, v.size(-1))
        for n0, n1, first, end in _chunks(n_blocks, per_chunk, lo, span, rows):
            scores = torch.matmul(_query_blocks(q, n0 * rows, n1 * rows, rows),
                                  _key_windows(k, first, end, span, rows).transpose(-1, -2))
            scores = scores.mul_(scale).add_(mask[..., n0:n1, :, :])  # (B, H, n1 - n0, Q, span)
            low_precision = scores.dtype in (torch.float16, torch.bfloat16)
            weights = F.softmax(scores, dim=-1, dtype=torch.float32 if low_precision else None).to(q.dtype)
            probs[:, :, n0:n1] = weights
            if keep is not None:  # one independent draw per weight of the band: those outside are zero either way
                kept = keep[:, :, n0:n1]
                kept.copy_(torch.empty_like(weights).bernoulli_(1 - dropout_p))
                weights = weights.masked_fill_(~kept, 0.0).div_(1 - dropout_p)
            out[:, :, n0 * rows: n1 * rows] = torch.matmul(weights, _key_windows(v, first, end, span, rows)).flatten(2, 3)
        fctx.save_for_backward(q, k, v, probs, keep)
        fctx.scale, fctx.dropout_p, fctx.geometry = scale, dropout_p, geometry
        return out[:, :, :tgt_len]

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_out: Tensor):
        q, k, v, probs, keep = fctx.saved_tensors
        scale, dropout_p, (lo, span, rows, per_chunk) = fctx.scale, fctx.dropout_p, fctx.geometry
        need_q, need_k, need_v = fctx.needs_input_grad[:3]
        tgt_len = q.size(2)
        grad_q = q.new_empty(q.shape[:2] + (probs.size(2) * rows, q.size(3))) if need_q else None
        grad_k = torch.zeros_like(k) if need_k else None
        grad_v = torch.zeros_like(v) if need_v else None
        for n0, n1, first, end in _chunks(probs.size(2), per_chunk, lo, span, rows):
            p, kept = probs[:, :, n0:n1], None if keep is None else keep[:, :, n0:n1]
            grad_blocks = _query_blocks(grad_out, n0 * rows, n1 * rows, rows)  # (B, H, n1 - n0, Q, Dv)
            if need_v:
                weights = p if kept is None else p.masked_fill(~kept, 0.0).div_(1 - dropout_p)
                _add_key_windows(grad_v, torch.matmul(weights.transpose(-1, -2), grad_blocks), first, span, rows)
                del weights
            if not (need_q or need_k):
                continue
            grad_p = torch.matmul(grad_blocks, _key_windows(v, first, end, span, rows).transpose(-1, -2))
            if kept is not None:
                grad_p = grad_p.masked_fill_(~kept, 0.0).div_(1 - dropout_p)
            if p.dtype in (torch.float16, torch.bfloat16):  # the softmax's backward in float32, as its forward
                grad_p, p = grad_p.float(), p.float()
            grad_scores = grad_p.sub_((grad_p * p).sum(-1, keepdim=True)).mul_(p).to(q.dtype)
            del grad_p, p
            if need_q:
                grad_q[:, :, n0 * rows: n1 * rows] = torch.matmul(
                    grad_scores, _key_windows(k, first, end, span, rows)).mul_(scale).flatten(2, 3)
            if need_k:
                grad_k_blocks = torch.matmul(grad_scores.transpose(-1, -2), _query_blocks(q, n0 * rows, n1 * rows, rows))
                _add_key_windows(grad_k, grad_k_blocks.mul_(scale), first, span, rows)
        return None if grad_q is None else grad_q[:, :, :tgt_len], grad_k, grad_v, None, None, None, None


def banded_attention(q: Tensor, k: Tensor, v: Tensor, half_width: Union[int, Tensor], bound: int, query_start: int,
                     key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor], scale: float,
                     dropout_p: float = 0.0, training: bool = False) -> Tensor:
    """(B, H, T, D) attention of q (B, H, T, D) over k, v (B, H, S, D) with key ``s`` allowed for query ``t``
    (key index ``query_start + t``) only where ``|query_start + t - s| <= half_width``.

    Args:
        half_width: ``b``: an int, or a tensor broadcastable to (B, T) (per sentence, per query).
        bound: an int >= every ``b`` of the call (the window read per query is ``2 * bound + 1`` keys).
        key_padding_mask: (B, S) bool, True at pad keys.
        attn_mask: (T, S) additive float (or bool, True = masked) mask, e.g. fairseq's causal mask.
    """
    bsz, heads, tgt_len, dim = q.shape
    src_len = k.size(2)
    rows = block_rows(bound, tgt_len)
    n_blocks = -(-tgt_len // rows)
    padded = n_blocks * rows
    span = rows + 2 * bound
    lo, hi = query_start - bound, query_start + padded + bound  # keys read, block n from lo + n * rows

    device = q.device
    offset = (torch.arange(span, device=device)[None, :] - bound) - torch.arange(rows, device=device)[:, None]  # s - t
    key = lo + torch.arange(n_blocks, device=device)[:, None, None] * rows + torch.arange(span, device=device)
    allowed = (key >= 0) & (key < src_len)  # (n, 1, span)
    if isinstance(half_width, Tensor):
        b = F.pad(torch.broadcast_to(half_width, (bsz, tgt_len)), (0, padded - tgt_len)).view(bsz, 1, n_blocks, rows, 1)
        allowed = allowed & (offset.abs() <= b)  # (B, 1, n, Q, span)
    else:
        allowed = allowed & (offset.abs() <= half_width)  # (n, Q, span)
    if key_padding_mask is not None:
        real = _key_windows(~key_padding_mask[:, None, :, None], lo, hi, span, rows, value=False)
        allowed = allowed & real.reshape(bsz, 1, n_blocks, 1, span)
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=device).masked_fill_(~allowed, float("-inf"))
    if attn_mask is not None:
        mask = mask + _block_table(attn_mask.detach(), q.dtype, lo, padded, span, rows)
    # a row with no allowed key would be a softmax of -inf only (NaN): unmasked, it stays finite
    dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
    mask = mask.masked_fill_(dead, 0.0)
    per_chunk = max(1, CHUNK_ELEMENTS // (bsz * heads * span * max(dim, v.size(-1))))
    return _BandedAttention.apply(q, k, v, mask, scale, dropout_p if training else 0.0, (lo, span, rows, per_chunk))


def _block_table(attn_mask: Tensor, dtype: torch.dtype, lo: int, padded: int, span: int, rows: int) -> Tensor:
    """A (T, S) mask's entries of each block's window, (n, Q, span): rows padded to ``padded``, keys read from
    ``lo`` (0 beyond the mask: those keys are out of range, masked already)."""
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill(
            attn_mask, float("-inf"))
    table = attn_mask.to(dtype)
    tgt_len, src_len = table.shape
    width = padded + span - rows  # keys lo .. lo + width - 1
    table = table[:, max(lo, 0): min(lo + width, src_len)]
    table = F.pad(table, (max(0, -lo), max(0, lo + width - src_len), 0, padded - tgt_len)).contiguous()
    # entry (n, r, c) = table[n * rows + r, n * rows + c]
    return table.as_strided((padded // rows, rows, span), (rows * width + rows, width, 1))
