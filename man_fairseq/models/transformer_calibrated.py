"""Attention calibration (``--arch transformer_calibrated_*``), docs/calibration.md.

fairseq's Transformer whose encoder-decoder attention in every decoder layer carries a
:class:`CalibrationTransform` (mask perturbation model + calibrated weights + fusion).
Train it with ``--criterion calibrated_label_smoothed_cross_entropy``: that criterion trains
the perturbation model by its own objective; any other criterion leaves it at initialisation.
"""

from dataclasses import dataclass, field
from typing import List

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from torch import nn

from ..modules.calibration import FUSIONS, CalibrationTransform, calibration_modules
from ..plugin_options import MAX_CALIBRATION_LAMBDA, VALID, Number, PluginOptionError
from .biased_transformer import BiasedTransformerModel
from .family import CROSS, fairseq_sizes, register_family, stack_depths


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
        default=0.1, metadata={"help": "lambda of the fixed fusion", VALID: Number(0, MAX_CALIBRATION_LAMBDA)}
    )
    calibration_anneal_steps: float = field(
        default=100000.0,
        metadata={"help": "time constant of the anneal fusion, g(s) = exp(-s / steps), s = update number",
                  VALID: Number(0, low_open=True)},
    )


CALIBRATION_DEFAULTS = CalibrationConfig()
JOINT_CRITERION = "calibrated_label_smoothed_cross_entropy"


@dataclass(frozen=True)
class CalibratedAttention:
    """The plan entry of every cross-attention: its calibration transform's options."""

    fusion: str
    calibration_lambda: float
    anneal_steps: float


def refuse_activation_checkpointing(args, message):
    """Refuse (PluginOptionError ``message``) a calibrated model with ``--checkpoint-activations``: the
    criterion switches the calibration mode between two passes; a recomputation during backward would run
    in the wrong mode."""
    if getattr(args, "checkpoint_activations", False):
        raise PluginOptionError(message)


@register_family("transformer_calibrated")
class TransformerCalibratedModel(BiasedTransformerModel):
    """Transformer with calibrated encoder-decoder attention in every decoder layer."""

    config = CalibrationConfig
    sizes = fairseq_sizes(("small", "base", "big"))

    @classmethod
    def check(cls, args):
        refuse_activation_checkpointing(args, "transformer_calibrated does not support --checkpoint-activations")
        if getattr(args, "no_cross_attention", False):
            raise PluginOptionError("transformer_calibrated needs the encoder-decoder attention (no --no-cross-attention)")
        criterion = getattr(args, "criterion", None)  # what fairseq-train trains with (absent when built by hand)
        if isinstance(criterion, str) and criterion != JOINT_CRITERION:
            # any other loss never trains the mask perturbation model: "calibration" by an untrained mask
            raise PluginOptionError(f"--arch transformer_calibrated_* trains with --criterion {JOINT_CRITERION} "
                                    f"(its mask perturbation model learns only from that joint loss); got "
                                    f"--criterion {criterion} (a checkpoint trained so loads with --model-overrides "
                                    f"\"{{'criterion': '{JOINT_CRITERION}'}}\")")

    @classmethod
    def attention_specs(cls, args):
        spec = CalibratedAttention(str(args.calibration_fusion), args.calibration_lambda, args.calibration_anneal_steps)
        _, decoder_layers = stack_depths(args)
        return {(CROSS, layer): spec for layer in range(decoder_layers)}

    @classmethod
    def inert_options(cls, args, plan):
        fusion = str(args.calibration_fusion)
        inert = {}
        if fusion not in ("fixed", "fixed_softmax"):
            inert["calibration_lambda"] = f"only the fixed fusions read it (--calibration-fusion {fusion})"
        if fusion != "anneal":
            inert["calibration_anneal_steps"] = f"only the anneal fusion reads it (--calibration-fusion {fusion})"
        return inert

    @classmethod
    def attention_extras(cls, spec, kind, cfg):
        return None, CalibrationTransform(
            query_dim=cfg.decoder.embed_dim,
            key_dim=cfg.encoder.embed_dim,
            num_heads=cfg.decoder.attention_heads,
            fusion=spec.fusion,
            calibration_lambda=spec.calibration_lambda,
            anneal_steps=spec.anneal_steps,
        )

    def perturbation_parameters(self) -> List[nn.Parameter]:
        """theta_m: the parameters of every layer's mask perturbation model."""
        return [p for m in calibration_modules(self) for p in m.perturbation.parameters()]
