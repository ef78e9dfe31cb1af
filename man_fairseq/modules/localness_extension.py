"""The Gaussian localness bias as extra query/key dimensions (docs/localness.md#the-bias-as-extra-querykey-dimensions).

``G[t,s] = -(s - P_t)^2 / (2 sigma_t^2)`` is a quadratic in the key position ``s`` whose
coefficients belong to the query, so it is a dot product: appended to the scaled query and to
the key, a few columns give ``q_t·k_s/sqrt(d) + G[t,s]`` from plain ``scaled_dot_product_attention``
with no ``(B,H,T,S)`` bias, which runs PyTorch's fused kernel and differentiates ``P`` and ``sigma``
through the query's gradient.

The naive form ``[a_t, b_t]·[s^2, s]`` (``a = -1/(2 sigma^2)``, ``b = P/sigma^2``, the row constant
dropped) cancels catastrophically in float32: near the centre both terms are about
``P^2/(2 sigma^2)`` (320,000 at P = 400, sigma = 0.5) while their sum is O(1). Here the key
positions are split into ``n`` blocks of width ``w`` with centres ``o_j``; a query uses only the
block ``j`` holding its centre, ``y = P - o_j``, ``x = s - o_j``:

    G = a (x - y)^2 = a x^2 + (-2 a y) x + a y^2

keys carry ``[(s - o_1)^2 .. (s - o_n)^2, s - o_1 .. s - o_n, 1]`` (``2n + 1`` columns), a query
``a`` and ``-2 a y`` in its block's two columns (zeros elsewhere) and ``a y^2`` in the last one, so
the logit is ``G`` itself, not ``G`` minus a row constant. For the keys that carry the weight
(``|s - P|`` a few sigma) every term is at most about ``(w / (2 sigma))^2``, so the rounding error
grows with ``rho = w / sigma``, not with the sentence length. The columns are in float32 (float64
for a float64 model) whatever the model's precision: ``s^2`` needs it.

The rule (:func:`block_count`): the fewest blocks with ``S / n <= RHO_MAX * sigma_min`` (the
smallest sigma of the call's real queries; in float64 too, so that the error stays the same small
multiple of the unit roundoff), at most ``MAX_BLOCKS``; beyond that (very narrow windows on long
sentences) the caller adds the explicit bias instead. The measured errors at ``RHO_MAX`` are in
docs/localness.md and tested.
"""

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

# block width / smallest sigma at which the float32 form is allowed (docs/localness.md: output error
# from float64 below 2e-5 at unit-variance values, against 1e-6 for the explicit float32 bias)
RHO_MAX = 32.0
# at most 2 * 32 + 1 = 65 extra columns (a head dimension of 64 becomes 129, the values padded)
MAX_BLOCKS = 32


def extension_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the extended q/k: float64 stays float64, everything else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def block_count(sigma: Tensor, num_keys: int, real: Optional[Tensor] = None) -> Optional[int]:
    """Blocks for ``num_keys`` key positions that keep ``w / sigma_min <= RHO_MAX``, or None when more than :data:`MAX_BLOCKS` would be needed.

    ``real`` (broadcastable to ``sigma``) marks the queries whose windows count; a pad query's
    window is never read. Reading ``sigma_min`` is a host sync (free on the CPU).
    """
    if real is not None:
        sigma = sigma.detach().masked_fill(~real, float("inf"))
    sigma_min = float(sigma.detach().min())
    if math.isinf(sigma_min):  # no real query: any block count is exact enough
        return 1
    if not sigma_min > 0:  # a zero (or NaN) window: the explicit bias gives what it always gave
        return None
    blocks = max(1, math.ceil(num_keys / (RHO_MAX * sigma_min)))
    return blocks if blocks <= MAX_BLOCKS else None


def gaussian_dims(centre: Tensor, sigma: Tensor, positions: Tensor, num_keys: int,
                  blocks: int) -> Tuple[Tensor, Tensor]:
    """The extra query columns (B,H,T,2n+1) and key columns (B|1,S,2n+1) of the block form.

    Args:
        centre, sigma: ``P`` and ``sigma`` (B,H,T,1), already in the extension dtype.
        positions: key positions (B|1, S), counted from the first real key.
        num_keys: S; the blocks cover positions ``[0, n*w)`` with ``w = ceil(S / n)``.
        blocks: n (:func:`block_count`).
    """
    width = -(-num_keys // blocks)
    offsets = torch.arange(blocks, dtype=centre.dtype, device=centre.device) * width + (width - 1) / 2
    x = positions.unsqueeze(-1) - offsets  # (B|1, S, n)
    k_extra = torch.cat([x * x, x, torch.ones_like(x[..., :1])], dim=-1)

    block = torch.div(centre.detach(), width, rounding_mode="floor").clamp_(0, blocks - 1).long()  # (B,H,T,1)
    one_hot = (block == torch.arange(blocks, device=centre.device)).to(centre.dtype)  # (B,H,T,n)
    y = centre - offsets[block]  # P - o_j
    a = -0.5 / (sigma * sigma)
    q_extra = torch.cat([one_hot * a, one_hot * (-2.0 * a * y), a * y * y], dim=-1)
    return q_extra, k_extra
