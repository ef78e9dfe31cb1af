"""Joint loss of attention calibration: one loss, one backward, exact routing
(docs/calibration.md#training-one-criterion-one-backward).

Two decoder passes per batch:

1. **calibrated pass** through the (possibly DDP-wrapped) model: ``L_NMT(a^comb)``. The
   calibration modules compute the mask from *detached* perturbation weights, so this term's
   gradient reaches only the NMT parameters theta (gate included) — and reaches them also
   through the mask's inputs ``q_t`` and ``K``, i.e. it is the exact partial derivative with
   theta_m held fixed.
2. **perturbation pass**: the decoder alone, on the calibrated pass's encoder output (detached),
   with every decoder parameter except theta_m replaced by a detached copy
   (``torch.func.functional_call`` on the unwrapped decoder): ``-L_NMT(a^p) + alpha ||1-m||_2``.
   Its gradient reaches only theta_m.

The returned loss is the sum of the two terms. Since each term is a function of only one
parameter group, a single ``backward()`` of the sum writes exactly ``dL_NMT(a^comb)/dtheta`` into
theta and exactly ``dL(theta_m)/dtheta_m`` into theta_m, and everything the trainer does to that
one loss stays correct: fp16/bf16 loss scaling (a common factor), ``--update-freq`` (gradients
accumulate), DDP (every parameter gets exactly one gradient in every backward, so
``find_unused_parameters`` is not needed; the gradient hooks of DDP sit on the parameters, so
the pass that bypasses the DDP wrapper still triggers them). Two ``torch.autograd.grad`` calls
per group would need the loss scaler and the DDP reducer to be bypassed by hand.

Units: fairseq sums losses over target tokens and divides gradients by the sample size, so the
mask penalty is summed over the real target tokens too: ``alpha * sum_t mean_{layer,head}
||1 - m_t||_2`` (the norm over the real source keys of query ``t``). ``loss`` in the logs is the
translation loss ``L_NMT(a^comb)`` (used for validation and the best checkpoint).
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics, utils
from fairseq.criterions import register_criterion
from fairseq.distributed import ModuleProxyWrapper
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from omegaconf import II
from torch import nn

from ..plugin_options import VALID, Number, PluginOptionError, add_option_args, check_options
from ..modules.calibration import PERTURBED, calibration_mode
from ..models.transformer_calibrated import JOINT_CRITERION


@dataclass
class CalibratedLabelSmoothedCrossEntropyCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    perturbation_weight: float = field(
        default=1.0,
        metadata={"help": "alpha of the perturbation objective -L_NMT(a^p) + alpha ||1-m||_2 "
                  "(larger: masks stay closer to 1, less is perturbed)", VALID: Number(0)},
    )
    # the model's --arch, read at start-up to refuse a model without calibration before any data
    # is loaded (argparse: fairseq copies args.arch here; hydra: interpolated from model._name).
    # No help text: fairseq then adds no second --arch to the command line.
    arch: Optional[str] = II("model._name")


logger = logging.getLogger(__name__)

PERTURBATION_WEIGHT = CalibratedLabelSmoothedCrossEntropyCriterionConfig.__dataclass_fields__[
    "perturbation_weight"].metadata[VALID]


def configured_arch(cfg) -> Optional[str]:
    """The --arch the criterion config carries, or None (a config built without one, e.g. by hand
    or from an older checkpoint whose interpolation cannot be resolved)."""
    try:
        arch = getattr(cfg, "arch", None)
    except Exception:  # omegaconf's interpolation errors when there is no model._name
        return None
    return str(arch) if isinstance(arch, str) and not arch.startswith("${") else None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The fairseq model inside DDP / fairseq's ModuleProxyWrapper."""
    # (ModuleProxyWrapper forwards attribute reads to the model, so test the type, not hasattr)
    while isinstance(model, (ModuleProxyWrapper, nn.parallel.DistributedDataParallel)) or (
        type(model).__name__.endswith("DistributedDataParallel") and isinstance(getattr(model, "module", None), nn.Module)
    ):
        model = model.module
    return model


