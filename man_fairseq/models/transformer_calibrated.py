"""Attention calibration (``--arch transformer_calibrated_*``), SPEC §4.

fairseq's Transformer whose encoder-decoder attention in every decoder layer carries a
:class:`CalibrationTransform` (mask perturbation model + calibrated weights + fusion).
Train it with ``--criterion calibrated_label_smoothed_cross_entropy``: that criterion trains
the perturbation model by its own objective; any other criterion leaves it at initialisation.
"""

from dataclasses import dataclass, field
from typing import List

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)
from torch import nn

from ..modules.calibration import FUSIONS, CalibrationTransform, calibration_modules
from ..plugin_options import VALID, Number, PluginOptionError, add_option_args, as_namespace, check_options
from .biased_transformer import CROSS, BiasedTransformerModel, fill_option_defaults


@dataclass
class CalibrationConfig(FairseqDataclass):
    calibration_fusion: ChoiceEnum(list(FUSIONS)) = field(
        default="fixed",
        metadata={"help": "fusion of original and calibrated cross-attention: fixed "
                  "(a + lambda a^c, the authors' code), fixed_softmax (softmax(a + lambda a^c), "
                  "the paper's printed formula), anneal (g(s) a + (1-g(s)) a^c, g(s)=exp(-s/steps)), "
                  "gate (g a + (1-g) a^c, g = sigmoid(q W_g + b_g) per head)"},
    )
    calibration_lambda: float = field(
        default=0.1, metadata={"help": "lambda of the fixed fusion", VALID: Number(0)}
    )
    calibration_anneal_steps: float = field(
        default=100000.0,
        metadata={"help": "time constant of the anneal fusion, g(s) = exp(-s / steps), s = update number",
                  VALID: Number(0, low_open=True)},
    )


CALIBRATION_DEFAULTS = CalibrationConfig()


@register_model("transformer_calibrated")
class TransformerCalibratedModel(BiasedTransformerModel):
    """Transformer with calibrated encoder-decoder attention in every decoder layer."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_option_args(parser, CalibrationConfig())

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)  # fairseq-hydra-train passes a DictConfig
        calibrated_base_architecture(args)
        # fail at start-up on any value outside its declared range (choices: FUSIONS)
        check_options(args, CalibrationConfig)
        if getattr(args, "checkpoint_activations", False):
            # the criterion switches the calibration mode between two passes; a recomputation
            # during backward would run in the wrong mode
            raise PluginOptionError("transformer_calibrated does not support --checkpoint-activations")
        if getattr(args, "no_cross_attention", False):
            raise PluginOptionError("transformer_calibrated needs the encoder-decoder attention (no --no-cross-attention)")
        return super().build_model(args, task)

    @classmethod
    def attention_extras(cls, cfg, kind, layer_idx):
        if kind != CROSS:
            return None, None
        return None, CalibrationTransform(
            query_dim=cfg.decoder.embed_dim,
            key_dim=cfg.encoder.embed_dim,
            num_heads=cfg.decoder.attention_heads,
            fusion=str(cfg.calibration_fusion),
            calibration_lambda=cfg.calibration_lambda,
            anneal_steps=cfg.calibration_anneal_steps,
        )

    def perturbation_parameters(self) -> List[nn.Parameter]:
        """theta_m: the parameters of every layer's mask perturbation model."""
        return [p for m in calibration_modules(self) for p in m.perturbation.parameters()]


def calibrated_base_architecture(args):
    fill_option_defaults(args, CALIBRATION_DEFAULTS)


@register_model_architecture("transformer_calibrated", "transformer_calibrated_small")
def transformer_calibrated_small(args):
    """IWSLT sizes (fairseq's transformer_iwslt_de_en)."""
    calibrated_base_architecture(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_calibrated", "transformer_calibrated_base")
def transformer_calibrated_base(args):
    """WMT14 En-De base (fairseq's transformer / transformer_wmt_en_de)."""
    calibrated_base_architecture(args)
    base_architecture(args)


@register_model_architecture("transformer_calibrated", "transformer_calibrated_big")
def transformer_calibrated_big(args):
    """Transformer big (fairseq's transformer_vaswani_wmt_en_de_big)."""
    calibrated_base_architecture(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_calibrated", "transformer_calibrated")
def transformer_calibrated(args):
    transformer_calibrated_base(args)
