"""Localness-modelled Transformer (``--arch transformer_localness_*``), docs/localness.md.

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
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..modules.localness import WINDOW_STRATEGIES, LocalnessBias
from ..modules.relative_position import RelativePositionMultiheadAttention
from ..plugin_options import (
    MAX_DISTANCE, VALID, Number, Parsed, fit_layers, layers_within, parse_layer_set, parse_layer_spec,
)
from .biased_transformer import BiasedTransformerModel
from .family import (
    ATTENTION_TYPES,
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    fairseq_sizes,
    register_family,
    stack_depths,
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
        metadata={"help": "a LIST of 0-based layer indices that get the localness bias, not a count "
                  "('3' is the fourth layer alone; the lower three are '0,1,2'); 'all'; '' for none; "
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
                  VALID: Number(1, MAX_DISTANCE, integer=True)},
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


@dataclass(frozen=True)
class LocalnessAttention:
    """The plan entry of one attention: a Gaussian bias (``window`` not None), Shaw et al.'s
    relative positions (``max_relative_position`` not None), or both."""

    window: Optional[str] = None
    fixed_window: float = 10.0
    head_window_max: float = 50.0
    max_relative_position: Optional[int] = None


@register_family("transformer_localness")
class TransformerLocalnessModel(BiasedTransformerModel):
    """Transformer with a learnable Gaussian localness bias (and optional relative positions)."""

    config = LocalnessConfig
    sizes = fairseq_sizes()

    @classmethod
    def attention_specs(cls, args):
        types = parse_attention_types(args.localness_attention_types, "--localness-attention-types")
        encoder_layers, decoder_layers = stack_depths(args)
        depth = {ENCODER_SELF: encoder_layers, DECODER_SELF: decoder_layers, CROSS: decoder_layers}
        if types:
            args.localness_layers = fit_layers(
                "--localness-layers", args.localness_layers, LOCALNESS_DEFAULTS.localness_layers,
                min(depth[kind] for kind in types), layers_within, logger,
            )
        relative = ()
        if args.relative_positions:
            relative = parse_attention_types(
                args.relative_position_attention_types, "--relative-position-attention-types",
                allowed=(ENCODER_SELF, DECODER_SELF),
            )
        specs = {}
        for kind in ATTENTION_TYPES:
            localness = parse_layer_set(args.localness_layers, depth[kind], "--localness-layers") \
                if kind in types else ()
            for layer in range(depth[kind]):
                if layer in localness or kind in relative:
                    specs[kind, layer] = LocalnessAttention(
                        window=str(args.localness_window) if layer in localness else None,
                        fixed_window=args.localness_fixed_window,
                        head_window_max=args.localness_head_window_max,
                        max_relative_position=args.max_relative_position if kind in relative else None,
                    )
        return specs

    @classmethod
    def inert_options(cls, args, plan):
        specs = plan.of(TransformerLocalnessModel).values()
        windows = {spec.window for spec in specs if spec.window is not None}
        inert = {}
        if not windows:
            inert["localness_window"] = "no attention gets the Gaussian bias (--localness-layers, " \
                                        "--localness-attention-types)"
        if "fixed" not in windows:
            inert["localness_fixed_window"] = "only the 'fixed' window strategy reads it"
        if "head" not in windows:
            inert["localness_head_window_max"] = "only the 'head' window strategy reads it"
        if not args.relative_positions:
            why = "without --relative-positions"
            inert.update(max_relative_position=why, relative_position_attention_types=why)
        elif not any(spec.max_relative_position is not None for spec in specs):
            inert["relative_positions"] = "--relative-position-attention-types names no self-attention"
        return inert

    @classmethod
    def attention_extras(cls, spec, kind, cfg):
        if spec.window is None:
            return None, None
        dim = cfg.encoder.embed_dim if kind == ENCODER_SELF else cfg.decoder.embed_dim
        heads = cfg.encoder.attention_heads if kind == ENCODER_SELF else cfg.decoder.attention_heads
        bias = LocalnessBias(
            dim, heads, window=spec.window, causal=kind == DECODER_SELF,
            fixed_window=spec.fixed_window, head_window_max=spec.head_window_max,
        )
        return bias, None

    @classmethod
    def attention_module(cls, spec, kind, cfg, **kwargs):
        if spec is None or spec.max_relative_position is None:
            return super().attention_module(spec, kind, cfg, **kwargs)
        return RelativePositionMultiheadAttention(max_relative_position=spec.max_relative_position, **kwargs)
