"""Localness-modelled Transformer (``--arch transformer_localness_*``), SPEC §2.

fairseq's Transformer whose chosen attentions get the learnable Gaussian localness bias
(:class:`LocalnessBias`) and, optionally, Shaw et al.'s relative position representations
(:class:`RelativePositionMultiheadAttention`). The paper's tables are option sets:

* window strategy: ``--localness-window fixed|layer|query|head``;
* layers: ``--localness-layers 0,1,2`` (0-based, ``all``, or ``""`` for no localness);
* attention types: ``--localness-attention-types encoder_self[,decoder_self,cross]``;
* ``--relative-positions`` (on ``--relative-position-attention-types``, every layer).
"""

import logging
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)

from ..modules.localness import WINDOW_STRATEGIES, LocalnessBias
from ..modules.relative_position import RelativePositionMultiheadAttention
from ..plugin_options import (
    VALID,
    Number,
    Parsed,
    add_option_args,
    as_namespace,
    check_options,
    fit_layers,
    parse_layer_spec,
)
from .biased_transformer import (
    ATTENTION_TYPES,
    DECODER_SELF,
    ENCODER_SELF,
    BiasedTransformerModel,
    fill_option_defaults,
    parse_layer_set,
)

logger = logging.getLogger(__name__)


@dataclass
class LocalnessConfig(FairseqDataclass):
    localness_window: ChoiceEnum(list(WINDOW_STRATEGIES)) = field(
        default="query",
        metadata={"help": "window size D of the Gaussian bias: fixed (--localness-fixed-window), "
                  "layer (from the mean of the non-pad keys), query (from the query, sharing W_p "
                  "with the centre), head (one learned D = N*sigmoid(z) per head)"},
    )
    localness_fixed_window: float = field(
        default=10.0,
        metadata={"help": "window size D of the 'fixed' strategy (sigma = D/2)", VALID: Number(0, low_open=True)},
    )
    localness_head_window_max: float = field(
        default=50.0,
        metadata={"help": "N of the 'head' strategy: D = N * sigmoid(z_head)", VALID: Number(0, low_open=True)},
    )
    localness_layers: str = field(
        default="0,1,2",
        metadata={"help": "0-based layers that get the localness bias ('all'; '' for none); "
                  "applies to each of --localness-attention-types; the default is cut to a shallower "
                  "model's depth with a logged note, any other index beyond it is an error",
                  VALID: Parsed(parse_layer_spec, "comma-separated 0-based layer indices, 'all', or '' (none)")},
    )
    localness_attention_types: str = field(
        default="encoder_self",
        metadata={"help": "comma-separated attentions with localness: encoder_self, decoder_self, cross",
                  VALID: Parsed(lambda spec: parse_attention_types(spec, "--localness-attention-types"),
                                "comma-separated subset of " + ", ".join(ATTENTION_TYPES))},
    )
    relative_positions: bool = field(
        default=False,
        metadata={"help": "add relative position representations (Shaw et al. 2018) to every layer "
                  "of --relative-position-attention-types"},
    )
    max_relative_position: int = field(
        default=16,
        metadata={"help": "clipping distance K of the relative position representations",
                  VALID: Number(1, integer=True)},
    )
    relative_position_attention_types: str = field(
        default="encoder_self,decoder_self",
        metadata={"help": "self-attentions with relative positions: encoder_self, decoder_self",
                  VALID: Parsed(lambda spec: parse_attention_types(spec, "--relative-position-attention-types",
                                                                   allowed=(ENCODER_SELF, DECODER_SELF)),
                                "comma-separated subset of encoder_self, decoder_self")},
    )


LOCALNESS_DEFAULTS = LocalnessConfig()


def parse_attention_types(spec: str, option: str, allowed=ATTENTION_TYPES):
    if not isinstance(spec, str):
        raise ValueError(f"{option} must be a comma-separated string, got {spec!r}")
    types = [x.strip() for x in (spec or "").split(",") if x.strip()]
    bad = [x for x in types if x not in allowed]
    if bad:
        raise ValueError(f"{option}: unknown attention type(s) {bad}; choose from {list(allowed)}")
    return tuple(dict.fromkeys(types))


