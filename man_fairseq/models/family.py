"""The one template of the plugin's model families.

A family is a fairseq model class (a subclass of :class:`PluginModel`) that declares

* ``config``: the dataclass of its options (defaults, help, valid values);
* ``sizes``: one :class:`Size` per arch; :func:`register_family` registers the model and
  generates its ``register_model_architecture`` functions from them;
* :meth:`PluginModel.check`: checks between options beyond each option's own valid values;
* :meth:`PluginModel.make_plan`: the options parsed once into a :class:`Plan` the layers read
  (:class:`~.biased_transformer.ComposedPlan`: each side's sublayers, which attention of which
  layer gets which mechanisms; a family of one mechanism declares only the specs of its
  attentions, ``attention_specs``); the template adds the ``--attention-backend`` every attention
  is constructed with, so no family has to;
* :meth:`PluginModel.inert_options`: the options the plan leaves unread, each warned about when
  its value is not the default (a user's option that silently changes nothing).

:meth:`PluginModel.build_model` is the wiring every family shares: as_namespace → the family's
option defaults → the declared checks → :meth:`~PluginModel.check` → :meth:`~PluginModel.make_plan`
→ the warnings of :meth:`~PluginModel.inert_options` → fairseq's ``build_model``, whose
``build_encoder`` / ``build_decoder`` (one encoder/decoder wiring for every family,
:mod:`.biased_transformer`) read the plan with :meth:`PluginModel.plan_in_build`.
"""

import dataclasses
import logging
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, ClassVar, Dict, Mapping, Optional, Tuple

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)

from ..modules.attention_backend import ATTENTION_BACKENDS
from ..plugin_options import PluginOptionError, add_option_args, as_namespace, check_options, option_flag

logger = logging.getLogger(__name__)

# the three places an attention sits in an encoder-decoder Transformer
ENCODER_SELF, DECODER_SELF, CROSS = "encoder_self", "decoder_self", "cross"
ATTENTION_TYPES = (ENCODER_SELF, DECODER_SELF, CROSS)


@dataclass
class AttentionBackendConfig(FairseqDataclass):
    """The option every family shares (``--attention-backend``)."""

    attention_backend: ChoiceEnum(ATTENTION_BACKENDS) = field(
        default="auto",
        metadata={"help": "attention kernel: auto (fused SDPA with a fixed kernel policy: memory-efficient "
                  "whenever a mask is present; localness in float32/64 takes its Gaussian bias as extra "
                  "query/key columns, docs/localness.md), sdpa (PyTorch's dispatcher, no cuDNN with a float mask), "
                  "flex (FlexAttention for DMAN / localness / static windows / causal / padding; auto for "
                  "other biases; relative positions, calibrated cross-attention and returned weights always "
                  "take the explicit path) or explicit (the written-out softmax); see "
                  "man_fairseq/modules/attention_backend.py. At generation: "
                  "--model-overrides \"{'attention_backend': 'flex'}\""},
    )


