"""The one attention core shared by every model family of man-fairseq.

Every method in this project is "mask attention" (docs/model-families.md#every-method-is-mask-attention):
it changes which keys a query may look at and how much. A multiplicative mask applied before the softmax is an additive logit
bias ``log M``, so the core takes

* an optional **bias module** returning an additive logit bias broadcastable to
  ``(batch, heads, tgt_len, src_len)`` (DMAN, static windows, localness, additive windows), and
* an optional **post-softmax transform** of the attention probabilities (multiplicative windows,
  attention calibration).

Unless something reads the probabilities (a post-softmax transform, returned weights, or a subclass
with ``needs_probabilities`` such as relative positions) or ``--attention-backend explicit`` asks
for the written-out softmax, the core runs a fused kernel (chosen by ``attention_backend.py``):
PyTorch's ``scaled_dot_product_attention`` with the bias as a float mask; for a bias module with
``extended_query_key`` (localness) on q and k extended by the bias's columns; for a learnable bias
in CPU training the fused CPU kernel with the bias's gradient rebuilt by blocks of sentences
(``fused_bias_grad.py``); for a hard window on the CPU only the keys of its band (``banded_attention.py``);
or ``flex_attention`` with the bias as a score modification.

It subclasses fairseq's :class:`MultiheadAttention` so that parameter names, initialisation,
incremental-state buffers and beam reordering are fairseq's own, and the layer classes of
fairseq can use it as a drop-in replacement.
"""

import logging
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor, nn

from . import attention_backend as backends
from . import banded_attention as banded
from . import flex_backend as flex
from . import fused_bias_grad as fused

logger = logging.getLogger(__name__)
_REPORTED_FLEX_FALLBACKS = set()


def report_flex_fallback(choice: "backends.KernelChoice") -> None:
    """Say once per process and cause that an attention asked for ``flex`` runs another path."""
    cause = choice.reason.split("; ")[0].removeprefix("flex: ")
    if cause not in _REPORTED_FLEX_FALLBACKS:
        _REPORTED_FLEX_FALLBACKS.add(cause)
        logger.warning(f"--attention-backend flex: {cause}: these attention calls run {choice.path} instead")


@dataclass
class AttentionContext:
    """What a bias module or post-softmax transform may read.

    Shapes: ``T`` queries of this call, ``S`` keys *including* the incremental cache,
    ``B`` batch, ``H`` heads, ``C`` model width, ``D`` head width.
    """

    query: Tensor  # (T, B, C) sublayer input at the query positions
    key: Optional[Tensor]  # (S_new, B, C) key input of this call; None when keys are cached
    q: Tensor  # (B, H, T, D) projected queries, *unscaled*
    k: Tensor  # (B, H, S, D) projected keys, cache included
    key_padding_mask: Optional[Tensor]  # (B, S) bool, True at pad keys, cache included
    query_start: int  # key index of the first query (self-attention: S - T; 0 otherwise)
    incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]]
    self_attention: bool

    @property
    def num_keys(self) -> int:
        return self.k.size(2)

    def query_positions(self) -> Tensor:
        """Key-sequence index of every query, (T,). Only meaningful for self-attention."""
        return torch.arange(self.query_start, self.query_start + self.q.size(2), device=self.q.device)

    def key_positions(self) -> Tensor:
        return torch.arange(self.num_keys, device=self.k.device)


ACTIVATIONS: Dict[str, Optional[Callable[[Tensor], Tensor]]] = {
    "none": None,
    "relu": F.relu,
    "gelu": F.gelu,
}


