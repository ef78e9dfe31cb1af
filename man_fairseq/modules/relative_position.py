"""Relative position representations (Shaw et al. 2018) on top of the biased attention core.

For query ``t`` and key ``s`` with clipped distance ``r = clip(s - t, -K, K)``:

    e[t, s] = q_t · (k_s + a^K_r) / sqrt(d_h)           (+ any other bias, e.g. localness)
    out_t   = sum_s p[t, s] (v_s + a^V_r)

``a^K``, ``a^V`` are ``(2K+1, d_h)`` tables shared by the heads (as in the paper). The key-side
term is an additive logit bias, so it goes through the core's bias path (next to the localness
bias, causal mask and padding). The value-side term is not a logit bias: it is added to the head
outputs before the output projection through the core's ``attend_values`` hook, which needs the
(dropped-out) probabilities and so forces the explicit attention path instead of the fused
``scaled_dot_product_attention`` kernel.

Distances depend on ``s - t`` only, so left- and right-padded batches agree; an incremental step
has query position ``ctx.query_start + i``, so it sees the row of the full pass.
"""

from typing import Optional

import torch
from torch import Tensor, nn

from .biased_attention import AttentionContext, BiasedMultiheadAttention


class RelativePositionMultiheadAttention(BiasedMultiheadAttention):
    """:class:`BiasedMultiheadAttention` with Shaw et al.'s relative key and value embeddings."""

    needs_probabilities = True

    def __init__(self, embed_dim: int, num_heads: int, max_relative_position: int = 16, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        if not self.self_attention:
            raise ValueError("relative position representations are defined for self-attention only")
        if max_relative_position < 1:
            raise ValueError("max_relative_position (clipping distance K) must be >= 1")
        self.max_relative_position = max_relative_position
        self.relative_keys = nn.Parameter(torch.empty(2 * max_relative_position + 1, self.head_dim))
        self.relative_values = nn.Parameter(torch.empty(2 * max_relative_position + 1, self.head_dim))
        nn.init.xavier_uniform_(self.relative_keys)
        nn.init.xavier_uniform_(self.relative_values)

    def relative_index(self, ctx: AttentionContext) -> Tensor:
        """(T, S) index into the tables: clip(s - t, -K, K) + K."""
        k = self.max_relative_position
        rel = ctx.key_positions()[None, :] - ctx.query_positions()[:, None]
        return rel.clamp(-k, k) + k

    def _additive_mask(self, ctx: AttentionContext, attn_mask: Optional[Tensor]) -> Optional[Tensor]:
        mask = super()._additive_mask(ctx, attn_mask)
        # q_t · a^K_r for the 2K+1 distances, then gathered per key: one (B,H,T,S) tensor
        q_rel = torch.matmul(ctx.q, self.relative_keys.to(ctx.q.dtype).t()) * self.scaling  # (B,H,T,2K+1)
        index = self.relative_index(ctx).expand(q_rel.shape[:2] + (-1, -1))
        key_term = torch.gather(q_rel, -1, index)
        return key_term if mask is None else mask + key_term

    def attend_values(self, probs: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        out = torch.matmul(probs, v)
        # sum_s p[t,s] a^V_{r(t,s)}: add the probabilities of each clipped distance together
        # ((B,H,T,2K+1), no (T,S,d_h) table), then one small matmul with a^V
        index = self.relative_index(ctx).expand(probs.shape)
        per_distance = probs.new_zeros(probs.shape[:-1] + (self.relative_values.size(0),))
        per_distance.scatter_add_(-1, index, probs)
        return out + torch.matmul(per_distance, self.relative_values.to(probs.dtype))

    def extra_repr(self) -> str:
        return f"max_relative_position={self.max_relative_position}"
