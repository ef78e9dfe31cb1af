"""Differentiable-window Transformer (``--arch transformer_diffwin_*``), docs/diffwin.md.

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

from ..modules.diff_window import MASK_TYPES, WINDOW_MODES, WindowPointers, build_window
from ..plugin_options import MAX_DISTANCE, VALID, Choice, Number, PluginOptionError, count_within, fit_layers
from .biased_transformer import BiasedTransformerModel
from .family import (
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    fairseq_sizes,
    fill_option_defaults,
    register_family,
    stack_depths,
)

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
        default=5, metadata={"help": "segment size b of segment masks",
                             VALID: Number(1, MAX_DISTANCE, integer=True)}
    )
    diffwin_layers: int = field(
        default=3,
        metadata={"help": "a COUNT N, not a list: windows in the lower N layers (0-based layers 0..N-1) of "
                  "encoder and decoder; 0: none; the default is cut to a shallower model's depth with a "
                  "logged note, any other N beyond it is an error",
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


def preset_fills(args, dest: str, value) -> bool:
    """Whether ``--diffwin-preset`` of ``args`` fills option ``dest`` with ``value``."""
    preset = DIFFWIN_PRESETS[args.diffwin_preset]
    return dest in preset and str(value) == str(preset[dest])


@dataclass(frozen=True)
class WindowAttention:
    """The plan entry of one attention: its window (``aw``/``mw``) and mask."""

    mode: str
    mask: str
    segment_size: int
    temperature: float
    renormalize: bool
    union: bool


@register_family("transformer_diffwin")
class TransformerDiffWinModel(BiasedTransformerModel):
    """Transformer with differentiable windows in the lower layers' attentions."""

    config = DiffWinConfig
    sizes = fairseq_sizes()

    @classmethod
    def fill_defaults(cls, args):
        diffwin_base_architecture(args)

    @classmethod
    def attention_specs(cls, args):
        modes = {
            ENCODER_SELF: (str(args.diffwin_encoder), str(args.diffwin_encoder_mask)),
            DECODER_SELF: (str(args.diffwin_decoder), str(args.diffwin_decoder_mask)),
            CROSS: (str(args.diffwin_cross), str(args.diffwin_cross_mask)),
        }
        encoder_layers, decoder_layers = stack_depths(args)
        depth = {ENCODER_SELF: encoder_layers, DECODER_SELF: decoder_layers, CROSS: decoder_layers}
        # the stacks that get windows: the layer count must exist in each of them
        depths = [depth[kind] for kind, (mode, _) in modes.items() if mode != "none"]
        if depths:
            args.diffwin_layers = fit_layers(
                "--diffwin-layers", args.diffwin_layers, DIFFWIN_DEFAULTS.diffwin_layers, min(depths),
                count_within, logger,
            )
        logger.info(
            "diffwin: preset=%s encoder=%s(%s) decoder=%s(token) cross=%s(%s) layers<%d "
            "segment_size=%d temperature=%g mw_renormalize=%s mask_union=%s",
            args.diffwin_preset, args.diffwin_encoder, args.diffwin_encoder_mask,
            args.diffwin_decoder, args.diffwin_cross, args.diffwin_cross_mask, args.diffwin_layers,
            args.diffwin_segment_size, args.diffwin_temperature, args.diffwin_mw_renormalize,
            args.diffwin_mask_union,
        )
        return {
            (kind, layer): WindowAttention(
                mode, mask, args.diffwin_segment_size, args.diffwin_temperature,
                bool(args.diffwin_mw_renormalize), bool(args.diffwin_mask_union),
            )
            for kind, (mode, mask) in modes.items() if mode != "none"
            for layer in range(min(args.diffwin_layers, depth[kind]))
        }

    @classmethod
    def is_default(cls, args, dest, value):
        """The option's own default, or the value its preset fills in."""
        return super().is_default(args, dest, value) or preset_fills(args, dest, value)

    @classmethod
    def inert_options(cls, args, plan):
        specs = list(plan.of(TransformerDiffWinModel).values())
        if not specs:
            no_mode = all(str(getattr(args, f"diffwin_{side}")) == "none" for side in ("encoder", "decoder", "cross"))
            why = "no attention gets a window (" + ("--diffwin-encoder, -decoder and -cross are none)" if no_mode
                                                    else "--diffwin-layers 0)")
            dests = ["diffwin_temperature", "diffwin_segment_size", "diffwin_encoder_mask", "diffwin_cross_mask",
                     "diffwin_mw_renormalize", "diffwin_mask_union"] + (["diffwin_layers"] if no_mode else [])
            return {dest: why for dest in dests}
        inert = {}
        if not any(spec.mask == "segment" for spec in specs):
            inert["diffwin_segment_size"] = "no window uses a segment mask"
        if not any(spec.mode == "mw" for spec in specs):
            inert["diffwin_mw_renormalize"] = "no multiplicative (mw) window"
        for side in ("encoder", "cross"):
            if str(getattr(args, f"diffwin_{side}")) == "none":
                inert[f"diffwin_{side}_mask"] = f"--diffwin-{side} none"
        return inert

    def set_beam_size(self, beam_size: int):
        """Called by fairseq's generator: the cross-attention windows then cache one row per
        sentence instead of one per hypothesis (the core's own caches are fairseq's, untouched)."""
        for module in self.decoder.modules():
            if isinstance(module, WindowPointers):
                module.set_beam_size(beam_size)

    @classmethod
    def attention_extras(cls, spec, kind, cfg):
        dim = cfg.encoder.embed_dim if kind == ENCODER_SELF else cfg.decoder.embed_dim
        return build_window(
            spec.mode, dim, kdim=cfg.encoder.embed_dim if kind == CROSS else None, mask_type=spec.mask,
            segment_size=spec.segment_size, temperature=spec.temperature,
            causal=kind == DECODER_SELF, renormalize=spec.renormalize, union=spec.union,
        )
