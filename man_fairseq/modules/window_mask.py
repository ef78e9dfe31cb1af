"""The soft window mask of differentiable window attention (docs/diffwin.md#pointers-soft-masks-aw-and-mw):
the expectation of the discrete window indicator over the two boundary pointer distributions
``phi_L``, ``phi_R`` (B, T, S) of :mod:`man_fairseq.modules.diff_window`::

    m = (phi_L L) * (phi_R L^T) + (phi_R L) * (phi_L L^T),   L[i, j] = 1 if i <= j

``(phi L)[t, j] = P(pointer <= j)`` is a cumulative sum from the left and ``(phi L^T)[t, j] =
P(pointer >= j)`` one from the right, so both are computed with ``cumsum`` (O(T·S)), never with
an ``S x S`` triangular product. The first term is the window ``[l, r]`` when ``l <= r``, the
second the swapped window ``[r, l]`` when ``l > r``. As in the paper both terms are 1 when
``l == r``, so a one-hot pointer pair with ``l == r`` gives the value 2 at that single key (the
formula is the expectation of ``1[l<=j<=r] + 1[r<=j<=l]``). ``union=True`` (option
``--diffwin-mask-union``, not in the paper) subtracts the double-counted event,
``P(l and r both in j's token/segment)``, so that ``m = P(min(l,r) <= j <= max(l,r))`` <= 1.

Segment masks replace ``L`` by ``J`` with ``J[i, j] = 1 if i <= b * ceil(j / b)`` (1-based ``i, j``;
segment size ``b``). In 0-based indices used in this file: key ``j`` lies in segment
``g(j) = (j - o) // b`` where ``o`` is the index of the first non-pad key of the sequence (so a
left-padded batch has the same segments as an unpadded one; with ``o = 0`` this is exactly the
paper's ``J``). With ``end(j) = o + (g(j) + 1) b - 1`` (clipped to ``S - 1``) and
``start(j) = o + g(j) b``::

    (phi J)[t, j]   = P(g(pointer) <= g(j)) = cumsum(phi)[t, end(j)]
    (phi J^T)[t, j] = P(g(pointer) >= g(j)) = revcumsum(phi)[t, start(j)]

so every key of a segment gets the same mask value. ``segment_size = 1`` is the token mask.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor


def segment_bounds(
    num_keys: int, segment_size: int, key_padding_mask: Optional[Tensor], device
) -> Tuple[Tensor, Tensor]:
    """0-based ``(start(j), end(j))`` of the segment of every key, each ``(B|1, S)`` long.

    Segments start at the first non-pad key of each sequence (see the module docstring).
    """
    keys = torch.arange(num_keys, device=device)
    if key_padding_mask is None:
        offset = torch.zeros(1, 1, dtype=torch.long, device=device)
    else:
        # index of the first real key; argmax returns the first maximum
        offset = (~key_padding_mask).to(torch.int8).argmax(dim=-1, keepdim=True).long()
    segment = torch.div(keys[None, :] - offset, segment_size, rounding_mode="floor")
    start = (offset + segment * segment_size).clamp(0, num_keys - 1)
    end = (offset + (segment + 1) * segment_size - 1).clamp(0, num_keys - 1)
    return start, end


def soft_window_mask(
    phi_left: Tensor,
    phi_right: Tensor,
    segment_size: int = 1,
    key_padding_mask: Optional[Tensor] = None,
    bounds: Optional[Tuple[Tensor, Tensor]] = None,
    union: bool = False,
) -> Tensor:
    """Soft window mask ``m`` (B, T, S) from boundary pointers ``phi_*`` (B, T, S).

    ``segment_size > 1`` gives the segment-based mask (``J`` instead of ``L``); segments are
    aligned to the first non-pad key given ``key_padding_mask`` (B, S), True at pads.
    ``bounds``: precomputed :func:`segment_bounds` (decoding reuses them for static keys).
    ``union``: count ``l`` and ``r`` in the same token/segment once (mask <= 1; not the paper).
    Half-precision pointers are summed in float32; the mask is returned in their dtype.
    """
    out_dtype = phi_left.dtype
    if out_dtype in (torch.float16, torch.bfloat16):
        # P(pointer >= j) = total - P(<= j) + phi cancels towards the far end of a sharp pointer:
        # in half a true 1e-5 comes out at the rounding error of the total (~4e-3 in bf16)
        phi_left, phi_right = phi_left.float(), phi_right.float()
    # P(pointer <= j) and P(pointer >= j); the total (1 up to rounding) keeps them consistent
    left_le = phi_left.cumsum(-1)
    right_le = phi_right.cumsum(-1)
    left_total, right_total = left_le[..., -1:], right_le[..., -1:]
    left_ge = left_total - left_le + phi_left
    right_ge = right_total - right_le + phi_right
    if segment_size > 1:
        bsz, tgt_len, src_len = phi_left.shape
        if bounds is None:
            bounds = segment_bounds(src_len, segment_size, key_padding_mask, phi_left.device)
        start, end = bounds
        start = start[:, None, :].expand(bsz, tgt_len, src_len)
        end = end[:, None, :].expand(bsz, tgt_len, src_len)
        left_le, right_le = left_le.gather(-1, end), right_le.gather(-1, end)
        left_ge, right_ge = left_ge.gather(-1, start), right_ge.gather(-1, start)
    mask = left_le * right_ge + right_le * left_ge
    if union:
        # P(pointer in j's segment) = P(<= seg) + P(>= seg) - total
        left_in = left_le + left_ge - left_total
        right_in = right_le + right_ge - right_total
        mask = mask - left_in * right_in
    return mask.to(out_dtype)
