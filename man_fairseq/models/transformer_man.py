"""Mask Attention Networks (``--arch transformer_man_*``), docs/man.md.

fairseq's Transformer with every layer a :class:`~man_fairseq.modules.man_layers.MANLayer` (the one
wiring, :mod:`.biased_transformer`, in MAN's layer form); the model class declares the options,
sizes, checks and the plan (each side's sublayers).
"""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)

from ..modules.man_layers import DECODER_SUBLAYERS, ENCODER_SUBLAYERS, parse_sublayers
from ..plugin_options import MAX_DISTANCE, VALID, Choice, Number, Parsed, PluginOptionError
from .biased_transformer import BiasedTransformerModel, ComposedPlan
from .family import Size, register_family


MAN_NORMS = ("pre", "post", "fairseq")


@dataclass
class MANConfig(FairseqDataclass):
    encoder_sublayers: str = field(
        default="dman,san,ffn",
        metadata={"help": "comma-separated sublayers of each encoder layer: dman, san, sman1, sman2, ffn "
                  "(paper Table 3 orders, e.g. 'ffn,san,ffn', 'san,dman,ffn')",
                  VALID: Parsed(lambda spec: parse_sublayers(spec, decoder=False),
                                "comma-separated, from " + ", ".join(ENCODER_SUBLAYERS))},
    )
    decoder_sublayers: str = field(
        default="dman,san,cross,ffn",
        metadata={"help": "sublayers of each decoder layer; as --encoder-sublayers plus 'cross' "
                  "(encoder-decoder attention) exactly once",
                  VALID: Parsed(lambda spec: parse_sublayers(spec, decoder=True),
                                "comma-separated, from " + ", ".join(DECODER_SUBLAYERS) + "; cross exactly once")},
    )
    dman_max_relative_distance: int = field(
        default=256,
        metadata={"help": "DMAN relative distances |t-s| beyond this share the boundary value (K)",
                  VALID: Number(0, MAX_DISTANCE, integer=True)},
    )
    dman_init: ChoiceEnum(["normal", "zeros"]) = field(
        default="normal",
        metadata={"help": "initial distance and head biases P, U of the DMAN mask: normal = N(0, 1), as the MAN "
                  "reference code; zeros = 0, so that the mask starts with no positional preference (not in "
                  "the paper; results/gigaword-cpu/README.md)"},
    )
    static_mask_window: int = field(
        default=4, metadata={"help": "window b of the sman2 static mask (|t-s| <= b)",
                             VALID: Number(0, MAX_DISTANCE, integer=True)}
    )
    man_norm: str = field(
        default="fairseq",
        metadata={"help": "where each sublayer's layer norm sits: pre (before it: --encoder- and "
                  "--decoder-normalize-before, as the authors' translation runs; the default of "
                  "transformer_man_small/base/big), post (after it, fairseq's default; the post-norm ablation), "
                  "fairseq (as fairseq's --encoder/decoder-normalize-before say: the default of "
                  "transformer_man_summarization, post-norm as the authors' summarization runs, and of a "
                  "checkpoint saved before this option, which keeps its own setting)",
                  VALID: Choice(MAN_NORMS)},
    )
    attention_head_activation: ChoiceEnum(["none", "relu", "gelu"]) = field(
        default="none",
        metadata={"help": "activation on the concatenated head outputs before the output "
                  "projection (the MAN reference code used one; the paper does not)"},
    )


MAN_DEFAULTS = MANConfig()


@register_family("transformer_man")
class TransformerMANModel(BiasedTransformerModel):
    """Transformer whose layers are DMAN -> SAN -> FFN (configurable)."""

    config = MANConfig
    sizes = {
        "base": Size(base_architecture, "WMT14 En-De base: d=512, 8 heads, FFN 1024 (half of the Transformer's), "
                     "DMAN enc+dec, pre-norm.",
                     {"encoder_ffn_embed_dim": 1024, "decoder_ffn_embed_dim": 1024, "man_norm": "pre"}),
        "small": Size(transformer_iwslt_de_en, "IWSLT14: d=512, 4 heads, FFN 512, DMAN in the encoder only "
                      "(37M params, Table 1), pre-norm.",
                      {"encoder_ffn_embed_dim": 512, "decoder_ffn_embed_dim": 512,
                       "decoder_sublayers": "san,cross,ffn", "dropout": 0.3, "man_norm": "pre"}),
        "big": Size(transformer_vaswani_wmt_en_de_big, "WMT14 En-De big: d=1024, 16 heads, FFN 2048, dropout 0.3, pre-norm.",
                    {"encoder_ffn_embed_dim": 2048, "decoder_ffn_embed_dim": 2048, "man_norm": "pre"}),
        "summarization": Size(base_architecture, "CNN/DailyMail and Gigaword: d=768, 12 heads, FFN 1536, dropout 0.1, post-norm.",
                              {"encoder_embed_dim": 768, "decoder_embed_dim": 768, "encoder_attention_heads": 12,
                               "decoder_attention_heads": 12, "encoder_ffn_embed_dim": 1536,
                               "decoder_ffn_embed_dim": 1536, "dropout": 0.1}),
    }

    @classmethod
    def fill_size(cls, args, size):
        # a checkpoint saved before --man-norm keeps the norm its fairseq flags say: it holds both (a
        # command line names only the flags given, and one flag alone must not undo the arch's norm on
        # the other side: fairseq's flag pair made a pre-norm arch's decoder post-norm, issue 81)
        if not hasattr(args, "man_norm") and all(hasattr(args, f"{side}_normalize_before")
                                                 for side in ("encoder", "decoder")):
            args.man_norm = "fairseq"
        super().fill_size(args, size)
        if args.man_norm == "fairseq":
            return
        pre = args.man_norm == "pre"
        for side in ("encoder", "decoder"):
            if getattr(args, f"{side}_normalize_before", False) and not pre:
                raise PluginOptionError(f"--man-norm post contradicts --{side}-normalize-before")
            setattr(args, f"{side}_normalize_before", pre)

    @classmethod
    def check(cls, args):
        # fairseq options the MAN layers do not implement: refused rather than ignored
        for option in ("no_cross_attention", "cross_self_attention"):
            if getattr(args, option, False):
                raise PluginOptionError(f"transformer_man does not support --{option.replace('_', '-')}")

    @classmethod
    def make_plan(cls, args):
        return ComposedPlan(
            encoder_sublayers=tuple(parse_sublayers(args.encoder_sublayers, decoder=False)),
            decoder_sublayers=tuple(parse_sublayers(args.decoder_sublayers, decoder=True)),
            man_layers=True,  # MAN's layer form (blocks.i) even for the Transformer's order
        )

    @classmethod
    def inert_options(cls, args, plan):
        sublayers = set(plan.encoder_sublayers) | set(plan.decoder_sublayers)
        inert = {}
        if "sman2" not in sublayers:
            inert["static_mask_window"] = "no sman2 sublayer in --encoder-sublayers or --decoder-sublayers"
        if "dman" not in sublayers:
            why = "no dman sublayer in --encoder-sublayers or --decoder-sublayers"
            inert.update(dman_max_relative_distance=why, dman_init=why)
        return inert
