"""fairseq's Transformer with every attention built by the model class.

The localness, differentiable-window and calibration families keep fairseq's encoder/decoder
layers unchanged and only replace some attention modules by :class:`BiasedMultiheadAttention`
with a bias module or a post-softmax transform. A subclass of :class:`BiasedTransformerModel`
overrides :meth:`BiasedTransformerModel.attention_extras` and nothing else about the layers.
"""

import dataclasses
import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Optional, Tuple

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
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

from ..modules.attention_backend import ATTENTION_BACKENDS
from ..modules.biased_attention import BiasedMultiheadAttention
from ..plugin_options import PluginOptionError, add_option_args, parse_layer_spec

# the three places an attention sits in an encoder-decoder Transformer
ENCODER_SELF, DECODER_SELF, CROSS = "encoder_self", "decoder_self", "cross"
ATTENTION_TYPES = (ENCODER_SELF, DECODER_SELF, CROSS)

# (kind, layer_idx, cfg) -> attention module
AttentionBuilder = Callable[[str, int, TransformerConfig], nn.Module]


def wrap_layer(layer: nn.Module, cfg) -> nn.Module:
    """Activation checkpointing and FSDP wrapping exactly as fairseq's encoder/decoder do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


@dataclass
class AttentionBackendConfig(FairseqDataclass):
    """The option every family shares (``--attention-backend``)."""

    attention_backend: ChoiceEnum(ATTENTION_BACKENDS) = field(
        default="auto",
        metadata={"help": "attention kernel: auto (fused SDPA with a fixed kernel policy: memory-efficient "
                  "whenever a mask is present), sdpa (PyTorch's dispatcher, no cuDNN with a float mask), "
                  "flex (FlexAttention for DMAN / localness / static windows / causal / padding; auto for "
                  "other biases; relative positions, calibrated cross-attention and returned weights always "
                  "take the explicit path) or explicit (the written-out softmax); see "
                  "man_fairseq/modules/attention_backend.py. At generation: "
                  "--model-overrides \"{'attention_backend': 'flex'}\""},
    )


def add_attention_backend_args(parser) -> None:
    add_option_args(parser, AttentionBackendConfig())


def set_attention_backend(model: nn.Module, args) -> nn.Module:
    """Give every :class:`BiasedMultiheadAttention` of ``model`` the ``--attention-backend`` of ``args``."""
    backend = str(getattr(args, "attention_backend", None) or "auto")
    if backend not in ATTENTION_BACKENDS:
        raise PluginOptionError(
            f"--attention-backend: unknown {backend!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
    for module in model.modules():
        if isinstance(module, BiasedMultiheadAttention):
            module.attention_backend = backend
    return model


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


class BiasedTransformerModel(TransformerModel):
    """fairseq's ``transformer`` whose attentions come from :meth:`attention_extras`.

    Not registered itself; subclasses register a model name and architectures.
    """

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_attention_backend_args(parser)

    @classmethod
    def build_model(cls, args, task):
        return set_attention_backend(super().build_model(args, task), args)

    @classmethod
    def attention_extras(
        cls, cfg, kind: str, layer_idx: int
    ) -> Tuple[Optional[nn.Module], Optional[nn.Module]]:
        """(bias_module, post_softmax) for one attention; (None, None) keeps it plain."""
        return None, None

    @classmethod
    def build_attention(cls, kind: str, layer_idx: int, cfg) -> nn.Module:
        bias_module, post_softmax = cls.attention_extras(cfg, kind, layer_idx)
        dim = cfg.decoder.embed_dim if kind != ENCODER_SELF else cfg.encoder.embed_dim
        heads = cfg.decoder.attention_heads if kind != ENCODER_SELF else cfg.encoder.attention_heads
        kv_dim = cfg.encoder.embed_dim if kind == CROSS else None
        return BiasedMultiheadAttention(
            dim,
            heads,
            kdim=kv_dim,
            vdim=kv_dim,
            dropout=cfg.attention_dropout,
            self_attention=kind != CROSS,
            encoder_decoder_attention=kind == CROSS,
            bias_module=bias_module,
            post_softmax=post_softmax,
            q_noise=cfg.quant_noise.pq,
            qn_block_size=cfg.quant_noise.pq_block_size,
        )

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return BiasedTransformerEncoder(cfg, src_dict, embed_tokens, cls.build_attention)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return BiasedTransformerDecoder(
            cfg, tgt_dict, embed_tokens, cls.build_attention,
            no_encoder_attn=cfg.no_cross_attention,
        )


def parse_layer_set(spec: str, num_layers: int, option: str) -> Tuple[int, ...]:
    """``"0,1,2"`` / ``"all"`` / ``""`` -> sorted 0-based layer indices, validated."""
    try:
        layers = parse_layer_spec(spec)
    except ValueError as e:
        raise PluginOptionError(f"{option}: {e}")
    if layers is None:
        return tuple(range(num_layers))
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise PluginOptionError(f"{option}: layer indices {bad} out of range for {num_layers} layers (0-based)")
    return layers


def fill_option_defaults(args, config) -> None:
    """Give ``args`` every option of the dataclass ``config``, and the ``--attention-backend`` every
    family shares, that it lacks (or holds as None): a hydra config carries only the options its
    YAML names, and fairseq keeps on the model's config only options present on ``args``.

    Choice options become plain strings: an Enum inside the checkpoint's Namespace would not
    load under torch's safe loading.
    """
    for defaults in (config, AttentionBackendConfig()):
        for f in dataclasses.fields(defaults):
            if f.name.startswith("_"):
                continue
            if getattr(args, f.name, None) is None:
                setattr(args, f.name, getattr(defaults, f.name))
            value = getattr(args, f.name)
            if isinstance(value, Enum):
                setattr(args, f.name, str(value))
