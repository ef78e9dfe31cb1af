"""Mask Attention Network layers: a configurable sequence of mask-attention sublayers.

A sublayer is one of (docs/man.md#sublayers):

* ``dman``  dynamic mask attention (:class:`DynamicMaskBias`),
* ``san``   ordinary self-attention (all-ones mask),
* ``sman1`` / ``sman2`` static window masks (paper Table 4),
* ``ffn``   position-wise feed-forward (the identity mask),
* ``cross`` encoder-decoder attention (decoder only).

Each sublayer has its own residual connection, dropout and LayerNorm (post-norm by default,
``normalize_before`` for pre-norm). The paper's layer is ``dman,san,ffn``; its Table 3 orders
are other sequences of the same names.
"""

from typing import Callable, Dict, List, Optional, Sequence

import torch
from fairseq import utils
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor, nn

from .biased_attention import BiasedMultiheadAttention
from .mask_bias import DynamicMaskBias, StaticWindowBias

SELF_ATTENTION_SUBLAYERS = ("dman", "san", "sman1", "sman2")
ENCODER_SUBLAYERS = SELF_ATTENTION_SUBLAYERS + ("ffn",)
DECODER_SUBLAYERS = ENCODER_SUBLAYERS + ("cross",)


def parse_sublayers(spec: str, decoder: bool) -> List[str]:
    """``"dman,san,ffn"`` -> names, with a clear error for anything unknown."""
    where = "--decoder-sublayers" if decoder else "--encoder-sublayers"
    if not isinstance(spec, str):
        # e.g. a config object that lacks the option (it would read as None)
        raise ValueError(f"{where} must be a comma-separated string, got {spec!r}")
    names = [s.strip().lower() for s in spec.split(",") if s.strip()]
    allowed = DECODER_SUBLAYERS if decoder else ENCODER_SUBLAYERS
    if not names:
        raise ValueError(f"{where} is empty")
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown sublayer(s) {unknown}; allowed: {', '.join(allowed)}")
    if decoder and names.count("cross") != 1:
        raise ValueError(f"{where} must contain 'cross' (encoder-decoder attention) exactly once: {spec!r}")
    return names


# (sublayer name, the core's keyword arguments; a self-attention's carry its MAN mask as
# ``bias_module``) -> the attention module of that sublayer
AttentionFactory = Callable[[str, dict], nn.Module]


def plain_attention(name: str, kwargs: dict) -> nn.Module:
    """The attention of a MAN sublayer: the core with the sublayer's own mask (if any)."""
    return BiasedMultiheadAttention(**kwargs)


class FeedForward(nn.Module):
    """fairseq's position-wise FFN: fc2(dropout(act(fc1(x))))."""

    def __init__(self, embed_dim, ffn_dim, activation_fn, activation_dropout, q_noise=0.0, qn_block_size=8):
        super().__init__()
        self.fc1 = quant_noise(nn.Linear(embed_dim, ffn_dim), q_noise, qn_block_size)
        self.fc2 = quant_noise(nn.Linear(ffn_dim, embed_dim), q_noise, qn_block_size)
        self.activation_fn = utils.get_activation_fn(activation=activation_fn)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)

    def forward(self, x):
        return self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))


