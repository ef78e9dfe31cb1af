"""Attention calibration of the encoder-decoder attention (docs/calibration.md#mask-calibrated-weights-and-fusion).

One :class:`CalibrationTransform` is the ``post_softmax`` of the cross-attention of one decoder
layer. From the original attention weights ``a`` (B, H, T, S) it computes

* the **mask perturbation model** ``m = sigmoid(q_t W^Q (K W^K)^T / sqrt(d_k))`` with its own
  query/key projections per head (``q_t``: the attention's query input, ``K``: the encoder
  output); pad keys get ``m = 0``;
* the **perturbed** weights ``a^p = m*a + (1-m)*mu0`` (``mu0`` uniform over the real keys), used
  only by the perturbation pass of the joint criterion;
* the **calibrated** weights ``a^c = a * exp(1-m)`` and their fusion with ``a``:
  ``fixed``: ``a + lambda a^c`` (the authors' code, which gave the paper's Fixed row; like
  anneal and gate it is not renormalised), ``fixed_softmax``: ``softmax(a + lambda a^c)`` over
  the real keys (the formula as printed in the paper: a softmax over values in [0, 1+lambda e]
  flattens the attention towards uniform), ``anneal``: ``g(s) a + (1-g(s)) a^c`` with
  ``g(s) = exp(-s/anneal_steps)``, ``gate``: ``g a + (1-g) a^c`` with
  ``g = sigmoid(q_t W_g + b_g)`` per head.

Gradient routing (the perturbation parameters are trained only by the perturbation objective)
is done here for one direction: in ``calibrated`` mode the mask is computed from *detached*
perturbation weights, so ``L_NMT(a^comb)`` never reaches them, while its gradient through the
mask's inputs (``q_t``, ``K``, which are functions of the NMT parameters) is kept, exactly as a
partial derivative w.r.t. the NMT parameters with the perturbation parameters held fixed. The
other direction (NMT parameters held fixed in the perturbation pass) is done by the criterion.
"""

import math
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor, nn

from .biased_attention import AttentionContext

FUSIONS = ("fixed", "fixed_softmax", "anneal", "gate")
CALIBRATED, PERTURBED = "calibrated", "perturbed"