class BiasedMultiheadAttention(MultiheadAttention):
    """fairseq multi-head attention plus an additive logit bias and a post-softmax transform.

    Args (beyond fairseq's ``MultiheadAttention``):
        bias_module: ``module(ctx: AttentionContext) -> Tensor`` broadcastable to
            ``(B, H, T, S)``, added to the scaled logits (``-inf`` allowed). A bias module or
            transform with a decoding cache of its own implements
            ``reorder_incremental_state``: fairseq's decoder calls it on every submodule, so
            the core must not forward the call (that would reorder the cache twice).
        post_softmax: ``module(probs, ctx) -> probs`` applied to the ``(B, H, T, S)``
            attention probabilities before dropout.
        head_activation: ``none|relu|gelu`` applied to the concatenated head outputs before the
            output projection (the MAN reference code did this; the paper does not say so).
        attention_backend: ``auto|sdpa|flex|explicit`` (``--attention-backend``, see
            :mod:`.attention_backend`); the attribute of that name may be changed later (tests
            compare the backends on one model).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        kdim=None,
        vdim=None,
        dropout: float = 0.0,
        bias: bool = True,
        self_attention: bool = False,
        encoder_decoder_attention: bool = False,
        bias_module: Optional[nn.Module] = None,
        post_softmax: Optional[nn.Module] = None,
        head_activation: str = "none",
        attention_backend: str = "auto",
        q_noise: float = 0.0,
        qn_block_size: int = 8,
    ):
        if attention_backend not in backends.ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention backend {attention_backend!r}; "
                             f"choose one of {backends.ATTENTION_BACKENDS}")
        super().__init__(
            embed_dim,
            num_heads,
            kdim=kdim,
            vdim=vdim,
            dropout=dropout,
            bias=bias,
            self_attention=self_attention,
            encoder_decoder_attention=encoder_decoder_attention,
            q_noise=q_noise,
            qn_block_size=qn_block_size,
        )
        if head_activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown attention head activation {head_activation!r}; "
                f"choose one of {sorted(ACTIVATIONS)}"
            )
        self.bias_module = bias_module
        self.post_softmax = post_softmax
        self.head_activation = ACTIVATIONS[head_activation]
        self.attention_backend = attention_backend
        self.last_kernel: Optional[backends.KernelChoice] = None  # the choice of the last call
        # Decoder self-attention (set by the decoder layers): an ``attn_mask`` it receives is
        # fairseq's future mask, which flex applies as a causal block mask. Other attentions
        # apply their ``attn_mask`` as an additive table. Checked once per shape outside
        # torch.compile (:meth:`_check_future_mask`), never per call.
        self.causal_attn_mask = False
        self._future_masks_checked = set()

    def set_beam_size(self, beam_size):
        """Ignored: this core caches keys per hypothesis, so fairseq's beamable shortcut (one cached
        row per sentence once a beam size is set) must stay off."""

    # Subclasses that read the probabilities in attend_values (relative value embeddings) set
    # this: it forces the explicit path instead of the fused kernel.
    needs_probabilities = False

    def attend_values(self, probs: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """(B,H,T,S) probabilities (after dropout) times values -> (B,H,T,D); a subclass hook."""
        return torch.matmul(probs, v)

    def _shape(self, x: Tensor, bsz: int) -> Tensor:
        # (L, B, C) -> (B, H, L, D)
        return x.contiguous().view(-1, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ):
        if before_softmax:
            raise NotImplementedError("before_softmax is not supported by BiasedMultiheadAttention")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()

        saved_state = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if saved_state is not None and "prev_key" in saved_state and static_kv:
                # encoder-decoder attention: keys were computed at the first step
                assert self.encoder_decoder_attention and not self.self_attention
                key = value = None
        q, k, v, key_input = self._project(query, key, value, bsz)
        if saved_state is not None:
            k, v, key_padding_mask = self._extend_cache(saved_state, k, v, key_padding_mask, bsz, static_kv)
            incremental_state = self._set_input_buffer(incremental_state, saved_state)

        src_len = k.size(2)
        if key_padding_mask is not None:
            if key_padding_mask.dim() == 0 or key_padding_mask.size(-1) != src_len:
                raise ValueError("key_padding_mask does not match the number of keys")
            # kept even when it masks nothing: testing that (``.any()``) would be a device-to-host
            # sync per layer and a graph break under torch.compile
            key_padding_mask = key_padding_mask.to(torch.bool)

        ctx = AttentionContext(
            query=query,
            key=key_input,
            q=q,
            k=k,
            key_padding_mask=key_padding_mask,
            query_start=src_len - tgt_len if self.self_attention else 0,
            incremental_state=incremental_state,
            self_attention=self.self_attention,
        )
        out, weights = self._attend(ctx, attn_mask, v, need_weights)

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        if self.head_activation is not None:
            out = self.head_activation(out)
        out = self.out_proj(out)

        if need_weights and weights is not None:
            weights = weights.transpose(0, 1)  # (H, B, T, S)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        else:
            weights = None
        return out, weights

    def _project(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor], bsz: int):
        """(q, k, v, key input) of this call, each (B, H, L, D); k = v = None when the keys are
        cached (encoder-decoder attention after the first step)."""
        q = self._shape(self.q_proj(query), bsz)
        if self.self_attention:
            return q, self._shape(self.k_proj(query), bsz), self._shape(self.v_proj(query), bsz), query
        if key is not None:
            return q, self._shape(self.k_proj(key), bsz), self._shape(self.v_proj(value), bsz), key
        return q, None, None, None

    def _extend_cache(self, saved_state, k, v, key_padding_mask, bsz: int, static_kv: bool):
        """Keys, values and key padding with the incremental cache before them; the cache updated."""
        if "prev_key" in saved_state:
            prev_key = saved_state["prev_key"]
            prev_value = saved_state["prev_value"]
            if static_kv:
                k, v = prev_key, prev_value
            else:
                k = torch.cat([prev_key, k], dim=2)
                v = torch.cat([prev_value, v], dim=2)
        prev_key_padding_mask = saved_state.get("prev_key_padding_mask", None)
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=prev_key_padding_mask,
            batch_size=bsz,
            src_len=k.size(2),
            static_kv=static_kv,
        )
        saved_state["prev_key"] = k
        saved_state["prev_value"] = v
        saved_state["prev_key_padding_mask"] = key_padding_mask
        return k, v, key_padding_mask

    def _attend(self, ctx: AttentionContext, attn_mask: Optional[Tensor], v: Tensor, need_weights: bool):
        """(B,H,T,D) attention output and the (B,H,T,S) probabilities (None on a fused path)."""
        q, k = ctx.q, ctx.k
        dropout_p = self.dropout_module.p if self.training else 0.0
        bound = banded.band_bound(self.bias_module, ctx, attn_mask)
        choice = backends.choose_kernel(
            self.attention_backend, q.device.type, q.dtype,
            has_mask=self.bias_module is not None or attn_mask is not None or ctx.key_padding_mask is not None,
            needs_probabilities=self.post_softmax is not None or need_weights or self.needs_probabilities,
            flex_supported=self.bias_module is None or hasattr(self.bias_module, "flex_mods"),
            dropout=dropout_p > 0, head_dim=min(q.size(-1), v.size(-1)),
            requires_grad=torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad),
            extendable=hasattr(self.bias_module, "extended_query_key"),
            bias_grad=fused.bias_learns(self.bias_module, ctx),
            hard_band=bound is not None, band_cheaper=banded.band_is_cheaper(q.size(2), k.size(2), bound),
        )
        if choice.path == backends.EXTENDED:
            extended = self.bias_module.extended_query_key(ctx, self.scaling)
            if extended is not None:
                self.last_kernel = choice
                return self._extended_attention(ctx, attn_mask, extended, v, choice, dropout_p), None
            choice = backends.KernelChoice(backends.SDPA, choice.sdpa_backends,
                                           choice.reason + "; declined by the bias module (its error bound, or torch.compile)")
        self.last_kernel = choice
        if self.attention_backend == backends.FLEX and choice.path != backends.FLEX:
            report_flex_fallback(choice)
        if choice.path == backends.FLEX:
            return self._flex_attention(ctx, attn_mask, q, k, v), None
        if choice.path == backends.BANDED:
            return banded.attend(self.bias_module, ctx, choice, bound, v, attn_mask, self.scaling, dropout_p), None
        if choice.path == backends.FUSED_BIAS_GRAD:
            fixed = self._combine_masks(ctx, None, attn_mask, q.dtype)  # causal + padding, no gradient
            return fused.fused_bias_attention(q, k, v, fixed, self.scaling, self.bias_module, ctx), None
        if choice.path == backends.SDPA:
            mask = backends.prepare_sdpa_mask(self._additive_mask(ctx, attn_mask), q)
            with backends.sdpa_context(choice):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None
        mask = self._additive_mask(ctx, attn_mask)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        if mask is not None:
            scores = scores + mask
        # half precision softmax in float32, as fairseq does; float64 stays float64
        low_precision = scores.dtype in (torch.float16, torch.bfloat16)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32 if low_precision else None).to(q.dtype)
        if self.post_softmax is not None:
            probs = self.post_softmax(probs, ctx)
        out = self.attend_values(F.dropout(probs, p=dropout_p, training=self.training), v, ctx)
        return out, probs

    def _extended_attention(self, ctx: AttentionContext, attn_mask: Optional[Tensor], extended, v: Tensor,
                            choice: "backends.KernelChoice", dropout_p: float) -> Tensor:
        """SDPA on the bias module's extended (B,H,T,D+E) q and k (scale folded into q, the bias
        in the extra columns); the values padded with E zero columns (the fused CPU kernel wants
        one head size), the causal mask and padding as the only float mask."""
        q, k = extended
        extra = q.size(-1) - v.size(-1)
        v_padded = torch.cat([v.to(q.dtype), v.new_zeros(v.shape[:-1] + (extra,), dtype=q.dtype)], dim=-1)
        mask = backends.prepare_sdpa_mask(self._combine_masks(ctx, None, attn_mask, q.dtype), q)
        with backends.sdpa_context(choice):
            out = F.scaled_dot_product_attention(q, k, v_padded, attn_mask=mask, dropout_p=dropout_p, scale=1.0)
        return out[..., : v.size(-1)].to(v.dtype)

    def _additive_mask(self, ctx: AttentionContext, attn_mask: Optional[Tensor]) -> Optional[Tensor]:
        """Bias + causal mask + key padding as one float tensor broadcastable to (B,H,T,S)."""
        bias = None if self.bias_module is None else self.bias_module(ctx).to(ctx.q.dtype)
        return self._combine_masks(ctx, bias, attn_mask, ctx.q.dtype)

    def _combine_masks(self, ctx: AttentionContext, mask: Optional[Tensor], attn_mask: Optional[Tensor],
                       dtype: torch.dtype) -> Optional[Tensor]:
        """``mask`` (a bias or None) + causal mask + key padding, in ``dtype``."""
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=dtype).masked_fill(attn_mask, float("-inf"))
            am = attn_mask.to(dtype)
            mask = am if mask is None else mask + am
        if ctx.key_padding_mask is not None:
            pad = ctx.key_padding_mask[:, None, None, :]
            if mask is None:
                mask = torch.zeros(pad.shape, dtype=dtype, device=pad.device)
            mask = mask.masked_fill(pad, float("-inf"))
        if mask is not None and getattr(self.bias_module, "can_mask_all_keys", False):
            # A hard window around a pad query may cover only pad keys; such rows are unused
            # but must stay finite (0 * NaN in the value product would poison real tokens).
            dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
            mask = mask.masked_fill(dead, 0.0)
        return mask

    def _flex_attention(self, ctx: AttentionContext, attn_mask: Optional[Tensor], q: Tensor, k: Tensor,
                        v: Tensor) -> Tensor:
        """The attention through ``flex_attention``: bias, causal and padding masks as score/mask mods.

        Compiled (CUDA), lengths are bucketed (:func:`~.flex_backend.bucket_length`), with static
        kernels the batch too (:func:`~.flex_backend.bucket_batch`), and the padded keys masked. A
        query whose every key is masked (a hard window around a pad query) gets a zero output here
        where the dense paths attend uniformly; such rows are pad positions, which nothing
        downstream reads.
        """
        bsz, t, s = q.size(0), q.size(2), k.size(2)
        compiled = flex.FLEX_RUNNER.compiled_for(q.device.type)
        shape = flex.FLEX_RUNNER.shape_for(bsz, t, s, q.device.type)
        mods = flex.FlexMods()
        if self.bias_module is not None:
            mods.extend(self.bias_module.flex_mods(ctx, shape))
        if attn_mask is not None:
            if self.self_attention and self.causal_attn_mask:
                self._check_future_mask(attn_mask, ctx.query_start)
                mods.mask_mods.append(flex.causal_mod(flex.device_scalar(ctx.query_start, q.device)))
            else:
                if attn_mask.dtype == torch.bool:
                    attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(attn_mask, float("-inf"))
                table = attn_mask.to(flex.small_dtype(q))
                table = flex.pad_dims(table, {0: shape.q, 1: shape.kv})
                mods.score_mods.append(flex.additive_table_mod(table))
        if ctx.key_padding_mask is not None or (shape.batch, shape.kv) != (bsz, s):
            if ctx.key_padding_mask is not None:
                valid = ~ctx.key_padding_mask
            else:
                valid = torch.ones(bsz, s, dtype=torch.bool, device=q.device)
            valid = flex.pad_dims(valid, {0: shape.batch, 1: shape.kv}, False)
            mods.mask_mods.append(flex.key_valid_mod(valid))
        return flex.flex_attention_call(q, k, v, mods, self.scaling, compiled, shape)

    def _check_future_mask(self, attn_mask: Tensor, query_start: int) -> None:
        """A mask given to a causal self-attention must be the future mask the causal block mask replaces:
        verified once per (shape, query start, device) in eager mode (a host sync), not under torch.compile."""
        if torch.compiler.is_compiling():
            return
        key = (tuple(attn_mask.shape), query_start, attn_mask.device, attn_mask.dtype)
        if key in self._future_masks_checked:
            return
        if not flex.is_future_mask(attn_mask, query_start):
            raise ValueError("causal self-attention (causal_attn_mask=True) was given an attn_mask that is not "
                             "the causal future mask; set causal_attn_mask=False to apply it as an additive mask")
        self._future_masks_checked.add(key)
