"""Mask Attention Networks (``--arch transformer_man_*``), SPEC §1.

fairseq's Transformer with every layer replaced by a :class:`MANLayer`; the model class only
wires options to modules.
"""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)

from ..modules.man_layers import DECODER_SUBLAYERS, ENCODER_SUBLAYERS, MANDecoderLayer, MANEncoderLayer, parse_sublayers
from ..plugin_options import VALID, Number, Parsed, PluginOptionError, add_option_args, as_namespace, check_options
from .biased_transformer import add_attention_backend_args, fill_option_defaults, set_attention_backend, wrap_layer


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
                  VALID: Number(0, integer=True)},
    )
    static_mask_window: int = field(
        default=4, metadata={"help": "window b of the sman2 static mask (|t-s| <= b)", VALID: Number(0, integer=True)}
    )
    attention_head_activation: ChoiceEnum(["none", "relu", "gelu"]) = field(
        default="none",
        metadata={"help": "activation on the concatenated head outputs before the output "
                  "projection (the MAN reference code used one; the paper does not)"},
    )


MAN_DEFAULTS = MANConfig()


class MANEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return wrap_layer(MANEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class MANDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(MANDecoderLayer(cfg, no_encoder_attn=no_encoder_attn), cfg)


@register_model("transformer_man")
class TransformerMANModel(TransformerModel):
    """Transformer whose layers are DMAN -> SAN -> FFN (configurable)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_option_args(parser, MANConfig())
        add_attention_backend_args(parser)

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)  # fairseq-hydra-train passes a DictConfig
        man_base_architecture(args)
        # fail at start-up, before any data is read, on any value outside its declared range
        check_options(args, MANConfig)
        # fairseq options the MAN layers do not implement: refused rather than ignored
        for option in ("no_cross_attention", "cross_self_attention"):
            if getattr(args, option, False):
                raise PluginOptionError(f"transformer_man does not support --{option.replace('_', '-')}")
        return set_attention_backend(super().build_model(args, task), args)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return MANEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return MANDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


def man_base_architecture(args):
    fill_option_defaults(args, MAN_DEFAULTS)


@register_model_architecture("transformer_man", "transformer_man_base")
def transformer_man_base(args):
    """WMT14 En-De base: d=512, 8 heads, FFN 1024 (half of the Transformer's), DMAN enc+dec."""
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 1024)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 1024)
    man_base_architecture(args)
    base_architecture(args)


@register_model_architecture("transformer_man", "transformer_man_small")
def transformer_man_small(args):
    """IWSLT14: d=512, 4 heads, FFN 512, DMAN in the encoder only (37M params, Table 1)."""
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 512)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 512)
    args.decoder_sublayers = getattr(args, "decoder_sublayers", None) or "san,cross,ffn"
    args.dropout = getattr(args, "dropout", 0.3)
    man_base_architecture(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_man", "transformer_man_big")
def transformer_man_big(args):
    """WMT14 En-De big: d=1024, 16 heads, FFN 2048, dropout 0.3."""
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 2048)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 2048)
    man_base_architecture(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_man", "transformer_man_summarization")
def transformer_man_summarization(args):
    """CNN/DailyMail and Gigaword: d=768, 12 heads, FFN 1536, dropout 0.1."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 768)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 768)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 12)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 12)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 1536)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 1536)
    args.dropout = getattr(args, "dropout", 0.1)
    man_base_architecture(args)
    base_architecture(args)


@register_model_architecture("transformer_man", "transformer_man")
def transformer_man(args):
    transformer_man_base(args)