class MANLayer(nn.Module):
    """One encoder or decoder layer of a Mask Attention Network.

    Args:
        cfg: fairseq ``TransformerConfig`` (with the MAN options as extra attributes).
        decoder: build a decoder layer (causal self-attention sublayers and ``cross``).
        sublayers: the sublayer names in order (:func:`parse_sublayers` of the option).
        attention_backend: ``--attention-backend`` of every attention sublayer.
        build_attention: builds each attention sublayer from its name and the core's arguments
            (default :func:`plain_attention`); the models' one wiring
            (``models/biased_transformer.py``) adds the plan's mechanisms there.
    """

    def __init__(self, cfg, decoder: bool, sublayers: Sequence[str], attention_backend: str = "auto",
                 build_attention: Optional[AttentionFactory] = None):
        super().__init__()
        side = cfg.decoder if decoder else cfg.encoder
        self.decoder = decoder
        self.embed_dim = side.embed_dim
        self.normalize_before = side.normalize_before
        self.sublayers = list(sublayers)
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)
        activation_dropout = cfg.activation_dropout or (cfg.relu_dropout or 0.0)
        q_noise, qn_block = cfg.quant_noise.pq, cfg.quant_noise.pq_block_size

        build = build_attention or plain_attention
        self.blocks = nn.ModuleList()
        # not "layer_norms": fairseq's decoder renames that legacy key on checkpoint load
        self.sublayer_norms = nn.ModuleList()
        for name in self.sublayers:
            if name == "ffn":
                block = FeedForward(self.embed_dim, side.ffn_embed_dim, cfg.activation_fn,
                                    float(activation_dropout), q_noise, qn_block)
            elif name == "cross":
                block = build(name, dict(
                    embed_dim=self.embed_dim, num_heads=side.attention_heads, kdim=cfg.encoder.embed_dim,
                    vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
                    encoder_decoder_attention=True, head_activation=cfg.attention_head_activation,
                    attention_backend=attention_backend, q_noise=q_noise, qn_block_size=qn_block,
                ))
            else:
                block = build(name, dict(
                    embed_dim=self.embed_dim, num_heads=side.attention_heads, dropout=cfg.attention_dropout,
                    self_attention=True, bias_module=self.build_mask(name, cfg, side.attention_heads),
                    head_activation=cfg.attention_head_activation, attention_backend=attention_backend,
                    q_noise=q_noise, qn_block_size=qn_block,
                ))
                block.causal_attn_mask = decoder  # the decoder passes fairseq's future mask only
            self.blocks.append(block)
            self.sublayer_norms.append(LayerNorm(self.embed_dim, export=cfg.export))
        self.need_attn = True

    def upgrade_state_dict_named(self, state_dict, name):
        """Called by fairseq's encoder/decoder on load; MAN checkpoints need no renaming."""

    def build_mask(self, name: str, cfg, num_heads: int) -> Optional[nn.Module]:
        if name == "dman":
            return DynamicMaskBias(self.embed_dim, num_heads, cfg.dman_max_relative_distance, init=cfg.dman_init)
        if name == "sman1":
            return StaticWindowBias("sqrt_half_length", causal=self.decoder)
        if name == "sman2":
            return StaticWindowBias(cfg.static_mask_window, causal=self.decoder)
        return None

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        attn = None
        for name, block, norm in zip(self.sublayers, self.blocks, self.sublayer_norms):
            residual = x
            if self.normalize_before:
                x = norm(x)
            if name == "ffn":
                x = block(x)
            elif name == "cross":
                x, attn = block(
                    query=x, key=encoder_out, value=encoder_out,
                    key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                    static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                    need_head_weights=need_head_weights,
                )
            else:
                x, _ = block(
                    query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                    incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask,
                )
            x = residual + self.dropout_module(x)
            if not self.normalize_before:
                x = norm(x)
        return x, attn


class MANEncoderLayer(MANLayer):
    def __init__(self, cfg, sublayers: Sequence[str], attention_backend: str = "auto", return_fc: bool = False,
                 build_attention: Optional[AttentionFactory] = None):
        if return_fc:
            raise ValueError("return_fc is not supported by MAN encoder layers")
        super().__init__(cfg, False, sublayers, attention_backend, build_attention)

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=x.dtype).masked_fill(attn_mask, float("-inf"))
        x, _ = super().forward(x, self_attn_mask=attn_mask, self_attn_padding_mask=encoder_padding_mask)
        return x


class MANDecoderLayer(MANLayer):
    def __init__(self, cfg, sublayers: Sequence[str], attention_backend: str = "auto", no_encoder_attn: bool = False,
                 build_attention: Optional[AttentionFactory] = None):
        if no_encoder_attn:
            raise ValueError("MAN decoder layers need encoder-decoder attention")
        super().__init__(cfg, True, sublayers, attention_backend, build_attention)

    def forward(
        self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
        prev_self_attn_state=None, prev_attn_state=None, self_attn_mask=None,
        self_attn_padding_mask=None, need_attn=False, need_head_weights=False,
    ):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("prev_*_attn_state (ONNX export path) is not supported")
        if need_head_weights:
            need_attn = True
        x, attn = super().forward(
            x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
            self_attn_padding_mask, need_attn, need_head_weights,
        )
        return x, attn, None

    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        self.need_attn = need_attn
