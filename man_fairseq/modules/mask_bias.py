"""Mask modules of Mask Attention Networks, as additive logit biases (docs/man.md#dynamic-mask,
docs/man.md#static-masks)."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import flex_backend as flex
from .biased_attention import AttentionContext


class _LogSigmoidOfSum(torch.autograd.Function):
    """``logsigmoid(hw + dist + head)``, the (B,H,T,S) DMAN bias, keeping only the small terms.

    Autograd on the plain expression saves the (B,H,T,S) logits and, on CPU, logsigmoid's
    (B,H,T,S) buffer for the backward pass: two full-size tensors per DMAN sublayer held from
    the forward to the backward pass. Here the logits are recomputed in the backward pass and
    the gradient ``grad * sigmoid(-x)`` is reduced to the terms' shapes at once.
    """

    @staticmethod
    def forward(ctx, hw: Tensor, dist: Tensor, head: Tensor) -> Tensor:
        ctx.save_for_backward(hw, dist, head)
        x = hw + dist  # (B, 1, T, S)
        x = x + head  # (B, H, T, S)
        return F.logsigmoid(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return reduce_logsigmoid_grad(*ctx.saved_tensors, grad, ctx.needs_input_grad)


def reduce_logsigmoid_grad(hw: Tensor, dist: Tensor, head: Tensor, grad: Tensor, needed):
    """The gradient ``grad`` (B,H,T,S) of ``logsigmoid(hw + dist + head)`` reduced to each term's shape."""
    # d logsigmoid(x) / dx = sigmoid(-x), in place on the recomputed -x
    g = (hw + dist).neg_()
    g = (g - head).sigmoid_().mul_(grad)  # (B, H, T, S)
    g_heads = g.sum(1, keepdim=True)  # (B, 1, T, S): shared by hw and dist
    grad_hw = g_heads.sum(-1, keepdim=True) if needed[0] else None
    grad_dist = g_heads.sum((0, 1)) if needed[1] else None
    grad_head = g.sum((0, 2, 3), keepdim=True) if needed[2] else None
    return grad_hw, grad_dist, grad_head


