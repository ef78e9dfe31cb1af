"""The one encoder/decoder wiring of every family: fairseq's Transformer whose layers and attentions
follow a :class:`ComposedPlan` (docs/model-families.md#combining-the-families).

The plan holds each side's sublayer order and, per ``(attention type, layer)``, the mechanisms of
that attention: ``((family, its spec), ...)``, each family turning its spec into modules
(:meth:`BiasedTransformerModel.attention_extras`, or :meth:`~BiasedTransformerModel.attention_module`
for another attention class). A side takes

* fairseq's layer form (:class:`BiasedEncoderLayer` / :class:`BiasedDecoderLayer`: parameters
  ``self_attn``, ``encoder_attn``, ``fc1``, ...) when its order is the Transformer's (``san,ffn`` /
  ``san,cross,ffn``), as the localness, differentiable-window and calibration families always have;
* MAN's layer form (:class:`~man_fairseq.modules.man_layers.MANLayer`: ``blocks.i`` /
  ``sublayer_norms.i``) for any other order, and always for MAN's own archs (``man_layers``).

A family (see :mod:`.family`) is a subclass of :class:`BiasedTransformerModel` that makes the plan
(:meth:`~.family.PluginModel.make_plan`; a family with one mechanism declares its specs,
:meth:`BiasedTransformerModel.attention_specs`), and nothing else about the layers.
"""

import functools
import itertools
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

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

from ..modules.biased_attention import BiasedMultiheadAttention
from ..modules.combined_mask import combine
from ..modules.man_layers import SELF_ATTENTION_SUBLAYERS, AttentionFactory, MANDecoderLayer, MANEncoderLayer
from ..plugin_options import PluginOptionError
from .family import CROSS, DECODER_SELF, ENCODER_SELF, Plan, PluginModel

# the sublayer orders of fairseq's Transformer layers
TRANSFORMER_SUBLAYERS = {ENCODER_SELF: ("san", "ffn"), DECODER_SELF: ("san", "cross", "ffn")}


def wrap_layer(layer: nn.Module, cfg) -> nn.Module:
    """Activation checkpointing and FSDP wrapping exactly as fairseq's encoder/decoder do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


# ---- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComposedPlan(Plan):
    """Each side's sublayers, and per (attention type, 0-based layer) the mechanisms of that attention:
    ``((family, its spec), ...)`` in the order their biases add and their transforms apply."""

    encoder_sublayers: Tuple[str, ...] = TRANSFORMER_SUBLAYERS[ENCODER_SELF]
    decoder_sublayers: Tuple[str, ...] = TRANSFORMER_SUBLAYERS[DECODER_SELF]
    # the self-attention sublayers of a MAN layer that take the layer's self-attention mechanisms
    mechanism_sublayers: Tuple[str, ...] = SELF_ATTENTION_SUBLAYERS
    specs: Mapping[Tuple[str, int], Tuple[Tuple[type, object], ...]] = field(default_factory=dict)
    # MAN's archs: MAN's layer form whatever the order (their parameters were always blocks.i)
    man_layers: bool = False

    def entries(self, kind: str, layer_idx: int) -> Tuple[Tuple[type, object], ...]:
        return self.specs.get((kind, layer_idx), ())

    def of(self, family: type) -> Dict[Tuple[str, int], object]:
        """{(attention type, layer): spec} of the entries of ``family``."""
        return {key: spec for key, entries in self.specs.items() for f, spec in entries if f is family}

    def man_form(self, side_kind: str) -> bool:
        """Whether the layers of ``side_kind`` (ENCODER_SELF / DECODER_SELF) take MAN's layer form."""
        sublayers = self.encoder_sublayers if side_kind == ENCODER_SELF else self.decoder_sublayers
        return self.man_layers or tuple(sublayers) != TRANSFORMER_SUBLAYERS[side_kind]


def owns_attention_class(family) -> bool:
    """Whether ``family`` builds its attention with a class of its own (relative positions)."""
    return family.attention_module.__func__ is not BiasedTransformerModel.attention_module.__func__


