"""Differentiable-window Transformer (``--arch transformer_diffwin_*``), SPEC §3.

fairseq's Transformer whose encoder self-attention, decoder self-attention and cross-attention
in the lower ``--diffwin-layers`` layers each get an additive (AW) or multiplicative (MW)
differentiable window, with token or segment masks (:mod:`man_fairseq.modules.diff_window`).

Presets name the paper's configurations. A preset only fills the per-module options the user
did not give: an explicit ``--diffwin-encoder/--diffwin-decoder/--diffwin-cross`` or mask option
always wins, so a preset plus one explicit option reproduces the neighbouring table rows.
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

from ..modules.diff_window import MASK_TYPES, WINDOW_MODES, build_window
from ..plugin_options import (
    VALID,
    Choice,
    Number,
    PluginOptionError,
    add_option_args,
    as_namespace,
    check_options,
    fit_layers,
)
from .biased_transformer import CROSS, DECODER_SELF, ENCODER_SELF, BiasedTransformerModel, fill_option_defaults

logger = logging.getLogger(__name__)

# per-module options each preset sets (unless given explicitly)
DIFFWIN_PRESETS = {
    "none": {},
    "enc_aw-dec_mw": {"diffwin_encoder": "aw", "diffwin_decoder": "mw", "diffwin_cross": "none"},
    "cr_aw_seg": {
        "diffwin_encoder": "none", "diffwin_decoder": "none",
        "diffwin_cross": "aw", "diffwin_cross_mask": "segment",
    },
    "enc_aw-cr_aw_seg-dec_mw": {
        "diffwin_encoder": "aw", "diffwin_decoder": "mw",
        "diffwin_cross": "aw", "diffwin_cross_mask": "segment",
    },
}
DEFAULT_PRESET = "enc_aw-cr_aw_seg-dec_mw"


@dataclass
class DiffWinConfig(FairseqDataclass):
    diffwin_preset: ChoiceEnum(list(DIFFWIN_PRESETS)) = field(
        default=DEFAULT_PRESET,
        metadata={"help": "paper configuration filling the per-module options not given explicitly "
                  "(explicit options win); 'none' = every module none unless given"},
    )
    diffwin_encoder: ChoiceEnum(list(WINDOW_MODES)) = field(
        default="none", metadata={"help": "window of encoder self-attention: none | aw (additive) | mw (multiplicative)"}
    )
    diffwin_decoder: ChoiceEnum(list(WINDOW_MODES)) = field(
        default="none", metadata={"help": "window of decoder self-attention (token masks, causal)"}
    )
    diffwin_cross: ChoiceEnum(list(WINDOW_MODES)) = field(
        default="none", metadata={"help": "window of encoder-decoder attention"}
    )
    diffwin_encoder_mask: ChoiceEnum(list(MASK_TYPES)) = field(
        default="token", metadata={"help": "token or segment mask in encoder self-attention"}
    )
    diffwin_decoder_mask: ChoiceEnum(list(MASK_TYPES)) = field(
        default="token",
        metadata={"help": "decoder self-attention supports 'token' only; 'segment' is refused "
                  "(a segment would reach future tokens)",
                  VALID: Choice(["token"], why="decoder self-attention supports token masks only (a segment "
                                "would let a target token attend to later tokens of its segment)")},
    )
    diffwin_cross_mask: ChoiceEnum(list(MASK_TYPES)) = field(
        default="token", metadata={"help": "token or segment mask in cross-attention"}
    )
    diffwin_segment_size: int = field(
        default=5, metadata={"help": "segment size b of segment masks", VALID: Number(1, integer=True)}
    )
    diffwin_layers: int = field(
        default=3,
        metadata={"help": "windows in the lower N layers of encoder and decoder (0: none); the default "
                  "is cut to a shallower model's depth with a logged note, any other N beyond it is an error",
                  VALID: Number(0, integer=True)},
    )
    diffwin_temperature: float = field(
        default=1.0,
        metadata={"help": "temperature dividing the boundary-pointer logits", VALID: Number(0, low_open=True)},
    )
    diffwin_mw_renormalize: bool = field(
        default=False, metadata={"help": "renormalise multiplicative-window attention over the keys "
                                 "(the paper does not)"}
    )
    diffwin_mask_union: bool = field(
        default=False,
        metadata={"help": "mask = P(key between the two pointers) <= 1: count l and r in the same "
                  "token/segment once (the paper's formula counts that event twice)"},
    )


DIFFWIN_DEFAULTS = DiffWinConfig()


def diffwin_base_architecture(args):
    """Preset first (only for options still unset), then defaults; idempotent."""
    preset = getattr(args, "diffwin_preset", None)
    preset = str(preset) if preset is not None else DEFAULT_PRESET
    if preset not in DIFFWIN_PRESETS:
        raise PluginOptionError(f"unknown --diffwin-preset {preset!r}; choose one of {sorted(DIFFWIN_PRESETS)}")
    args.diffwin_preset = preset
    for name, value in DIFFWIN_PRESETS[preset].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    fill_option_defaults(args, DIFFWIN_DEFAULTS)


def validate_diffwin_args(args):
    check_options(args, DiffWinConfig)  # --diffwin-decoder-mask: token only
    # the stacks that get windows: the layer count must exist in each of them
    depths = [args.encoder_layers] if args.diffwin_encoder != "none" else []
    if args.diffwin_decoder != "none" or args.diffwin_cross != "none":
        depths.append(args.decoder_layers)
    if depths:
        args.diffwin_layers = fit_layers(
            "--diffwin-layers", args.diffwin_layers, DIFFWIN_DEFAULTS.diffwin_layers, min(depths),
            lambda n, depth: depth if n > depth else None, logger,
        )


@register_model("transformer_diffwin")
class TransformerDiffWinModel(BiasedTransformerModel):
    """Transformer with differentiable windows in the lower layers' attentions."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_option_args(parser, DiffWinConfig())

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)  # fairseq-hydra-train passes a DictConfig
        diffwin_base_architecture(args)
        validate_diffwin_args(args)
        logger.info(
            "diffwin: preset=%s encoder=%s(%s) decoder=%s(token) cross=%s(%s) layers<%d "
            "segment_size=%d temperature=%g mw_renormalize=%s mask_union=%s",
            args.diffwin_preset, args.diffwin_encoder, args.diffwin_encoder_mask,
            args.diffwin_decoder, args.diffwin_cross, args.diffwin_cross_mask, args.diffwin_layers,
            args.diffwin_segment_size, args.diffwin_temperature, args.diffwin_mw_renormalize,
            args.diffwin_mask_union,
        )
        return super().build_model(args, task)

    @classmethod
    def attention_extras(cls, cfg, kind, layer_idx):
        if layer_idx >= cfg.diffwin_layers:
            return None, None
        mode, mask, kdim = {
            ENCODER_SELF: (cfg.diffwin_encoder, cfg.diffwin_encoder_mask, None),
            DECODER_SELF: (cfg.diffwin_decoder, cfg.diffwin_decoder_mask, None),
            CROSS: (cfg.diffwin_cross, cfg.diffwin_cross_mask, cfg.encoder.embed_dim),
        }[kind]
        dim = cfg.encoder.embed_dim if kind == ENCODER_SELF else cfg.decoder.embed_dim
        return build_window(
            str(mode), dim, kdim=kdim, mask_type=str(mask),
            segment_size=cfg.diffwin_segment_size, temperature=cfg.diffwin_temperature,
            causal=kind == DECODER_SELF, renormalize=bool(cfg.diffwin_mw_renormalize),
            union=bool(cfg.diffwin_mask_union),
        )


@register_model_architecture("transformer_diffwin", "transformer_diffwin_base")
def transformer_diffwin_base(args):
    """WMT14 En-De base (transformer_wmt_en_de sizes: d=512, 8 heads, FFN 2048, 6+6 layers)."""
    diffwin_base_architecture(args)
    base_architecture(args)


@register_model_architecture("transformer_diffwin", "transformer_diffwin_small")
def transformer_diffwin_small(args):
    """IWSLT sizes (transformer_iwslt_de_en: d=512, 4 heads, FFN 1024)."""
    diffwin_base_architecture(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_diffwin", "transformer_diffwin_big")
def transformer_diffwin_big(args):
    """transformer_vaswani_wmt_en_de_big sizes (d=1024, 16 heads, FFN 4096)."""
    diffwin_base_architecture(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_diffwin", "transformer_diffwin")
def transformer_diffwin(args):
    transformer_diffwin_base(args)
