"""Several mechanisms on one attention (the composed arch ``transformer_masked``, docs/model-families.md).

The core (:class:`~.biased_attention.BiasedMultiheadAttention`) takes one bias module and one
post-softmax transform. Several mechanisms on one attention become one of each:

* :class:`BiasSum`: the additive logit biases (DMAN, static windows, localness, additive windows)
  summed, so the core computes ``softmax(q k^T / sqrt(d) + b_1 + b_2 + ... + causal + padding)``;
* :class:`TransformChain`: the post-softmax transforms (multiplicative windows, calibration)
  applied one after the other, in the order given (the plan's: windows, then calibration).

:func:`combine` returns a lone module unchanged, so one mechanism on an attention builds the very
module (and parameter names) its family builds. A sum keeps what the core's kernel choice reads:
``flex_mods`` when every part has them (each part's score terms and masks, one after the other),
``can_mask_all_keys`` when any part may mask every key; it has no ``extended_query_key`` (the extra
query/key columns hold one Gaussian bias only) nor ``fused_bias_terms``, so a sum that learns takes
the fused CPU kernel with the whole bias's gradient (``fused_bias_grad.py``'s ``WholeBias``).
"""

from typing import List, Optional, Sequence

from torch import Tensor, nn

from . import flex_backend as flex
from .biased_attention import AttentionContext


class BiasSum(nn.Module):
    """The sum of several additive logit biases, each broadcastable to (B, H, T, S)."""

    def __init__(self, biases: Sequence[nn.Module]):
        super().__init__()
        self.biases = nn.ModuleList(biases)
        # a hard window among the parts may leave a pad query no key (the core's dead-row fill)
        self.can_mask_all_keys = any(getattr(b, "can_mask_all_keys", False) for b in biases)

    def forward(self, ctx: AttentionContext) -> Tensor:
        total = None
        for bias in self.biases:
            part = bias(ctx).to(ctx.q.dtype)
            total = part if total is None else total + part
        return total


class FlexBiasSum(BiasSum):
    """A :class:`BiasSum` whose every part has ``flex_mods``: flex adds their score terms in turn."""

    def flex_mods(self, ctx: AttentionContext, shape: "flex.FlexShape") -> "flex.FlexMods":
        mods = flex.FlexMods()
        for bias in self.biases:
            mods.extend(bias.flex_mods(ctx, shape))
        return mods


class TransformChain(nn.Module):
    """Post-softmax transforms applied in order: ``t_n(... t_1(probs, ctx) ..., ctx)``."""

    def __init__(self, transforms: Sequence[nn.Module]):
        super().__init__()
        self.transforms = nn.ModuleList(transforms)

    def forward(self, probs: Tensor, ctx: AttentionContext) -> Tensor:
        for transform in self.transforms:
            probs = transform(probs, ctx)
        return probs


def combine(biases: List[nn.Module], transforms: List[nn.Module]):
    """(bias module, post-softmax transform) of one attention from its mechanisms' parts (None: no part)."""
    bias: Optional[nn.Module] = None
    if len(biases) == 1:
        bias = biases[0]
    elif biases:
        bias = (FlexBiasSum if all(hasattr(b, "flex_mods") for b in biases) else BiasSum)(biases)
    post: Optional[nn.Module] = None
    if len(transforms) == 1:
        post = transforms[0]
    elif transforms:
        post = TransformChain(transforms)
    return bias, post