@register_criterion(
    JOINT_CRITERION,  # the one criterion the calibrated models train with (their build refuses any other)
    dataclass=CalibratedLabelSmoothedCrossEntropyCriterionConfig,
)
class CalibratedLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0,
                 report_accuracy=False, perturbation_weight=1.0):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        problem = PERTURBATION_WEIGHT.problem(perturbation_weight)
        if problem:
            raise PluginOptionError(f"--perturbation-weight {perturbation_weight!r}: {problem}")
        self.perturbation_weight = perturbation_weight
        self.saturation = MaskSaturation()

    @classmethod
    def add_args(cls, parser):
        """fairseq's options of the dataclass, with the declared valid values checked by argparse."""
        add_option_args(parser, CalibratedLabelSmoothedCrossEntropyCriterionConfig(), delete_default=False)

    @classmethod
    def build_criterion(cls, cfg, task):
        """fairseq-train builds the model, then the criterion, then reads data: check here."""
        check_options(cfg, CalibratedLabelSmoothedCrossEntropyCriterionConfig,
                      base=LabelSmoothedCrossEntropyCriterionConfig)
        arch = configured_arch(cfg)
        if arch is not None:
            from fairseq.models import ARCH_MODEL_REGISTRY

            model_cls = ARCH_MODEL_REGISTRY.get(arch)
            # the composed arch calibrates where --calibration-layers says (checked when it is built)
            if model_cls is None or not hasattr(model_cls, "perturbation_parameters"):
                raise PluginOptionError(
                    f"--criterion {JOINT_CRITERION} needs a calibrated model "
                    f"(--arch transformer_calibrated_small/_base/_big, or transformer_masked_* with "
                    f"--calibration-layers), got --arch {arch}"
                )
        return super().build_criterion(cfg, task)

    def perturbation_loss(self, model, sample, encoder_out, reduce=True):
        """(-L_NMT(a^p) + alpha * penalty, L_NMT(a^p), nll(a^p), penalty, mean m over real keys).

        The decoder runs on the calibrated pass's encoder output, detached, with every decoder
        parameter except theta_m replaced by a detached copy: only theta_m gets gradients."""
        inner = unwrap_model(model)
        decoder = inner.decoder
        theta_m = {id(p) for p in inner.perturbation_parameters()}
        detached = {name: p.detach() for name, p in decoder.named_parameters() if id(p) not in theta_m}
        encoder_out = {k: [t.detach() if torch.is_tensor(t) else t for t in v] for k, v in encoder_out.items()}
        net_input = sample["net_input"]
        with calibration_mode(inner, PERTURBED) as cm:
            net_output = torch.func.functional_call(
                decoder, detached, args=(net_input["prev_output_tokens"],),
                kwargs={"encoder_out": encoder_out, "src_lengths": net_input["src_lengths"]},
            )
        p_loss, p_nll = self.compute_loss(inner, net_output, sample, reduce=reduce)

        target = inner.get_targets(sample, net_output)
        if self.ignore_prefix_size > 0:
            target = target[:, self.ignore_prefix_size:]
        real_tokens = target.ne(self.padding_idx)  # (B, T)
        # (layers, B, H, T) -> mean over layers and heads -> (B, T)
        norms = torch.stack([c["mask_norm"] for c in cm.captured]).mean(dim=(0, 2))
        norms = norms[:, self.ignore_prefix_size:]
        penalty = (norms * real_tokens).sum()
        # mean m over the real keys of real queries, for the logs only
        with torch.no_grad():
            m_mean = torch.stack([c["m"].float().sum(-1).mean(1) for c in cm.captured]).mean(0)  # (B, T)
            src_len = sample["net_input"]["src_tokens"].ne(self.padding_idx).sum(-1, keepdim=True)
            m_mean = ((m_mean[:, self.ignore_prefix_size:] / src_len) * real_tokens).sum()
        objective = -p_loss + self.perturbation_weight * penalty
        return objective, p_loss, p_nll, penalty, m_mean

    def calibrated_pass(self, model, sample, reduce=True):
        """(net output, L_NMT(a^comb), nll, the encoder output) of the calibrated pass."""
        # keep the encoder output of the calibrated pass for the perturbation pass (saves an
        # encoder forward; detached there, so the encoder gets no gradient from it)
        captured = {}
        hook = unwrap_model(model).encoder.register_forward_hook(
            lambda module, args, out: captured.__setitem__("enc", out))
        try:
            net_output = model(**sample["net_input"])
        finally:
            hook.remove()
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        return net_output, loss, nll_loss, captured["enc"]

    def forward(self, model, sample, reduce=True):
        inner = unwrap_model(model)
        if not hasattr(inner, "perturbation_parameters"):
            raise PluginOptionError("calibrated_label_smoothed_cross_entropy needs --arch transformer_calibrated_* "
                                    "(or transformer_masked_* with --calibration-layers)")
        if getattr(inner.decoder, "adaptive_softmax", None) is not None:
            raise PluginOptionError("calibrated_label_smoothed_cross_entropy does not support --adaptive-softmax-cutoff")
        net_output, loss, nll_loss, encoder_out = self.calibrated_pass(model, sample, reduce)
        objective, p_loss, p_nll, penalty, m_mean = self.perturbation_loss(model, sample, encoder_out, reduce)
        if model.training:
            self.saturation.observe(m_mean.detach() / max(sample["ntokens"], 1), self.perturbation_weight)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "perturbed_loss": p_loss.data,
            "perturbed_nll_loss": p_nll.data,
            "mask_penalty": penalty.data,
            "mask_mean": m_mean.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss + objective, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        if sample_size == 0 or ntokens == 0:
            return

        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        metrics.log_scalar("perturbed_loss", total("perturbed_loss") / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("perturbed_nll_loss", total("perturbed_nll_loss") / ntokens / math.log(2), ntokens, round=3)
        metrics.log_scalar("mask_penalty", total("mask_penalty") / ntokens, ntokens, round=3)
        metrics.log_scalar("mask_mean", total("mask_mean") / ntokens, ntokens, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


class MaskSaturation:
    """Warns once when the perturbation mask has stayed saturated at 1 for a whole window of training
    batches: then ``a^c = a e^(1-m)`` equals ``a`` and calibration reweights no source token
    (docs/calibration.md#when-the-mask-saturates). Early in training the attention is near uniform,
    perturbing it costs nothing, and the penalty alone drives m to 1 (on the Gigaword CPU study
    within 100 updates at every alpha tried); a small enough alpha lets the mask come back once the
    attention has formed (0.01 there after ~200 updates), hence a long window.

    The batch means stay on the device; one host sync per window."""

    window = 1000  # training batches
    threshold = 0.999  # mean m over the real keys: the calibrated weights within ~0.1 % of a

    def __init__(self):
        self.batches = 0
        self.lowest = None
        self.warned = False

    def observe(self, batch_mean_m, alpha) -> None:
        if self.warned:
            return
        self.lowest = batch_mean_m if self.lowest is None else torch.minimum(self.lowest, batch_mean_m)
        self.batches += 1
        if self.batches < self.window:
            return
        lowest = float(self.lowest)
        self.batches, self.lowest = 0, None
        if lowest >= self.threshold:
            self.warned = True
            logger.warning(
                f"calibration: the perturbation mask has saturated (mean m >= {self.threshold} over the real "
                f"source keys in each of the last {self.window} training batches): the calibrated weights "
                f"a*exp(1-m) equal the original attention, so calibration reweights no source token "
                f"(--perturbation-weight {alpha:g}; docs/calibration.md#when-the-mask-saturates)."
            )