class MaskPerturbation(nn.Module):
    """The perturbation parameters ``theta_m`` of one layer: per-head W^Q, W^K (with biases)."""

    def __init__(self, query_dim: int, key_dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(query_dim, num_heads * head_dim)
        self.k_proj = nn.Linear(key_dim, num_heads * head_dim)
        # same initialisation as fairseq's attention projections
        for proj in (self.q_proj, self.k_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
            nn.init.zeros_(proj.bias)

    def project(self, proj: nn.Linear, x: Tensor, detach: bool) -> Tensor:
        """(L, B, C) -> (B, H, L, D)."""
        weight, bias = proj.weight, proj.bias
        if detach:
            weight, bias = weight.detach(), bias.detach()
        y = F.linear(x, weight.to(x.dtype), bias.to(x.dtype))
        length, bsz = x.shape[0], x.shape[1]
        return y.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)


@with_incremental_state
class CalibrationTransform(nn.Module):
    """post-softmax transform of one cross-attention: ``(a, ctx) -> fused calibrated weights``."""

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        num_heads: int,
        fusion: str = "fixed",
        calibration_lambda: float = 0.1,
        anneal_steps: float = 100000.0,
    ):
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"unknown --calibration-fusion {fusion!r}; choose one of {list(FUSIONS)}")
        if not math.isfinite(calibration_lambda):
            raise ValueError("--calibration-lambda must be finite")
        if not anneal_steps > 0:
            raise ValueError("--calibration-anneal-steps must be > 0")
        if query_dim % num_heads != 0:
            raise ValueError("decoder embed dim must be divisible by the number of heads")
        self.num_heads = num_heads
        self.head_dim = query_dim // num_heads
        self.fusion = fusion
        self.calibration_lambda = float(calibration_lambda)
        self.anneal_steps = float(anneal_steps)
        self.perturbation = MaskPerturbation(query_dim, key_dim, num_heads, self.head_dim)
        if fusion == "gate":
            # g = sigmoid(q_t W_g + b_g): one gate per head (NMT parameter, not theta_m)
            self.gate = nn.Linear(query_dim, num_heads)
            nn.init.xavier_uniform_(self.gate.weight)
            nn.init.zeros_(self.gate.bias)
        else:
            self.gate = None
        # Trainer's update count s for the anneal schedule. A persistent int64 buffer: it is
        # saved in checkpoints (fairseq-generate uses the final s without a trainer), and
        # model.half() does not touch integer buffers (s > 65504 would overflow fp16).
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        self.mode = CALIBRATED
        # when a list, forward appends a dict of intermediate tensors (criterion / export)
        self.capture: Optional[List[Dict[str, Tensor]]] = None

    def extra_repr(self) -> str:
        return (
            f"fusion={self.fusion}, lambda={self.calibration_lambda}, anneal_steps={self.anneal_steps}"
        )

    # fairseq's BaseFairseqModel.set_num_updates forwards the trainer's count to every
    # submodule that has this method: every update and after a checkpoint is loaded.
    def set_num_updates(self, num_updates: int):
        self.num_updates.fill_(int(num_updates))

    def anneal_gamma(self) -> Tensor:
        return torch.exp(-self.num_updates.double() / self.anneal_steps)

    # ----- mask perturbation model -------------------------------------------------------
    def mask_keys(self, ctx: AttentionContext, detach: bool) -> Tensor:
        """K W^K as (B, H, S, D); cached for incremental decoding, where the core drops the
        raw encoder output after the first step (``ctx.key is None``)."""
        if ctx.key is not None:
            keys = self.perturbation.project(self.perturbation.k_proj, ctx.key, detach)
            if ctx.incremental_state is not None:
                self.set_incremental_state(ctx.incremental_state, "mask_key", {"mask_key": keys})
            return keys
        cached = self.get_incremental_state(ctx.incremental_state, "mask_key") if ctx.incremental_state is not None else None
        if cached is None or cached.get("mask_key") is None:
            raise RuntimeError("calibration: no encoder keys and no cached mask keys")
        return cached["mask_key"]

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        cached = self.get_incremental_state(incremental_state, "mask_key")
        if cached is None or cached.get("mask_key") is None:
            return incremental_state
        if cached["mask_key"].size(0) == new_order.size(0):
            # no sentence finished: beams moved within their sentences, whose encoder keys they
            # share (fairseq's MultiheadAttention leaves its cross-attention cache alone here too)
            return incremental_state
        # index_select rejects an out-of-range order itself (no host sync on new_order here)
        self.set_incremental_state(
            incremental_state, "mask_key",
            {"mask_key": cached["mask_key"].index_select(0, new_order)},
        )
        return incremental_state

    def mask(self, ctx: AttentionContext, detach: bool) -> Tensor:
        """m (B, H, T, S); 0 at pad keys."""
        queries = self.perturbation.project(self.perturbation.q_proj, ctx.query, detach)
        keys = self.mask_keys(ctx, detach)
        logits = torch.matmul(queries, keys.transpose(-1, -2)) / math.sqrt(self.head_dim)
        m = torch.sigmoid(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits)
        if ctx.key_padding_mask is not None:
            m = m.masked_fill(ctx.key_padding_mask[:, None, None, :], 0.0)
        return m

    # ----- the transform --------------------------------------------------------------------
    def forward(self, probs: Tensor, ctx: AttentionContext) -> Tensor:
        out_dtype = probs.dtype
        # low precision: do the arithmetic in float32 like the softmax
        a = probs.float() if probs.dtype in (torch.float16, torch.bfloat16) else probs
        pad = ctx.key_padding_mask  # (B, S) bool or None
        if self.mode == PERTURBED:
            m = self.mask(ctx, detach=False)
            if pad is None:
                mu0 = torch.full_like(a, 1.0 / a.size(-1))
            else:
                real = (~pad).to(a.dtype)[:, None, None, :]
                mu0 = (real / real.sum(-1, keepdim=True)).expand_as(a)
            out = m * a + (1 - m) * mu0
            if self.capture is not None:
                one_minus = 1 - m
                if pad is not None:
                    one_minus = one_minus.masked_fill(pad[:, None, None, :], 0.0)
                # ||1 - m_t||_2 over the real keys, per (batch, head, query)
                self.capture.append({"m": m, "mask_norm": torch.linalg.vector_norm(one_minus, dim=-1)})
            return out.to(out_dtype)
        if self.mode != CALIBRATED:
            raise ValueError(f"unknown calibration mode {self.mode!r}")

        m = self.mask(ctx, detach=True)
        calibrated = a * torch.exp(1 - m)
        if self.fusion in ("fixed", "fixed_softmax"):
            fused = a + self.calibration_lambda * calibrated
            if self.fusion == "fixed_softmax":
                if pad is not None:
                    # pads must stay at weight 0 after the softmax
                    fused = fused.masked_fill(pad[:, None, None, :], float("-inf"))
                fused = F.softmax(fused, dim=-1)
        elif self.fusion == "anneal":
            gamma = self.anneal_gamma().to(a.dtype)
            fused = gamma * a + (1 - gamma) * calibrated
        else:  # gate
            g = torch.sigmoid(F.linear(ctx.query, self.gate.weight.to(ctx.query.dtype), self.gate.bias.to(ctx.query.dtype)))
            g = g.permute(1, 2, 0).unsqueeze(-1).to(a.dtype)  # (T, B, H) -> (B, H, T, 1)
            fused = g * a + (1 - g) * calibrated
        if self.capture is not None:
            self.capture.append({"m": m.detach(), "attn": a.detach(), "calibrated": fused.detach()})
        return fused.to(out_dtype)


def calibration_modules(model: nn.Module) -> List[CalibrationTransform]:
    return [m for m in model.modules() if isinstance(m, CalibrationTransform)]


class calibration_mode:
    """Context manager: put every CalibrationTransform of ``model`` in ``mode`` and collect the
    captured tensors of each layer (in forward order) in ``self.captured``."""

    def __init__(self, model: nn.Module, mode: str = CALIBRATED, capture: bool = True):
        self.modules = calibration_modules(model)
        self.mode = mode
        self.capture = capture
        self.captured: List[Dict[str, Tensor]] = []

    def __enter__(self):
        self.saved = [(m.mode, m.capture) for m in self.modules]
        for m in self.modules:
            m.mode = self.mode
            m.capture = self.captured if self.capture else None
        return self

    def __exit__(self, *exc):
        for m, (mode, capture) in zip(self.modules, self.saved):
            m.mode, m.capture = mode, capture
        return False