class DynamicMaskBias(nn.Module):
    """DMAN mask ``M[t,s] = sigmoid(h_t·w + P[t-s] + U[head])`` applied as ``logsigmoid``.

    ``w`` is one vector per sublayer (no bias), ``P`` one scalar per signed relative distance
    clipped to ``[-max_relative_distance, max_relative_distance]`` (so any length works) and
    shared by the heads, ``U`` one scalar per head. Initialisation follows the reference code:
    ``P, U ~ N(0, 1)``, ``w`` Xavier-uniform; ``init="zeros"`` starts ``P`` and ``U`` at 0 instead.
    """

    INITS = ("normal", "zeros")

    def __init__(self, embed_dim: int, num_heads: int, max_relative_distance: int = 256, init: str = "normal"):
        super().__init__()
        if max_relative_distance < 0:
            raise ValueError("max_relative_distance must be >= 0")
        if init not in self.INITS:
            raise ValueError(f"DMAN init must be one of {self.INITS}, got {init!r}")
        self.init = init
        self.num_heads = num_heads
        self.max_relative_distance = max_relative_distance
        self.query_weight = nn.Parameter(torch.empty(1, embed_dim))
        self.distance_bias = nn.Parameter(torch.empty(2 * max_relative_distance + 1))
        self.head_bias = nn.Parameter(torch.empty(num_heads))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.xavier_uniform_(self.query_weight)
        # drawn in either case, so that "zeros" leaves every other parameter's draw as "normal" makes it
        nn.init.normal_(self.distance_bias)
        nn.init.normal_(self.head_bias)
        if self.init == "zeros":
            nn.init.zeros_(self.distance_bias)
            nn.init.zeros_(self.head_bias)

    def terms(self, ctx: AttentionContext):
        """The three terms of the logits: ``h_t·w`` (B,1,T,1), ``P[t-s]`` (T,S), ``U`` (1,H,1,1)."""
        hw = torch.matmul(ctx.query, self.query_weight.t().to(ctx.query.dtype))  # (T, B, 1)
        hw = hw.permute(1, 2, 0).unsqueeze(-1)  # (B, 1, T, 1)
        rel = ctx.query_positions()[:, None] - ctx.key_positions()[None, :]
        rel = rel.clamp(-self.max_relative_distance, self.max_relative_distance)
        dist = self.distance_bias[rel + self.max_relative_distance]  # (T, S)
        return hw, dist, self.head_bias.view(1, -1, 1, 1)

    def logits(self, ctx: AttentionContext) -> Tensor:
        """The pre-sigmoid mask logits, (B, H, T, S)."""
        hw, dist, head = self.terms(ctx)
        return hw + dist + head

    def forward(self, ctx: AttentionContext) -> Tensor:
        return _LogSigmoidOfSum.apply(*self.terms(ctx))

    # the fused CPU path's reducer (fused_bias_grad.py): the bias of a block (sentences, query rows) from
    # the three terms, and a block's score gradient dS reduced to them at once
    def fused_bias_terms(self, ctx: AttentionContext):
        return self.terms(ctx)

    @staticmethod
    def fused_bias_block(terms, batch: slice, rows: slice, blocked) -> Tensor:
        hw, dist, head = terms
        x = hw[batch, :, rows] + dist[rows]  # (b, 1, r, S)
        if blocked is not None:  # logsigmoid(-inf) = -inf: the fixed mask folded in before the heads' broadcast
            x = x.masked_fill(blocked, float("-inf"))
        return F.logsigmoid(x + head)

    @staticmethod
    def fused_bias_grad(terms, batch: slice, rows: slice, grad_scores: Tensor, bias: Tensor, grads) -> None:
        hw, dist, head = terms
        # d logsigmoid(x) / dx = sigmoid(-x) = 1 - exp(logsigmoid(x)), from the block's bias (in place)
        g = torch.addcmul(grad_scores, grad_scores, bias.exp_(), value=-1)  # (b, H, r, S)
        g_heads = g.sum(1, keepdim=True)  # shared by hw and dist
        if grads[0] is None:
            grads[:] = [torch.zeros_like(hw), torch.zeros_like(dist), torch.zeros_like(head)]
        grads[0][batch, :, rows] += g_heads.sum(-1, keepdim=True)
        grads[1][rows] += g_heads.sum((0, 1))
        grads[2] += g.sum((0, 2, 3), keepdim=True)

    def flex_mods(self, ctx: AttentionContext, shape: flex.FlexShape) -> flex.FlexMods:
        """The same bias as a flex score mod from ``h_t·w`` (B,T), ``P`` and ``U``: no (T,S) tensor."""
        dtype = flex.small_dtype(ctx.q)
        hw = torch.matmul(ctx.query, self.query_weight.t().to(ctx.query.dtype))  # (T, B, 1)
        hw = flex.pad_dims(hw[..., 0].t().to(dtype), {0: shape.batch, 1: shape.q})  # (B', q_len)
        distance_bias, head_bias = self.distance_bias.to(dtype), self.head_bias.to(dtype)
        k = self.max_relative_distance
        query_start = flex.device_scalar(ctx.query_start, ctx.q.device)

        def dman(score, b, h, q_idx, kv_idx):
            rel = (q_idx + query_start - kv_idx).clamp(-k, k) + k
            return score + F.logsigmoid(hw[b, q_idx] + distance_bias[rel] + head_bias[h]).to(score.dtype)

        return flex.FlexMods(score_mods=[dman])

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, max_relative_distance={self.max_relative_distance}, init={self.init}"


