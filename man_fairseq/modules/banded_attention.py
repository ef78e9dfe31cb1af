"""Attention over the keys of a hard band only (issue 80): SMAN's static windows, ``|t - s| <= b``.

A hard window gives every key outside it exactly zero weight, so the keys outside need no score.
The queries are cut into blocks of ``Q`` consecutive rows; block ``n`` reads the ``Q + 2 * bound``
keys around it (``bound``: the largest half width of the call, no device sync), its own block of keys
and the first ``2 bound`` of the next (:func:`_key_windows`). Per block, the scores are one dense ``(Q, Q + 2 bound)``
product (batched matrix products, as the full path's), masked to ``-inf`` outside each query's band,
beyond the sequence, at padded keys and where ``attn_mask`` says so, then softmax, attention dropout and
the weighted sum of the block's values. Autograd differentiates it as written (no custom backward), so
the gradients are the full path's restricted to the band. The work per call is ``T * (Q + 2 bound)``
scores instead of ``T * S``: :func:`band_is_cheaper` says when that pays.

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

# Query rows per block, at least the band's width: one forward and backward of (20, 4, 400, 64) at b = 4 took
# 441, 382, 422, 411, 441 ms with blocks of 8, 16, 24, 32, 48 rows (one thread, a loaded machine).
MIN_BLOCK_ROWS = 16
# The band is taken when its scores are at most this fraction of the full path's: its copies of k and v and
# its small products cost more per score. One SMAN2 sublayer (d 256, 4 heads, b = 4) forward and backward,
# 8,000 tokens a batch, one thread, CPU time banded / full: T = 32: 1.13 (the band computes 0.75 of the
# scores), T = 64: 1.09 (0.38), T = 100: 0.96 (0.27), T = 160: 0.89 (0.15), T = 400: 0.61 (0.06).
MAX_BAND_FRACTION = 0.2

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

    k_blocks = _key_windows(k, lo, hi, span, rows)  # (B, H, n, span, D)
    v_blocks = _key_windows(v, lo, hi, span, rows)
    q_blocks = F.pad(q, (0, 0, 0, padded - tgt_len)).view(bsz, heads, n_blocks, rows, dim)

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
        mask = mask + _block_table(attn_mask, q.dtype, lo, padded, span, rows)
    # a row with no allowed key would be a softmax of -inf only (NaN): unmasked, it stays finite
    dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
    mask = mask.masked_fill_(dead, 0.0)

    scores = torch.matmul(q_blocks, k_blocks.transpose(-1, -2)).mul_(scale).add_(mask)  # (B, H, n, Q, span)
    low_precision = scores.dtype in (torch.float16, torch.bfloat16)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32 if low_precision else None).to(q.dtype)
    if dropout_p > 0 and training:
        probs = F.dropout(probs, p=dropout_p, training=True)  # the zero weights outside the band stay zero
    out = torch.matmul(probs, v_blocks).view(bsz, heads, padded, v.size(-1))
    return out[:, :, :tgt_len]


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
