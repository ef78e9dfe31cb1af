"""The composed arch (``--arch transformer_masked_*``), docs/model-families.md#combining-the-families.

Every family's options on one model: MAN's sublayers (its sublayer orders and DMAN / SMAN options;
by default a Transformer's ``san,ffn`` and ``san,cross,ffn``), and on any attention the entries of
the other families' plans, each made by that family's own ``attention_specs`` and turned into
modules by its own ``attention_extras``:

* localness (``--localness-attention-types``, ``--localness-layers``) and relative positions;
* differentiable windows (``--diffwin-encoder/-decoder/-cross``, ``--diffwin-layers``, presets);
* calibration of the cross-attention of ``--calibration-layers`` (with the joint criterion).

On one attention the additive biases add in the logits (the MAN sublayer's own mask, then
localness, then an additive window) and the post-softmax transforms apply in :data:`MECHANISMS`'
order (a multiplicative window, then calibration): ``calib(mw(softmax(qk/sqrt(d) + sum of biases)))``.
The model is built by the one wiring of every family (:mod:`.biased_transformer`): a side whose
sublayers are the Transformer's (the default ``san,ffn`` / ``san,cross,ffn``) takes fairseq's layer
form (``self_attn``, ``encoder_attn``, ``fc1``, ...), any other order MAN's (``blocks.i`` /
``sublayer_norms.i``). The four family archs are presets of this model: with one family's options,
it is that family's model, parameter names included.
"""

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Dict, Mapping, Tuple

from fairseq.dataclass import ChoiceEnum

from ..modules.man_layers import SELF_ATTENTION_SUBLAYERS
from ..plugin_options import VALID, Parsed, PluginOptionError, parse_layer_set, parse_layer_spec
from .biased_transformer import ComposedPlan, owns_attention_class
from .family import ATTENTION_TYPES, CROSS, DECODER_SELF, ENCODER_SELF, fairseq_sizes, register_family, stack_depths
from .transformer_calibrated import (JOINT_CRITERION, CalibrationConfig, TransformerCalibratedModel,
                                     refuse_activation_checkpointing)
from .transformer_diffwin import (
    DIFFWIN_PRESETS, DiffWinConfig, TransformerDiffWinModel, diffwin_base_architecture, preset_fills,
)
from .transformer_localness import LocalnessConfig, TransformerLocalnessModel
from .transformer_man import MANConfig, TransformerMANModel

logger = logging.getLogger(__name__)

# the mechanisms a plan entry may hold, in the order their biases add and their transforms apply
MECHANISMS = {
    "localness": TransformerLocalnessModel,
    "diffwin": TransformerDiffWinModel,
    "calibration": TransformerCalibratedModel,
}


def default_changed(config, name: str, default):
    """A field of ``config`` with another default (its help and valid values kept)."""
    original = {f.name: f for f in dataclasses.fields(config)}[name]
    return field(default=default, metadata=dict(original.metadata))


def parse_mechanism_sublayers(spec: str):
    names = [s.strip() for s in (spec or "").split(",") if s.strip()]
    bad = [n for n in names if n not in SELF_ATTENTION_SUBLAYERS]
    if bad or not names:
        raise ValueError(f"--mechanism-sublayers: expected a comma-separated subset of "
                         f"{', '.join(SELF_ATTENTION_SUBLAYERS)}, got {spec!r}")
    return tuple(dict.fromkeys(names))


@dataclass
class MaskedConfig(CalibrationConfig, DiffWinConfig, LocalnessConfig, MANConfig):
    """Every family's options; every mechanism off by default (a Transformer)."""

    encoder_sublayers: str = default_changed(MANConfig, "encoder_sublayers", "san,ffn")
    decoder_sublayers: str = default_changed(MANConfig, "decoder_sublayers", "san,cross,ffn")
    localness_attention_types: str = default_changed(LocalnessConfig, "localness_attention_types", "")
    diffwin_preset: ChoiceEnum(list(DIFFWIN_PRESETS)) = default_changed(DiffWinConfig, "diffwin_preset", "none")
    calibration_layers: str = field(
        default="",
        metadata={"help": "a LIST of 0-based decoder layers whose cross-attention is calibrated (as "
                  "transformer_calibrated's, which calibrates every layer: 'all'); '' for none. Trains with "
                  f"--criterion {JOINT_CRITERION}",
                  VALID: Parsed(parse_layer_spec, "comma-separated 0-based layer indices, 'all', or '' (none)")},
    )
    mechanism_sublayers: str = field(
        default=",".join(SELF_ATTENTION_SUBLAYERS),
        metadata={"help": "which self-attention sublayers of a layer take the layer's localness, relative "
                  "positions and windows: a subset of dman, san, sman1, sman2 (default: each of them; "
                  "'san' leaves MAN's DMAN / SMAN sublayers as the paper's)",
                  VALID: Parsed(parse_mechanism_sublayers, "comma-separated subset of "
                                + ", ".join(SELF_ATTENTION_SUBLAYERS))},
    )


MASKED_DEFAULTS = MaskedConfig()