class StaticWindowBias(nn.Module):
    """Static mask of the paper's Table 4: ``M[t,s] = 1 if |t-s| <= b else 0`` (bias 0 / -inf).

    ``window`` is an int (SMAN2: ``b = 4``) or ``"sqrt_half_length"`` (SMAN1:
    ``b = max(1, round(sqrt(L/2)))`` with ``L`` the unpadded key length of the sentence; in
    causal self-attention ``L`` is the visible prefix ``t+1``, so that incremental decoding sees
    the same mask as the full pass).
    Positions are counted from the first real token, so left- and right-padding agree.
    A hard band: in self-attention the core may compute only the keys inside it (``half_width``,
    ``band_bound``; banded_attention.py).
    """

    can_mask_all_keys = True

    def __init__(self, window, causal: bool = False):
        super().__init__()
        self.causal = causal
        if window != "sqrt_half_length" and (not isinstance(window, int) or window < 0):
            raise ValueError(f"static window must be an int >= 0 or 'sqrt_half_length', got {window!r}")
        self.window = window

    @staticmethod
    def sqrt_half_length(length: Tensor) -> Tensor:
        return torch.clamp(torch.round(torch.sqrt(length.to(torch.float64) / 2.0)), min=1)

    def half_width(self, ctx: AttentionContext):
        """``b`` of every query: an int (SMAN2), or float64 (B, 1) per sentence, (B, T) per query (SMAN1 causal)."""
        if self.window != "sqrt_half_length":
            return self.window
        device = ctx.q.device
        if ctx.key_padding_mask is not None:
            length = (~ctx.key_padding_mask).sum(-1).to(torch.float64)  # (B,)
            first = ctx.key_padding_mask.long().argmin(-1)  # first real key
        else:
            length = torch.full((ctx.k.size(0),), float(ctx.num_keys), dtype=torch.float64, device=device)
            first = torch.zeros(ctx.k.size(0), dtype=torch.long, device=device)
        if self.causal:
            # visible prefix of each query, counted from the first real token
            prefix = (ctx.query_positions()[None, :] - first[:, None] + 1).clamp(min=1)
            return self.sqrt_half_length(prefix)  # (B, T)
        return self.sqrt_half_length(length)[:, None]  # (B, 1)

    def band_bound(self, num_keys: int) -> int:
        """An int >= every ``b`` of a call with ``num_keys`` keys (a length or prefix is at most that), found
        without reading a device tensor: the banded path's window (banded_attention.py)."""
        if self.window != "sqrt_half_length":
            return self.window
        return int(self.sqrt_half_length(torch.tensor(float(num_keys))))

    def forward(self, ctx: AttentionContext) -> Tensor:
        t_pos = ctx.query_positions()[:, None]
        s_pos = ctx.key_positions()[None, :]
        dist = (t_pos - s_pos).abs()[None]  # (1, T, S); padding offsets cancel in t - s
        b = self.half_width(ctx)
        outside = dist > (b if isinstance(b, int) else b[..., None])
        bias = torch.zeros(outside.shape, dtype=ctx.q.dtype, device=dist.device)
        bias = bias.masked_fill(outside, float("-inf"))
        return bias.unsqueeze(1)  # (B|1, 1, T, S)

    def flex_mods(self, ctx: AttentionContext, shape: flex.FlexShape) -> flex.FlexMods:
        """The window as a flex mask mod (a block mask: whole blocks outside it are skipped)."""
        device = ctx.q.device
        query_start = flex.device_scalar(ctx.query_start, device)
        if self.window != "sqrt_half_length":
            b = self.window

            def window(bi, h, q_idx, kv_idx):
                return (q_idx + query_start - kv_idx).abs() <= b

            return flex.FlexMods(mask_mods=[window])
        b = self.half_width(ctx).long()
        if self.causal:
            half = flex.pad_dims(b, {0: shape.batch, 1: shape.q})  # (B', q_len)

            def window(bi, h, q_idx, kv_idx):
                return (q_idx + query_start - kv_idx).abs() <= half[bi, q_idx]
        else:
            half = flex.pad_dims(b[:, 0], {0: shape.batch})  # (B',)

            def window(bi, h, q_idx, kv_idx):
                return (q_idx + query_start - kv_idx).abs() <= half[bi]

        return flex.FlexMods(mask_mods=[window])

    def extra_repr(self) -> str:
        return f"window={self.window}, causal={self.causal}"