def attention_backend_of(args) -> str:
    """``--attention-backend`` of ``args`` (``auto`` when absent: checkpoints saved before it)."""
    backend = str(getattr(args, "attention_backend", None) or "auto")
    if backend not in ATTENTION_BACKENDS:
        raise PluginOptionError(
            f"--attention-backend: unknown {backend!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
    return backend


def fill_option_defaults(args, config) -> None:
    """Give ``args`` every option of the dataclass ``config``, and the ``--attention-backend`` every
    family shares, that it lacks (or holds as None): a hydra config carries only the options its
    YAML names, a checkpoint only those its code knew, and fairseq keeps on the model's config only
    options present on ``args``.

    Choice options become plain strings: an Enum inside the checkpoint's Namespace would not
    load under torch's safe loading.
    """
    for defaults in (config, AttentionBackendConfig()):
        for f in dataclasses.fields(defaults):
            if f.name.startswith("_"):
                continue
            if getattr(args, f.name, None) is None:
                setattr(args, f.name, getattr(defaults, f.name))
            value = getattr(args, f.name)
            if isinstance(value, Enum):
                setattr(args, f.name, str(value))


def stack_depths(args) -> Tuple[int, int]:
    """(encoder layers, decoder layers) the model will have: fairseq's build_model cuts them to
    ``--encoder/decoder-layers-to-keep`` after the plan is made."""
    depths = []
    for side in ("encoder", "decoder"):
        keep = getattr(args, f"{side}_layers_to_keep", None)
        depths.append(len(keep.split(",")) if keep else getattr(args, f"{side}_layers"))
    return depths[0], depths[1]


# ---- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A family's options parsed once, at build; the layers read it and nothing else of the options."""

    # set by the template (:meth:`PluginModel.build_model`) from --attention-backend, for every family
    attention_backend: str = "auto"


# the plan of the build under way (fairseq calls build_encoder/build_decoder as classmethods with
# the options only; a plan on ``args`` would be pickled into the checkpoint)
_PLAN_IN_BUILD: ContextVar[Optional[Plan]] = ContextVar("man_fairseq_plan_in_build", default=None)


# ---- sizes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """One arch of a family: fairseq's arch function for the Transformer sizes, and this family's
    own values at this size (``values``), filled before fairseq's where the user gave none."""

    fairseq_arch: Callable
    doc: str
    values: Mapping[str, object] = field(default_factory=dict)


def fairseq_sizes(order=("base", "small", "big")) -> Dict[str, Size]:
    """The sizes of a family that adds nothing of its own at any size: fairseq's Transformer archs,
    in ``order`` (the order its archs are registered and listed in)."""
    sizes = {
        "base": Size(base_architecture, "WMT14 En-De base: fairseq's transformer_wmt_en_de (d=512, 8 heads, "
                     "FFN 2048, 6+6 layers)."),
        "small": Size(transformer_iwslt_de_en, "IWSLT size: fairseq's transformer_iwslt_de_en (d=512, 4 heads, "
                      "FFN 1024)."),
        "big": Size(transformer_vaswani_wmt_en_de_big, "WMT14 En-De big: fairseq's transformer_vaswani_wmt_en_de_big "
                    "(d=1024, 16 heads, FFN 4096, dropout 0.3)."),
    }
    return {name: sizes[name] for name in order}


_ABSENT = object()


def arch_function(family: type, size: Size, name: str) -> Callable:
    """The ``register_model_architecture`` function of ``family`` at ``size``: the family's values
    of that size and its defaults (:meth:`PluginModel.fill_size`), then fairseq's sizes."""

    def arch(args):
        family.fill_size(args, size)
        size.fairseq_arch(args)

    arch.__name__ = arch.__qualname__ = name
    arch.__doc__ = size.doc
    return arch


def register_family(model_name: str, default_size: str = "base"):
    """Class decorator: register the model ``model_name``, an arch ``{model_name}_{size}`` per row of
    its ``sizes`` (in their order) and ``model_name`` itself for ``default_size``."""

    def register(cls):
        register_model(model_name)(cls)
        for size_name, size in cls.sizes.items():
            arch = f"{model_name}_{size_name}"
            register_model_architecture(model_name, arch)(arch_function(cls, size, arch))
        register_model_architecture(model_name, model_name)(
            arch_function(cls, cls.sizes[default_size], model_name))
        return cls

    return register


# ---- the template ------------------------------------------------------------------------------


class PluginModel:
    """What every family's model class shares; put it before fairseq's model class in the bases."""

    config: ClassVar[type] = None  # the FairseqDataclass of the family's options
    sizes: ClassVar[Dict[str, Size]] = {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_option_args(parser, cls.config())
        add_option_args(parser, AttentionBackendConfig())

    @classmethod
    def fill_size(cls, args, size: Size) -> None:
        """Fill ``size.values`` where ``args`` has none (fairseq's way: a value already there stays,
        even None, except for the family's own options, whose None is unset), then the family's
        option defaults. Runs at parse time and again when a checkpoint is loaded."""
        own = {f.name for f in dataclasses.fields(cls.config)}
        for option, value in size.values.items():
            current = getattr(args, option, _ABSENT)
            if current is _ABSENT or (option in own and current is None):
                setattr(args, option, value)
        cls.fill_defaults(args)

    @classmethod
    def fill_defaults(cls, args) -> None:
        """The family's option defaults where ``args`` has none (idempotent)."""
        fill_option_defaults(args, cls.config())

    @classmethod
    def check(cls, args) -> None:
        """Checks between options (each option's own valid values are checked already); raises
        PluginOptionError."""

    @classmethod
    def make_plan(cls, args) -> Plan:
        """The options parsed once into what the layers build. A layer option naming more layers
        than the model has is fitted here (:func:`~man_fairseq.plugin_options.fit_layers`), on
        ``args``, so the checkpoint records what was built. The template adds the attention backend."""
        return Plan()

    @classmethod
    def inert_options(cls, args, plan: Plan) -> Dict[str, str]:
        """{option dest: why the model of ``plan`` does not read it}."""
        return {}

    @classmethod
    def is_default(cls, args, dest: str, value) -> bool:
        """Whether ``value`` of option ``dest`` is one the option takes when the user gives none."""
        return str(value) == str(getattr(cls.config(), dest))

    @classmethod
    def warn_inert_options(cls, args, plan: Plan) -> None:
        """One warning per option given a value other than its default that changes nothing here
        (a warning, not an error: a checkpoint trained so must still load)."""
        for dest, why in cls.inert_options(args, plan).items():
            value = getattr(args, dest, None)
            if value is not None and not cls.is_default(args, dest, value):
                logger.warning("%s %s changes nothing: %s", option_flag(dest), value, why)

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)  # fairseq-hydra-train passes a DictConfig
        cls.fill_defaults(args)
        # fail at start-up, before any data is read and any layer is built
        check_options(args, cls.config)
        cls.check(args)
        plan = dataclasses.replace(cls.make_plan(args), attention_backend=attention_backend_of(args))
        cls.warn_inert_options(args, plan)
        token = _PLAN_IN_BUILD.set(plan)
        try:
            return super().build_model(args, task)
        finally:
            _PLAN_IN_BUILD.reset(token)

    @classmethod
    def plan_in_build(cls) -> Plan:
        plan = _PLAN_IN_BUILD.get()
        if plan is None:
            raise RuntimeError(f"{cls.__name__}: build the encoder and decoder through build_model "
                               "(it makes the plan the layers read)")
        return plan