@register_family("transformer_masked")
class TransformerMaskedModel(TransformerMANModel):
    """MAN's sublayers with localness, relative positions, windows and calibration on any attention."""

    config = MaskedConfig
    sizes = fairseq_sizes(("small", "base", "big"))

    @classmethod
    def fill_defaults(cls, args):
        # diffwin's preset fills its per-attention options first (none unless one is named)
        if getattr(args, "diffwin_preset", None) is None:
            args.diffwin_preset = MASKED_DEFAULTS.diffwin_preset
        diffwin_base_architecture(args)
        super().fill_defaults(args)

    @classmethod
    def calibrated_layers(cls, args):
        return parse_layer_set(args.calibration_layers, stack_depths(args)[1], "--calibration-layers")

    @classmethod
    def check(cls, args):
        super().check(args)
        criterion = getattr(args, "criterion", None)  # what fairseq-train trains with (absent when built by hand)
        if cls.calibrated_layers(args):
            refuse_activation_checkpointing(args, "--calibration-layers does not work with --checkpoint-activations")
            if isinstance(criterion, str) and criterion != JOINT_CRITERION:
                raise PluginOptionError(f"--calibration-layers trains with --criterion {JOINT_CRITERION} (its mask "
                                        f"perturbation model learns only from that joint loss); got --criterion {criterion}")
        elif criterion == JOINT_CRITERION:
            raise PluginOptionError(f"--criterion {JOINT_CRITERION} needs a calibrated cross-attention "
                                    "(--calibration-layers, e.g. 'all')")

    @classmethod
    def mechanism_specs(cls, args) -> Dict[str, Mapping]:
        """{mechanism: its family's plan specs} for the mechanisms the options turn on."""
        specs = {"localness": TransformerLocalnessModel.attention_specs(args)}
        if any(str(getattr(args, f"diffwin_{side}")) != "none" for side in ("encoder", "decoder", "cross")):
            specs["diffwin"] = TransformerDiffWinModel.attention_specs(args)
        layers = cls.calibrated_layers(args)
        if layers:
            every = TransformerCalibratedModel.attention_specs(args)
            specs["calibration"] = {key: spec for key, spec in every.items() if key[1] in layers}
        return specs

    @classmethod
    def make_plan(cls, args):
        man = super().make_plan(args)
        mechanism_sublayers = parse_mechanism_sublayers(args.mechanism_sublayers)
        by_mechanism = cls.mechanism_specs(args)
        specs: Dict[Tuple[str, int], Tuple] = {}
        for mechanism, family in MECHANISMS.items():
            for key, spec in by_mechanism.get(mechanism, {}).items():
                specs[key] = specs.get(key, ()) + ((family, spec),)
        for (kind, layer), entries in specs.items():
            owners = [mechanism_name(f) for f, _ in entries if owns_attention_class(f)]
            if len(owners) > 1:
                raise PluginOptionError(f"{kind} layer {layer}: {' and '.join(owners)} each bring their own "
                                        "attention class; one attention cannot take both")
        sublayers = {ENCODER_SELF: man.encoder_sublayers, DECODER_SELF: man.decoder_sublayers}
        for kind, names in sublayers.items():
            if any(k == kind for k, _ in specs) and not set(names) & set(mechanism_sublayers):
                side = kind.split("_")[0]
                raise PluginOptionError(f"--mechanism-sublayers {args.mechanism_sublayers}: no sublayer of "
                                        f"--{side}-sublayers {getattr(args, f'{side}_sublayers')} takes the "
                                        f"mechanisms asked for on {kind}")
        # the Transformer's order takes fairseq's layer form (man_layers False), as the families' archs
        plan = ComposedPlan(encoder_sublayers=man.encoder_sublayers, decoder_sublayers=man.decoder_sublayers,
                            mechanism_sublayers=mechanism_sublayers, specs=specs)
        log_plan(plan)
        return plan

    @classmethod
    def is_default(cls, args, dest, value):
        """The option's own default, or the value its diffwin preset fills in."""
        return super().is_default(args, dest, value) or preset_fills(args, dest, value)

    @classmethod
    def inert_options(cls, args, plan):
        inert = super().inert_options(args, plan)  # MAN's: no dman / sman2 sublayer
        inert.update(TransformerLocalnessModel.inert_options(args, plan))
        if not str(args.localness_attention_types).strip():
            inert["localness_layers"] = "--localness-attention-types is empty (localness is off)"
        inert.update(TransformerDiffWinModel.inert_options(args, plan))
        if plan.of(TransformerCalibratedModel):
            inert.update(TransformerCalibratedModel.inert_options(args, plan))
        else:
            inert.update({dest: "no cross-attention is calibrated (--calibration-layers)"
                          for dest in ("calibration_fusion", "calibration_lambda", "calibration_anneal_steps")})
        if not any(kind != CROSS for kind, _ in plan.specs):
            inert["mechanism_sublayers"] = "no self-attention takes localness, relative positions or a window"
        return inert

    # the families' model methods the composed model needs as they are
    set_beam_size = TransformerDiffWinModel.set_beam_size
    perturbation_parameters = TransformerCalibratedModel.perturbation_parameters


def mechanism_name(family) -> str:
    return next(name for name, f in MECHANISMS.items() if f is family)


def log_plan(plan: ComposedPlan) -> None:
    """One line per attention type: its layers and their mechanisms (beside each layer's MAN sublayers)."""
    for kind in ATTENTION_TYPES:
        layers = sorted(layer for k, layer in plan.specs if k == kind)
        if layers:
            what = "; ".join(f"{layer}: " + " + ".join(describe(f, spec) for f, spec in plan.specs[kind, layer])
                             for layer in layers)
            logger.info("transformer_masked %s layers %s", kind, what)


def describe(family, spec) -> str:
    """A plan entry's mechanism in the start-up log."""
    mechanism = mechanism_name(family)
    if mechanism == "localness":
        parts = ([f"localness({spec.window})"] if spec.window is not None else []) + \
                ([f"relative positions(K={spec.max_relative_position})"] if spec.max_relative_position else [])
        return " + ".join(parts)
    if mechanism == "diffwin":
        return f"{spec.mode}({spec.mask})"
    if mechanism == "calibration":
        return f"calibration({spec.fusion})"
    return mechanism
