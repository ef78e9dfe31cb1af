"""Differentiable windows for dynamic local attention (docs/diffwin.md#pointers-soft-masks-aw-and-mw).

Each query ``t`` predicts two pointer distributions over the keys, for the left and the right
boundary of its window::

    phi_L = softmax(q W_QL (K W_KL)^T / sqrt(d) / temperature)        (B, T, S)
    phi_R = softmax(q W_QR (K W_KR)^T / sqrt(d) / temperature)

``q`` and ``K`` are the attention's *inputs* (sublayer input at the queries, key input), ``d``
the query-side model width. Pad keys, and future keys in decoder self-attention, are excluded
from these softmaxes. Pointers (and the additive window's local logits) are shared by all heads:
the paper writes them with full-width projections and ``sqrt(d)``
(docs/diffwin.md#choices-where-the-paper-leaves-room).

The soft window mask ``m`` (B, T, S), the expectation of the discrete window indicator over the
two pointers with token or segment masks, is :mod:`man_fairseq.modules.window_mask`'s.

Two ways to use ``m`` (both in :class:`BiasedMultiheadAttention`):

* :class:`AdditiveWindow` (AW), a bias module: local logits ``Q W_Ql (K W_Kl)^T`` masked by ``m``
  and scaled by ``1/sqrt(d)`` are added to fairseq's usual per-head global logits (which are
  scaled by ``1/sqrt(d_h)``); the same ``(B, 1, T, S)`` bias for every head, so the fused
  ``scaled_dot_product_attention`` path stays usable.
* :class:`MultiplicativeWindow` (MW), a post-softmax transform: ``softmax(e) * m``, optionally
  renormalised over the keys.

In incremental decoding the core caches projected keys but not the key *inputs*, so each window
caches its own key projections ``K W_KL | K W_KR (| K W_Kl)`` in its incremental state. Under
beam search (fairseq's generator calls ``set_beam_size``) cross-attention keeps one copy per
source sentence, not per hypothesis: every beam of a sentence reads the same static keys, so beam
reordering leaves that cache alone, and a finished sentence only drops its row.
"""

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor, nn

from .biased_attention import AttentionContext
from .window_mask import segment_bounds, soft_window_mask

WINDOW_MODES = ("none", "aw", "mw")
MASK_TYPES = ("token", "segment")