def build_attention(plan: ComposedPlan, side_kind: str, layer_idx: int, cfg, name: str, kwargs: dict):
    """The attention of sublayer ``name`` of layer ``layer_idx``: the core's arguments ``kwargs``
    (a MAN sublayer's own mask as ``bias_module``) and the plan's mechanisms, their modules built in
    the plan's order before the attention (the order parameters are initialised in)."""
    kind = CROSS if name == "cross" else side_kind
    takes = name == "cross" or name in plan.mechanism_sublayers
    entries = plan.entries(kind, layer_idx) if takes else ()
    if not entries:
        return BiasedMultiheadAttention(**kwargs)
    own = kwargs.pop("bias_module", None)
    biases, transforms = ([own] if own is not None else []), []
    for family, spec in entries:
        bias, transform = family.attention_extras(spec, kind, cfg)
        biases += [bias] if bias is not None else []
        transforms += [transform] if transform is not None else []
    kwargs["bias_module"], kwargs["post_softmax"] = combine(biases, transforms)
    # at most one mechanism of an entry brings its own attention class (checked when the plan is made)
    for family, spec in entries:
        if owns_attention_class(family):
            return family.attention_module(spec, kind, cfg, **kwargs)
    return BiasedMultiheadAttention(**kwargs)


def fairseq_layer_arguments(kind: str, cfg, attention_backend: str) -> dict:
    """The core's arguments for the attention of type ``kind`` of a fairseq-form layer."""
    side = cfg.encoder if kind == ENCODER_SELF else cfg.decoder
    kv_dim = cfg.encoder.embed_dim if kind == CROSS else None
    return dict(
        embed_dim=side.embed_dim, num_heads=side.attention_heads, kdim=kv_dim, vdim=kv_dim,
        dropout=cfg.attention_dropout, self_attention=kind != CROSS, encoder_decoder_attention=kind == CROSS,
        # MAN's option (the composed arch); absent for the families that do not have it
        head_activation=str(getattr(cfg, "attention_head_activation", None) or "none"),
        attention_backend=attention_backend, q_noise=cfg.quant_noise.pq, qn_block_size=cfg.quant_noise.pq_block_size,
    )


# ---- fairseq's layer form ----------------------------------------------------------------------

# Until the families became presets (issue 78), the composed arch built a side on the Transformer's
# order in MAN's layer form: its checkpoints' keys of such a layer, renamed to fairseq's (the
# arithmetic of the two forms is the same)
MAN_FORM_KEYS = {
    ENCODER_SELF: {"blocks.0.": "self_attn.", "sublayer_norms.0.": "self_attn_layer_norm.",
                   "blocks.1.": "", "sublayer_norms.1.": "final_layer_norm."},
    DECODER_SELF: {"blocks.0.": "self_attn.", "sublayer_norms.0.": "self_attn_layer_norm.",
                   "blocks.1.": "encoder_attn.", "sublayer_norms.1.": "encoder_attn_layer_norm.",
                   "blocks.2.": "", "sublayer_norms.2.": "final_layer_norm."},
}


def rename_man_form_keys(state_dict, name: str, side_kind: str) -> None:
    """Rename, in place, the MAN-form keys of the fairseq-form layer ``name`` (MAN_FORM_KEYS)."""
    for key in [k for k in state_dict if k.startswith(f"{name}.blocks.") or k.startswith(f"{name}.sublayer_norms.")]:
        rest = key[len(name) + 1:]
        old = next((o for o in MAN_FORM_KEYS[side_kind] if rest.startswith(o)), None)
        if old is not None:
            state_dict[f"{name}.{MAN_FORM_KEYS[side_kind][old]}{rest[len(old):]}"] = state_dict.pop(key)


class BiasedEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, build_attention: AttentionFactory, attention_backend: str, return_fc=False):
        # set before nn.Module.__init__ runs build_self_attention (plain attributes are fine)
        self._build_attention = build_attention
        self._attention_backend = attention_backend
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return self._build_attention("san", fairseq_layer_arguments(ENCODER_SELF, cfg, self._attention_backend))

    def upgrade_state_dict_named(self, state_dict, name):
        rename_man_form_keys(state_dict, name, ENCODER_SELF)
        super().upgrade_state_dict_named(state_dict, name)


class BiasedDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, build_attention: AttentionFactory, attention_backend: str, no_encoder_attn=False):
        self._build_attention = build_attention
        self._attention_backend = attention_backend
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if cfg.cross_self_attention:
            raise PluginOptionError("--cross-self-attention is not supported by the plugin's models")
        if add_bias_kv or add_zero_attn:
            raise ValueError("add_bias_kv / add_zero_attn are not supported")
        attention = self._build_attention("san", fairseq_layer_arguments(DECODER_SELF, cfg, self._attention_backend))
        attention.causal_attn_mask = True  # the decoder passes it fairseq's future mask only
        return attention

    def build_encoder_attention(self, embed_dim, cfg):
        return self._build_attention("cross", fairseq_layer_arguments(CROSS, cfg, self._attention_backend))

    def upgrade_state_dict_named(self, state_dict, name):
        """Called on load by fairseq's model for every module that has it."""
        rename_man_form_keys(state_dict, name, DECODER_SELF)


# ---- the encoder and decoder -------------------------------------------------------------------


class ComposedEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, plan: ComposedPlan):
        # read by build_encoder_layer, which the base __init__ calls
        self.plan = plan
        self._layer_ids = itertools.count()
        super().__init__(cfg, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        plan = self.plan
        build = functools.partial(build_attention, plan, ENCODER_SELF, next(self._layer_ids), cfg)
        if plan.man_form(ENCODER_SELF):
            layer = MANEncoderLayer(cfg, plan.encoder_sublayers, plan.attention_backend, return_fc=self.return_fc,
                                    build_attention=build)
        else:
            layer = BiasedEncoderLayer(cfg, build, plan.attention_backend, return_fc=self.return_fc)
        return wrap_layer(layer, cfg)


class ComposedDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, plan: ComposedPlan, no_encoder_attn=False):
        self.plan = plan
        self._layer_ids = itertools.count()
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        plan = self.plan
        build = functools.partial(build_attention, plan, DECODER_SELF, next(self._layer_ids), cfg)
        if plan.man_form(DECODER_SELF):
            layer = MANDecoderLayer(cfg, plan.decoder_sublayers, plan.attention_backend,
                                    no_encoder_attn=no_encoder_attn, build_attention=build)
        else:
            layer = BiasedDecoderLayer(cfg, build, plan.attention_backend, no_encoder_attn=no_encoder_attn)
        return wrap_layer(layer, cfg)


class BiasedTransformerModel(PluginModel, TransformerModel):
    """fairseq's ``transformer`` whose layers and attentions follow a :class:`ComposedPlan`.

    Not registered itself; a family subclass declares its options (``config``, ``sizes``), makes
    the plan (by default its one mechanism: :meth:`attention_specs`, ``(attention type, layer) ->
    spec``) and turns a spec into modules (:meth:`attention_extras`, or :meth:`attention_module` for
    another attention class).
    """

    @classmethod
    def attention_specs(cls, args) -> Dict[Tuple[str, int], object]:
        """{(attention type, 0-based layer): the family's spec of that attention}; absent: plain."""
        return {}

    @classmethod
    def make_plan(cls, args) -> ComposedPlan:
        return ComposedPlan(specs={key: ((cls, spec),) for key, spec in cls.attention_specs(args).items()})

    @classmethod
    def attention_extras(cls, spec, kind: str, cfg) -> Tuple[Optional[nn.Module], Optional[nn.Module]]:
        """(bias_module, post_softmax) of one attention whose plan entry is ``spec``."""
        return None, None

    @classmethod
    def attention_module(cls, spec, kind: str, cfg, **kwargs) -> nn.Module:
        """The attention of a plan entry ``spec``, given the core's arguments."""
        return BiasedMultiheadAttention(**kwargs)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return ComposedEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens, cls.plan_in_build())

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return ComposedDecoder(cfg, tgt_dict, embed_tokens, cls.plan_in_build(), no_encoder_attn=cfg.no_cross_attention)