def localness_plan(cfg):
    """{attention type: layers with localness}, validated (also used at start-up)."""
    types = parse_attention_types(cfg.localness_attention_types, "--localness-attention-types")
    plan = {}
    for kind in types:
        n = cfg.encoder.layers if kind == ENCODER_SELF else cfg.decoder.layers
        plan[kind] = parse_layer_set(cfg.localness_layers, n, "--localness-layers")
    return plan


def _layers_within(spec: str, num_layers: int):
    """``spec`` without the indices >= num_layers, or None when nothing is cut."""
    layers = parse_layer_spec(spec)
    if layers is None or all(i < num_layers for i in layers):
        return None
    return ",".join(str(i) for i in layers if i < num_layers)


def relative_position_types(cfg):
    if not cfg.relative_positions:
        return ()
    return parse_attention_types(
        cfg.relative_position_attention_types, "--relative-position-attention-types",
        allowed=(ENCODER_SELF, DECODER_SELF),
    )


@register_model("transformer_localness")
class TransformerLocalnessModel(BiasedTransformerModel):
    """Transformer with a learnable Gaussian localness bias (and optional relative positions)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_option_args(parser, LocalnessConfig())

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)  # fairseq-hydra-train passes a DictConfig
        localness_base_architecture(args)
        # fail at start-up on bad values, before data is read and layers are built
        check_options(args, LocalnessConfig)
        types = parse_attention_types(args.localness_attention_types, "--localness-attention-types")
        if types:
            depth = min(args.encoder_layers if kind == ENCODER_SELF else args.decoder_layers for kind in types)
            args.localness_layers = fit_layers(
                "--localness-layers", args.localness_layers, LOCALNESS_DEFAULTS.localness_layers, depth,
                _layers_within, logger,
            )
        from fairseq.models.transformer import TransformerConfig

        cfg = TransformerConfig.from_namespace(args)
        localness_plan(cfg)
        relative_position_types(cfg)
        return super().build_model(args, task)

    @classmethod
    def attention_extras(cls, cfg, kind, layer_idx):
        if layer_idx not in localness_plan(cfg).get(kind, ()):
            return None, None
        dim = cfg.encoder.embed_dim if kind == ENCODER_SELF else cfg.decoder.embed_dim
        heads = cfg.encoder.attention_heads if kind == ENCODER_SELF else cfg.decoder.attention_heads
        bias = LocalnessBias(
            dim, heads, window=str(cfg.localness_window), causal=kind == DECODER_SELF,
            fixed_window=cfg.localness_fixed_window, head_window_max=cfg.localness_head_window_max,
        )
        return bias, None

    @classmethod
    def build_attention(cls, kind, layer_idx, cfg):
        if kind not in relative_position_types(cfg):
            return super().build_attention(kind, layer_idx, cfg)
        bias_module, post_softmax = cls.attention_extras(cfg, kind, layer_idx)
        dim = cfg.encoder.embed_dim if kind == ENCODER_SELF else cfg.decoder.embed_dim
        heads = cfg.encoder.attention_heads if kind == ENCODER_SELF else cfg.decoder.attention_heads
        return RelativePositionMultiheadAttention(
            dim,
            heads,
            max_relative_position=cfg.max_relative_position,
            dropout=cfg.attention_dropout,
            self_attention=True,
            bias_module=bias_module,
            post_softmax=post_softmax,
            q_noise=cfg.quant_noise.pq,
            qn_block_size=cfg.quant_noise.pq_block_size,
        )


def localness_base_architecture(args):
    fill_option_defaults(args, LOCALNESS_DEFAULTS)


@register_model_architecture("transformer_localness", "transformer_localness_base")
def transformer_localness_base(args):
    """WMT14 En-De base: the sizes of fairseq's transformer_wmt_en_de (d=512, 8 heads, FFN 2048)."""
    localness_base_architecture(args)
    base_architecture(args)


@register_model_architecture("transformer_localness", "transformer_localness_small")
def transformer_localness_small(args):
    """IWSLT size: fairseq's transformer_iwslt_de_en (d=512, 4 heads, FFN 1024)."""
    localness_base_architecture(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_localness", "transformer_localness_big")
def transformer_localness_big(args):
    """WMT14 En-De big: fairseq's transformer_vaswani_wmt_en_de_big (d=1024, 16 heads, dropout 0.3)."""
    localness_base_architecture(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_localness", "transformer_localness")
def transformer_localness(args):
    transformer_localness_base(args)