@with_incremental_state
class WindowPointers(nn.Module):
    """Boundary pointers (and, for AW, local logits) of one attention; base of AW and MW.

    Args:
        embed_dim: query-side width ``d`` (also the projection width).
        kdim: key input width (encoder width for cross-attention).
        num_products: 2 for the pointers only, 3 when local logits are needed too (AW).
        segment_size: 1 for token masks, ``b > 1`` for segment masks.
        temperature: divides the pointer logits (not the local logits).
        causal: decoder self-attention; future keys are excluded from the pointers. Segment
            masks are refused here because a segment extends into the future.
    """

    def __init__(
        self,
        embed_dim: int,
        kdim: Optional[int] = None,
        num_products: int = 2,
        segment_size: int = 1,
        temperature: float = 1.0,
        causal: bool = False,
        union: bool = False,
    ):
        super().__init__()
        if segment_size < 1:
            raise ValueError(f"diffwin segment size must be >= 1, got {segment_size}")
        if not temperature > 0:
            raise ValueError(f"diffwin temperature must be > 0, got {temperature}")
        if causal and segment_size > 1:
            raise ValueError(
                "decoder self-attention supports token masks only: a segment mask would let a "
                "query look at later tokens of its segment"
            )
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.num_products = num_products
        self.segment_size = segment_size
        self.temperature = float(temperature)
        self.causal = causal
        self.union = union
        # rows: W_QL | W_QR (| W_Ql), no bias as in the formulas
        self.query_proj = nn.Linear(embed_dim, num_products * embed_dim, bias=False)
        self.key_proj = nn.Linear(self.kdim, num_products * embed_dim, bias=False)
        nn.init.xavier_uniform_(self.query_proj.weight)
        nn.init.xavier_uniform_(self.key_proj.weight)
        # hypotheses per sentence in beam search (set_beam_size): cross-attention caches per sentence
        self.beam_size = 1
        # set by the analysis command (man-diffwin-windows) to keep phi_L, phi_R, m of the last call
        self.record = False
        self.last_window: Optional[Dict[str, Optional[Tensor]]] = None

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, kdim={self.kdim}, segment_size={self.segment_size}, "
            f"temperature={self.temperature}, causal={self.causal}, union={self.union}"
        )

    # ---- incremental state: projected key inputs, one contiguous (B, P, S, d) block ----
    # That layout makes every decoding step's product a plain batched matmul: the (B, S, P*d)
    # layout it replaces had to be permuted and copied whole at every step (7x the product's
    # own time at 400 keys), once fairseq's beam reordering had made the cache contiguous.
    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "diffwin_state")
        return result if result is not None else {}

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "diffwin_state", buffer)

    def set_beam_size(self, beam_size: int):
        """fairseq's generator reaches this through the model's ``set_beam_size``."""
        self.beam_size = beam_size

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        if incremental_state is None:
            return incremental_state
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            for name, value in list(buffer.items()):
                if value is None:
                    continue
                if name == "sentence_key_proj":
                    kept = self._reorder_sentences(value, new_order)
                    if kept is None:
                        # not a beam search's reorder: one copy per hypothesis from here on
                        del buffer[name]
                        buffer["prev_key_proj"] = value.repeat_interleave(self.beam_size, 0).index_select(0, new_order)
                    else:
                        buffer[name] = kept
                elif self.causal or value.size(0) != new_order.size(0):
                    # cross-attention state is static: only a finished sentence changes it
                    buffer[name] = value.index_select(0, new_order)
            incremental_state = self._set_input_buffer(incremental_state, buffer)
        return incremental_state

    def _reorder_sentences(self, keys: Tensor, new_order: Tensor) -> Optional[Tensor]:
        """The per-sentence cache after a beam search's reorder, or None when ``new_order`` does
        not keep each sentence's hypotheses together (rows ``i*beam .. i*beam+beam-1``)."""
        beam = self.beam_size
        if new_order.size(0) == keys.size(0) * beam:
            # no sentence finished: beams moved within their sentences, whose keys they share
            # (fairseq's MultiheadAttention skips its cross-attention caches here too)
            return keys
        if new_order.size(0) % beam:
            return None
        sentence = torch.div(new_order.view(-1, beam), beam, rounding_mode="floor")
        if not torch.equal(sentence, sentence[:, :1].expand_as(sentence)):
            return None
        return keys.index_select(0, sentence[:, 0])

    def _project_keys(self, key: Tensor) -> Tensor:
        """(S, B, kdim) key inputs -> (B, P, S, d), a view (the (B, P) merge costs no copy)."""
        src_len, bsz, _ = key.shape
        return self.key_proj(key).view(src_len, bsz, self.num_products, self.embed_dim).permute(1, 2, 0, 3)

    def _key_projections(self, ctx: AttentionContext) -> Tensor:
        """``K W_K*`` for every key, (B, P, S, d), through the cache when decoding; (B/beam, P, S, d)
        for cross-attention under beam search (one row per sentence)."""
        if ctx.incremental_state is None:
            assert ctx.key is not None, "key input is required outside incremental decoding"
            return self._project_keys(ctx.key)
        buffer = self._get_input_buffer(ctx.incremental_state)
        if ctx.key is None:
            # cross-attention after the first step: encoder keys are static
            keys = buffer.get("prev_key_proj")
            if keys is None:
                keys = buffer.get("sentence_key_proj")
            assert keys is not None, "no cached key projections for static keys"
            return keys
        if ctx.self_attention:
            new = self._project_keys(ctx.key)
            prev = buffer.get("prev_key_proj")
            keys = new.contiguous() if prev is None else torch.cat([prev, new], dim=2)
            buffer["prev_key_proj"] = keys
        else:
            group = self._sentence_group(ctx)
            src_len, bsz, kdim = ctx.key.shape
            key = ctx.key.view(src_len, bsz // group, group, kdim)[:, :, 0]
            keys = self._project_keys(key).contiguous()
            buffer.pop("prev_key_proj" if group > 1 else "sentence_key_proj", None)
            buffer["sentence_key_proj" if group > 1 else "prev_key_proj"] = keys
        self._set_input_buffer(ctx.incremental_state, buffer)
        return keys

    def _sentence_group(self, ctx: AttentionContext) -> int:
        """``beam_size`` when the static key inputs come in identical groups of that many rows
        (fairseq's generator repeats each source ``beam`` times), else 1."""
        beam = self.beam_size
        src_len, bsz, kdim = ctx.key.shape
        if beam <= 1 or bsz % beam:
            return 1
        # a beam size left from an earlier generator must not merge different sentences
        rows = ctx.key.view(src_len, bsz // beam, beam, kdim)
        if not torch.equal(rows, rows[:, :, :1].expand_as(rows)):
            return 1
        if ctx.key_padding_mask is not None:
            pads = ctx.key_padding_mask.view(bsz // beam, beam, -1)
            if not torch.equal(pads, pads[:, :1].expand_as(pads)):
                return 1
        return beam

    def products(self, ctx: AttentionContext) -> Tensor:
        """Scaled query-key products (B, P, T, S): pointer logits (masked) and local logits."""
        tgt_len, bsz, _ = ctx.query.shape
        d = self.embed_dim
        queries = self.query_proj(ctx.query).view(tgt_len, bsz, self.num_products, d).permute(1, 2, 0, 3)
        keys = self._key_projections(ctx)
        src_len = keys.size(2)
        if src_len != ctx.num_keys:
            raise RuntimeError(f"diffwin key cache has {src_len} keys, attention has {ctx.num_keys}")
        scale = 1.0 / math.sqrt(d)
        if keys.size(0) == bsz:
            return torch.matmul(queries, keys.transpose(-1, -2)) * scale
        # one key row per sentence: a sentence's beams become extra query rows of one product
        sentences = keys.size(0)
        beam = bsz // sentences
        queries = queries.view(sentences, beam, self.num_products, tgt_len, d).transpose(1, 2)
        prods = torch.matmul(queries.reshape(sentences, self.num_products, beam * tgt_len, d), keys.transpose(-1, -2))
        prods = prods.view(sentences, self.num_products, beam, tgt_len, src_len).transpose(1, 2)
        return prods.reshape(bsz, self.num_products, tgt_len, src_len) * scale

    def pointers_and_mask(self, ctx: AttentionContext, pointer_logits: Tensor) -> Tensor:
        """Soft window mask (B, T, S) from pointer logits (B, 2, T, S)."""
        logits = pointer_logits if self.temperature == 1.0 else pointer_logits / self.temperature
        excluded = None
        if ctx.key_padding_mask is not None:
            excluded = ctx.key_padding_mask[:, None, None, :]
        if self.causal and ctx.query.size(0) > 1:
            # queries are the last T keys: only a multi-query call has future keys
            future = ctx.key_positions()[None, :] > ctx.query_positions()[:, None]
            future = future[None, None]
            excluded = future if excluded is None else excluded | future
        if excluded is not None:
            # finite fill: a query with no allowed key (left-padded causal rows) stays finite
            logits = logits.masked_fill(excluded, torch.finfo(logits.dtype).min)
        low_precision = logits.dtype in (torch.float16, torch.bfloat16)
        phi = F.softmax(logits, dim=-1, dtype=torch.float32 if low_precision else None).to(logits.dtype)
        mask = soft_window_mask(
            phi[:, 0], phi[:, 1], self.segment_size, ctx.key_padding_mask, self._segment_bounds(ctx),
            union=self.union,
        )
        if self.record:
            self.last_window = {
                "phi_left": phi[:, 0].detach(), "phi_right": phi[:, 1].detach(), "mask": mask.detach(),
                "key_padding_mask": None if ctx.key_padding_mask is None else ctx.key_padding_mask.detach(),
            }
        return mask

    def _segment_bounds(self, ctx: AttentionContext) -> Optional[Tuple[Tensor, Tensor]]:
        """Segment bounds; cached with the static keys of cross-attention while decoding."""
        if self.segment_size == 1:
            return None
        cacheable = ctx.incremental_state is not None and not ctx.self_attention
        if cacheable:
            buffer = self._get_input_buffer(ctx.incremental_state)
            if ctx.key is None and buffer.get("segment_start") is not None:
                return buffer["segment_start"], buffer["segment_end"]
        start, end = segment_bounds(ctx.num_keys, self.segment_size, ctx.key_padding_mask, ctx.q.device)
        if cacheable:
            bsz = ctx.query.size(1)
            buffer["segment_start"] = start.expand(bsz, -1).contiguous()
            buffer["segment_end"] = end.expand(bsz, -1).contiguous()
            self._set_input_buffer(ctx.incremental_state, buffer)
        return start, end


class AdditiveWindow(WindowPointers):
    """AW bias module: ``(Q W_Ql (K W_Kl)^T * m) / sqrt(d)`` as a (B, 1, T, S) logit bias."""

    def __init__(self, embed_dim, kdim=None, segment_size=1, temperature=1.0, causal=False, union=False):
        super().__init__(embed_dim, kdim, 3, segment_size, temperature, causal, union)

    def forward(self, ctx: AttentionContext) -> Tensor:
        prods = self.products(ctx)
        mask = self.pointers_and_mask(ctx, prods[:, :2])
        return (prods[:, 2] * mask).unsqueeze(1)


class MultiplicativeWindow(WindowPointers):
    """MW post-softmax transform: ``softmax(e) * m``, renormalised over keys if asked."""

    def __init__(self, embed_dim, kdim=None, segment_size=1, temperature=1.0, causal=False,
                 renormalize: bool = False, union: bool = False):
        super().__init__(embed_dim, kdim, 2, segment_size, temperature, causal, union)
        self.renormalize = renormalize

    def extra_repr(self) -> str:
        return super().extra_repr() + f", renormalize={self.renormalize}"

    def forward(self, probs: Tensor, ctx: AttentionContext) -> Tensor:
        mask = self.pointers_and_mask(ctx, self.products(ctx))
        out = probs * mask.unsqueeze(1).to(probs.dtype)
        if self.renormalize:
            out = out / out.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(out.dtype).tiny)
        return out


def build_window(
    mode: str,
    embed_dim: int,
    kdim: Optional[int] = None,
    mask_type: str = "token",
    segment_size: int = 5,
    temperature: float = 1.0,
    causal: bool = False,
    renormalize: bool = False,
    union: bool = False,
) -> Tuple[Optional[nn.Module], Optional[nn.Module]]:
    """``(bias_module, post_softmax)`` for :class:`BiasedMultiheadAttention`."""
    if mode not in WINDOW_MODES:
        raise ValueError(f"unknown diffwin mode {mode!r}; choose one of {WINDOW_MODES}")
    if mask_type not in MASK_TYPES:
        raise ValueError(f"unknown diffwin mask {mask_type!r}; choose one of {MASK_TYPES}")
    if mode == "none":
        return None, None
    seg = segment_size if mask_type == "segment" else 1
    if mask_type == "segment" and segment_size < 1:
        raise ValueError(f"diffwin segment size must be >= 1, got {segment_size}")
    if mode == "aw":
        return AdditiveWindow(embed_dim, kdim, seg, temperature, causal, union), None
    return None, MultiplicativeWindow(embed_dim, kdim, seg, temperature, causal, renormalize, union)
