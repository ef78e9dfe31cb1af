"""fairseq's Transformer with every attention built by the model class.

The localness, differentiable-window and calibration families keep fairseq's encoder/decoder
layers unchanged and only replace some attention modules by :class:`BiasedMultiheadAttention`
with a bias module or a post-softmax transform. A subclass of :class:`BiasedTransformerModel`
(a family, see :mod:`.family`) makes the plan of which attention gets what and overrides
:meth:`BiasedTransformerModel.attention_extras`, and nothing else about the layers.
"""

import functools
import itertools
from typing import Callable, Optional, Tuple

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import nn

from ..modules.biased_attention import BiasedMultiheadAttention
from ..plugin_options import PluginOptionError
from .family import CROSS, DECODER_SELF, ENCODER_SELF, AttentionPlan, PluginModel

# (kind, layer_idx, cfg) -> attention module
AttentionBuilder = Callable[[str, int, TransformerConfig], nn.Module]


def wrap_layer(layer: nn.Module, cfg) -> nn.Module:
    """Activation checkpointing and FSDP wrapping exactly as fairseq's encoder/decoder do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class BiasedEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, layer_idx: int, build_attention: AttentionBuilder, return_fc=False):
        # set before nn.Module.__init__ runs build_self_attention (plain attributes are fine)
        self.layer_idx = layer_idx
        self._build_attention = build_attention
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return self._build_attention(ENCODER_SELF, self.layer_idx, cfg)


class BiasedDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, layer_idx: int, build_attention: AttentionBuilder, no_encoder_attn=False):
        self.layer_idx = layer_idx
        self._build_attention = build_attention
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if cfg.cross_self_attention:
            raise PluginOptionError("--cross-self-attention is not supported by the plugin's models")
        if add_bias_kv or add_zero_attn:
            raise ValueError("add_bias_kv / add_zero_attn are not supported")
        attention = self._build_attention(DECODER_SELF, self.layer_idx, cfg)
        attention.causal_attn_mask = True  # the decoder passes it fairseq's future mask only
        return attention

    def build_encoder_attention(self, embed_dim, cfg):
        return self._build_attention(CROSS, self.layer_idx, cfg)


class BiasedTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, build_attention: AttentionBuilder):
        self._layer_ids = itertools.count()
        self._build_attention = build_attention
        super().__init__(cfg, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        layer = BiasedEncoderLayer(cfg, next(self._layer_ids), self._build_attention, self.return_fc)
        return wrap_layer(layer, cfg)


class BiasedTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, build_attention: AttentionBuilder, no_encoder_attn=False):
        self._layer_ids = itertools.count()
        self._build_attention = build_attention
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = BiasedDecoderLayer(cfg, next(self._layer_ids), self._build_attention, no_encoder_attn)
        return wrap_layer(layer, cfg)


class BiasedTransformerModel(PluginModel, TransformerModel):
    """fairseq's ``transformer`` whose attentions follow an :class:`~.family.AttentionPlan`.

    Not registered itself; a family subclass declares its options (``config``, ``sizes``), makes
    the plan (:meth:`make_plan`: ``(attention type, layer) -> spec``) and turns a spec into
    modules (:meth:`attention_extras`, or :meth:`attention_module` for another attention class).
    """

    @classmethod
    def attention_extras(cls, spec, kind: str, cfg) -> Tuple[Optional[nn.Module], Optional[nn.Module]]:
        """(bias_module, post_softmax) of one attention whose plan entry is ``spec``."""
        return None, None

    @classmethod
    def attention_module(cls, spec, kind: str, cfg, **kwargs) -> nn.Module:
        """The attention of a plan entry ``spec`` (None: a plain one), given the core's arguments."""
        return BiasedMultiheadAttention(**kwargs)

    @classmethod
    def build_attention(cls, plan: AttentionPlan, kind: str, layer_idx: int, cfg) -> nn.Module:
        spec = plan.spec(kind, layer_idx)
        # the mask modules first, then the attention: the order parameters are initialised in
        bias_module, post_softmax = cls.attention_extras(spec, kind, cfg) if spec is not None else (None, None)
        dim = cfg.decoder.embed_dim if kind != ENCODER_SELF else cfg.encoder.embed_dim
        heads = cfg.decoder.attention_heads if kind != ENCODER_SELF else cfg.encoder.attention_heads
        kv_dim = cfg.encoder.embed_dim if kind == CROSS else None
        return cls.attention_module(
            spec, kind, cfg,
            embed_dim=dim,
            num_heads=heads,
            kdim=kv_dim,
            vdim=kv_dim,
            dropout=cfg.attention_dropout,
            self_attention=kind != CROSS,
            encoder_decoder_attention=kind == CROSS,
            bias_module=bias_module,
            post_softmax=post_softmax,
            attention_backend=plan.attention_backend,
            q_noise=cfg.quant_noise.pq,
            qn_block_size=cfg.quant_noise.pq_block_size,
        )

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        build = functools.partial(cls.build_attention, cls.plan_in_build())
        return BiasedTransformerEncoder(cfg, src_dict, embed_tokens, build)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        build = functools.partial(cls.build_attention, cls.plan_in_build())
        return BiasedTransformerDecoder(cfg, tgt_dict, embed_tokens, build, no_encoder_attn=cfg.no_cross_attention)
