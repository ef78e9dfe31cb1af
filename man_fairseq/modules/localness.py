"""Localness as a learnable Gaussian bias (Yang et al. 2018, "Modeling Localness for
Self-Attention Networks"), docs/localness.md#the-gaussian-bias.

For query ``t`` and key ``s`` of one head the additive logit bias is

    G[t, s] = -(s - P_t)^2 / (2 sigma_t^2),    sigma_t = D_t / 2,
    [P_t ; D_t] = I * sigmoid([p_t ; z_t]),     p_t = u_p^m · tanh(W_p q_t)

with ``q_t`` the projected query of all heads together (d-dimensional, before the head split),
``W_p`` (d x d, no bias) shared by the heads and ``u_p^m`` (d) one vector per head ``m``.
``I`` is the unpadded key length; in causal (decoder) self-attention it is the visible prefix
``t+1``, so an incremental step sees exactly the bias row of the full pass. Positions (the key
index ``s`` and therefore the centre ``P_t``) are 0-based and counted from the first real token,
whatever the padding side.

Window strategies (``D_t``):

* ``fixed``: ``D = window`` (default 10), no parameter;
* ``layer``: ``z = u_d^m · tanh(W_d mean_s k_s)`` with ``k_s`` the projected keys and the mean over
  the non-pad keys (causal: over the visible prefix, a cumulative mean);
* ``query``: ``z_t = u_d^m · tanh(W_p q_t)``, sharing ``W_p`` (and ``tanh(W_p q_t)``) with the
  centre — at d = 512, 8 heads this adds d^2 + 2Hd = 270,336 parameters per layer;
* ``head``: ``D^m = N * sigmoid(z^m)``, one learned scalar per head, ``N`` default 50
  (not scaled by the length, as in the paper).

Initialisation (the paper does not state one): ``W_p``/``W_d`` Xavier-uniform, ``u`` vectors
``N(0, 1/d)`` so that ``p_t`` and ``z_t`` start O(1), head scalars ``z^m = 0`` (``D = N/2``).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from . import flex_backend as flex
from . import localness_extension as extension
from .biased_attention import AttentionContext

WINDOW_STRATEGIES = ("fixed", "layer", "query", "head")


class _GaussianBias(torch.autograd.Function):
    """``-(pos - P)^2 / (2 sigma^2)`` materialising one (B,H,T,S) tensor in forward.

    Autograd on the plain expression would keep three (B,H,T,S) intermediates alive for the
    backward pass; here only the small inputs are saved and the gradients are reduced on the fly:
    dG/dP = (s - P) / sigma^2 and dG/dsigma = (s - P)^2 / sigma^3.
    """

    @staticmethod
    def forward(ctx, centre: Tensor, sigma: Tensor, positions: Tensor) -> Tensor:
        ctx.save_for_backward(centre, sigma, positions)
        out = positions - centre  # the one big allocation
        out.div_(sigma).square_().mul_(-0.5)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        centre, sigma, positions = ctx.saved_tensors
        grad_centre = grad_sigma = None
        scaled = (positions - centre).div_(sigma)  # (s - P) / sigma
        if ctx.needs_input_grad[0]:
            grad_centre = (grad * scaled).div_(sigma).sum_to_size(centre.shape)
        if ctx.needs_input_grad[1]:
            grad_sigma = (grad * scaled.square_()).div_(sigma).sum_to_size(sigma.shape)
        return grad_centre, grad_sigma, None


def gaussian_bias(centre: Tensor, sigma: Tensor, positions: Tensor) -> Tensor:
    """Broadcast ``positions`` (…,1,1,S), ``centre`` (…,T,1), ``sigma`` to the bias (B,H,T,S)."""
    shape = torch.broadcast_shapes(centre.shape, sigma.shape, positions.shape)
    # the Function writes in place into ``positions - centre``: it must already have the full shape
    if torch.broadcast_shapes(centre.shape, positions.shape) != shape:
        centre = centre.expand(shape[:-1] + (1,))
    return _GaussianBias.apply(centre, sigma, positions)


def real_positions(ctx: AttentionContext) -> Tuple[Tensor, Tensor]:
    """Key positions counted from the first real key, and the number of real keys up to each key.

    Returns ``positions`` (B|1, S) and ``count`` (B|1, S): ``count[:, s]`` real keys at index ≤ s.
    Pad keys get arbitrary positions (their logits are ``-inf`` anyway).
    """
    if ctx.key_padding_mask is None:
        count = torch.arange(1, ctx.num_keys + 1, device=ctx.k.device).unsqueeze(0)
    else:
        count = (~ctx.key_padding_mask).long().cumsum(-1)
    return count - 1, count


class LocalnessBias(nn.Module):
    """The Gaussian localness bias of one attention, (B, H, T, S)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        window: str = "query",
        causal: bool = False,
        fixed_window: float = 10.0,
        head_window_max: float = 50.0,
    ):
        super().__init__()
        if window not in WINDOW_STRATEGIES:
            raise ValueError(f"unknown localness window strategy {window!r}; choose one of {WINDOW_STRATEGIES}")
        if window == "fixed" and not fixed_window > 0:
            raise ValueError("the fixed localness window must be > 0")
        if window == "head" and not head_window_max > 0:
            raise ValueError("the head-specific localness window maximum N must be > 0")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.window = window
        self.causal = causal
        self.fixed_window = float(fixed_window)
        self.head_window_max = float(head_window_max)

        self.centre_proj = nn.Linear(embed_dim, embed_dim, bias=False)  # W_p
        # u_p^m for every head, followed by u_d^m when the window is query-specific (shared W_p)
        n_u = 2 * num_heads if window == "query" else num_heads
        self.query_vectors = nn.Parameter(torch.empty(n_u, embed_dim))
        if window == "layer":
            self.window_proj = nn.Linear(embed_dim, embed_dim, bias=False)  # W_d
            self.window_vectors = nn.Parameter(torch.empty(num_heads, embed_dim))  # u_d^m
        if window == "head":
            self.head_window_logits = nn.Parameter(torch.empty(num_heads))  # z^m
        # set by the localness-windows command to collect (P, D, I) of the last call
        self.record = False
        self.last_windows: Optional[dict] = None
        self.reset_parameters()

    def reset_parameters(self):
        std = self.embed_dim ** -0.5
        nn.init.xavier_uniform_(self.centre_proj.weight)
        nn.init.normal_(self.query_vectors, std=std)
        if self.window == "layer":
            nn.init.xavier_uniform_(self.window_proj.weight)
            nn.init.normal_(self.window_vectors, std=std)
        if self.window == "head":
            nn.init.zeros_(self.head_window_logits)

    @staticmethod
    def _merge_heads(x: Tensor) -> Tensor:
        """(B, H, L, D) -> (B, L, H*D), the projection output before fairseq's head split."""
        b, h, n, d = x.shape
        return x.transpose(1, 2).reshape(b, n, h * d)

    def centres_and_windows(self, ctx: AttentionContext) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """``P`` (B,H,T,1), ``D`` (broadcastable to P), key positions (B|1,1,1,S), ``I`` (B|1,1,T|1,1)."""
        q = self._merge_heads(ctx.q)  # (B, T, d)
        compute_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        hidden = torch.tanh(self.centre_proj(q)).to(compute_dtype)  # tanh(W_p q_t)
        logits = torch.matmul(hidden, self.query_vectors.to(compute_dtype).t())  # (B, T, H | 2H)
        logits = logits.transpose(1, 2).unsqueeze(-1)  # (B, H | 2H, T, 1)

        positions, count = real_positions(ctx)
        if self.causal:
            # visible prefix of every query: real keys up to and including the query position
            t_idx = ctx.query_positions()
            length = count[:, t_idx].unsqueeze(1).unsqueeze(-1)  # (B|1, 1, T, 1)
        else:
            length = count[:, -1:].unsqueeze(1).unsqueeze(-1)  # (B|1, 1, 1, 1)
        # a pad query of a left-padded causal sequence sees no real key; 1 keeps its row finite
        length = length.clamp(min=1).to(compute_dtype)
        positions = positions.to(compute_dtype)[:, None, None, :]  # (B|1, 1, 1, S)

        centre = length * torch.sigmoid(logits[:, : self.num_heads])
        if self.window == "fixed":
            window = torch.full((1, 1, 1, 1), self.fixed_window, dtype=compute_dtype, device=q.device)
        elif self.window == "query":
            window = length * torch.sigmoid(logits[:, self.num_heads :])
        elif self.window == "head":
            window = self.head_window_max * torch.sigmoid(self.head_window_logits.to(compute_dtype))
            window = window.view(1, -1, 1, 1)
        else:  # layer: mean of the projected non-pad keys (causal: of the visible prefix)
            keys = self._merge_heads(ctx.k).to(compute_dtype)  # (B, S, d)
            if ctx.key_padding_mask is not None:
                keys = keys.masked_fill(ctx.key_padding_mask.unsqueeze(-1), 0.0)
            if self.causal:
                prefix_sum = keys.cumsum(1)[:, ctx.query_positions()]  # (B, T, d)
                mean = prefix_sum / length.squeeze(1)
            else:
                mean = keys.sum(1, keepdim=True) / length.squeeze(1)  # (B, 1, d)
            hidden_d = torch.tanh(self.window_proj(mean.to(self.window_proj.weight.dtype))).to(compute_dtype)
            z = torch.matmul(hidden_d, self.window_vectors.to(compute_dtype).t())  # (B, T|1, H)
            window = length * torch.sigmoid(z.transpose(1, 2).unsqueeze(-1))  # (B, H, T|1, 1)
        return centre, window, positions, length

    def _record(self, ctx: AttentionContext, centre: Tensor, window: Tensor, length: Tensor) -> None:
        self.last_windows = {
            "centre": centre.detach(), "window": window.detach(), "length": length.detach(),
            "query_start": ctx.query_start,
            "key_padding_mask": None if ctx.key_padding_mask is None else ctx.key_padding_mask.detach(),
        }

    def forward(self, ctx: AttentionContext) -> Tensor:
        centre, window, positions, length = self.centres_and_windows(ctx)
        if self.record:
            self._record(ctx, centre, window, length)
        bias = gaussian_bias(centre, window / 2, positions)
        if ctx.q.dtype == torch.float16:
            # -(s-P)^2/(2 sigma^2) can overflow half precision; a row of -inf would give NaN
            bias = bias.clamp(min=-3e4)
        return bias

    def extended_query_key(self, ctx: AttentionContext, scaling: float) -> Optional[Tuple[Tensor, Tensor]]:
        """``q`` and ``k`` with the bias as extra dimensions (:mod:`.localness_extension`), so
        that ``softmax(q' k'^T) = softmax(q k^T * scaling + G)`` with no ``(B,H,T,S)`` tensor;
        None where the float32 error bound cannot be met, and under ``torch.compile`` (the block
        count reads the smallest window from the data: a host sync, a graph break); the caller
        adds the bias instead."""
        if torch.compiler.is_compiling():
            return None
        centre, window, positions, length = self.centres_and_windows(ctx)
        if self.record:
            self._record(ctx, centre, window, length)
        sigma = (window / 2).expand_as(centre)
        dtype = extension.extension_dtype(ctx.q.dtype)
        blocks = extension.block_count(sigma, ctx.num_keys, self._real_queries(ctx))
        if blocks is None:
            return None
        q_extra, k_extra = extension.gaussian_dims(centre.to(dtype), sigma.to(dtype),
                                                   positions[:, 0, 0, :].to(dtype), ctx.num_keys, blocks)
        q = torch.cat([ctx.q.to(dtype) * scaling, q_extra], dim=-1)
        k = torch.cat([ctx.k.to(dtype), k_extra.unsqueeze(1).expand(ctx.k.shape[:-1] + k_extra.shape[-1:])], dim=-1)
        return q, k

    @staticmethod
    def _real_queries(ctx: AttentionContext) -> Optional[Tensor]:
        """(B, 1, T, 1) True at the real queries of a self-attention (a pad query's window is
        unused and must not decide the path); None where it is not known (cross-attention)."""
        if ctx.key_padding_mask is None or not ctx.self_attention:
            return None
        return ~ctx.key_padding_mask[:, ctx.query_positions()][:, None, :, None]

    def flex_mods(self, ctx: AttentionContext, shape: flex.FlexShape) -> flex.FlexMods:
        """The Gaussian bias as a flex score mod from P, sigma (B,H,T) and key positions (B,S)."""
        centre, window, positions, length = self.centres_and_windows(ctx)
        if self.record:
            self._record(ctx, centre, window, length)
        bsz, heads, t = centre.shape[:3]
        centre = flex.pad_dims(centre[..., 0], {0: shape.batch, 2: shape.q})  # (B', H, q_len)
        sigma = (window / 2).expand(bsz, heads, t, 1)[..., 0]
        sigma = flex.pad_dims(sigma, {0: shape.batch, 2: shape.q}, 1.0)
        positions = positions[:, 0, 0, :].expand(bsz, -1)
        positions = flex.pad_dims(positions, {0: shape.batch, 1: shape.kv})  # (B', kv_len)
        clamp = ctx.q.dtype == torch.float16

        def localness(score, b, h, q_idx, kv_idx):
            scaled = (positions[b, kv_idx] - centre[b, h, q_idx]) / sigma[b, h, q_idx]
            bias = -0.5 * scaled * scaled
            if clamp:  # as the dense path: a half-precision bias is clamped to stay finite
                bias = bias.clamp(min=-3e4)
            return score + bias.to(score.dtype)

        return flex.FlexMods(score_mods=[localness])

    def extra_repr(self) -> str:
        extra = {"fixed": f", D={self.fixed_window:g}", "head": f", N={self.head_window_max:g}"}.get(self.window, "")
        return f"heads={self.num_heads}, window={self.window}{extra}, causal={self.causal}"
