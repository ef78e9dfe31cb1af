"""Attention locality's measurements (``man-attention-locality``, :mod:`man_recipes.cli.attention_locality`):
the share of attention within ``|t - s| <= w`` of real-token positions, its uniform chance level, and
the recorder of the encoder self-attentions of MAN layers and fairseq's transformer."""

import logging
from collections import Counter
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

logger = logging.getLogger("man_fairseq.attention_locality")


# ----------------------------------------------------------------------------- the measure

def real_positions(padding_mask: Tensor) -> Tensor:
    """(B, S) True at pads -> (B, S) position of every token counted in real tokens from the
    first real one (pads get the position of the previous real token; they are never used)."""
    return (~padding_mask).long().cumsum(-1) - 1


def locality_shares(probs: Tensor, padding_mask: Tensor, windows: Sequence[int]) -> Tensor:
    """Share of attention within each window, per sentence, head and query.

    Args:
        probs: (B, H, T, S) attention weights of a self-attention (T == S), pads included.
        padding_mask: (B, S) bool, True at pad tokens.
    Returns:
        (B, H, T, W) float64 shares; 0 at pad queries.
    """
    real = ~padding_mask
    pos = real_positions(padding_mask)
    dist = (pos[:, :, None] - pos[:, None, :]).abs()  # (B, T, S)
    p = probs.double() * real[:, None, None, :]
    total = p.sum(-1).clamp_min(1e-30)  # (B, H, T)
    shares = torch.stack(
        [(p * (dist <= w)[:, None]).sum(-1) / total for w in windows], dim=-1
    )
    return shares * real[:, None, :, None]


def uniform_shares(padding_mask: Tensor, windows: Sequence[int]) -> Tensor:
    """(B, 1, T, W) shares of an attention spread evenly over the real keys (the chance level)."""
    real = ~padding_mask
    uniform = real[:, None, None, :].double() / real.sum(-1).clamp_min(1).view(-1, 1, 1, 1)
    return locality_shares(uniform.expand(-1, 1, real.size(1), -1), padding_mask, windows)


class LocalityStats:
    """Running sums of the shares of one attention over sentences and query tokens."""

    def __init__(self, num_windows: int):
        self.sentence_sum = torch.zeros(num_windows, dtype=torch.float64)
        self.token_sum = torch.zeros(num_windows, dtype=torch.float64)
        self.sentences = 0
        self.tokens = 0

    def add(self, shares: Tensor, padding_mask: Tensor):
        """shares (B, H, T, W) from :func:`locality_shares`."""
        shares = shares.cpu()
        lengths = (~padding_mask).sum(-1).cpu().double()  # (B,)
        per_token = shares.mean(1)  # (B, T, W): mean over heads
        per_sentence = per_token.sum(1) / lengths.clamp_min(1)[:, None]  # (B, W)
        keep = lengths > 0
        self.sentence_sum += per_sentence[keep].sum(0)
        self.token_sum += per_token.sum((0, 1))
        self.sentences += int(keep.sum())
        self.tokens += int(lengths.sum())

    def means(self):
        return (self.sentence_sum / max(self.sentences, 1)).tolist(), (self.token_sum / max(self.tokens, 1)).tolist()


# ------------------------------------------------------------------ finding the attentions

def self_attention_label(attn) -> str:
    """'san' for a plain attention, else 'san+<what changes it>' (subclass, bias, post-softmax)."""
    from fairseq.modules.multihead_attention import MultiheadAttention

    from man_fairseq.modules.biased_attention import BiasedMultiheadAttention

    parts = []
    if type(attn) not in (MultiheadAttention, BiasedMultiheadAttention):
        parts.append(type(attn).__name__)
    for extra in (getattr(attn, "bias_module", None), getattr(attn, "post_softmax", None)):
        if extra is not None:
            parts.append(type(extra).__name__)
    return "+".join(["san"] + parts)


def encoder_self_attentions(model):
    """[(layer index, sublayer label, attention module)] of every encoder self-attention."""
    from fairseq.modules.multihead_attention import MultiheadAttention

    from man_fairseq.modules.man_layers import SELF_ATTENTION_SUBLAYERS

    found = []
    for layer_idx, layer in enumerate(model.encoder.layers):
        if hasattr(layer, "sublayers") and hasattr(layer, "blocks"):  # MAN layer
            names = list(layer.sublayers)
            repeated = Counter(names)
            seen = Counter()
            for name, block in zip(names, layer.blocks):
                if name not in SELF_ATTENTION_SUBLAYERS:
                    continue
                seen[name] += 1
                # Table 3 orders repeat a sublayer (san,san,ffn): number them in layer order
                found.append((layer_idx, name if repeated[name] == 1 else f"{name}#{seen[name]}", block))
        elif isinstance(getattr(layer, "self_attn", None), MultiheadAttention):
            found.append((layer_idx, self_attention_label(layer.self_attn), layer.self_attn))
        else:
            raise SystemExit(f"encoder layer {layer_idx} ({type(layer).__name__}) has no self-attention "
                             "this command knows (MAN sublayers or fairseq's self_attn)")
    return found


class AttentionRecorder:
    """Forward hooks that measure the locality of every encoder self-attention.

    How the probabilities are obtained without touching module code: a forward hook re-runs
    the attention module's own ``forward`` on the same inputs with ``need_weights=True,
    need_head_weights=True`` (the model is in eval mode, so no dropout: both runs compute the
    same attention; the hook checks that the outputs agree). The model's own forward and its
    outputs are unchanged. fairseq's plain ``MultiheadAttention`` takes PyTorch's fused path
    when called without an incremental state and then returns only head-averaged weights, so
    the re-run passes a throw-away empty incremental state, which selects fairseq's explicit
    path and its per-head weights (same formula; nothing is cached between calls).
    """

    def __init__(self, model, windows: Sequence[int]):
        from fairseq.modules.multihead_attention import MultiheadAttention

        from man_fairseq.modules.biased_attention import BiasedMultiheadAttention

        self.windows = list(windows)
        self.attentions = encoder_self_attentions(model)
        self.stats: Dict[tuple, LocalityStats] = {}
        self.padding_mask: Optional[Tensor] = None  # (B, S) of the batch being run
        self.mismatch_warned = False
        self.last_probs: Dict[tuple, Tensor] = {}
        self.keep_probs = False  # tests read the probabilities
        self.handles = []
        for layer_idx, label, attn in self.attentions:
            key = (layer_idx, label)
            self.stats[key] = LocalityStats(len(self.windows))
            plain_fairseq = isinstance(attn, MultiheadAttention) and not isinstance(attn, BiasedMultiheadAttention)
            self.handles.append(attn.register_forward_hook(
                self._hook(key, plain_fairseq), with_kwargs=True))

    def _hook(self, key, plain_fairseq: bool):
        def hook(module, args, kwargs, output):
            if self.padding_mask is None:
                return None
            if module.training:
                raise RuntimeError("attention locality needs the model in eval mode (no dropout)")
            rerun = dict(kwargs, need_weights=True, need_head_weights=True)
            if plain_fairseq:
                rerun["incremental_state"] = {}
            out, probs = module.forward(*args, **rerun)  # .forward: no hooks, no recursion
            if not self.mismatch_warned and not torch.allclose(out, output[0], rtol=1e-3, atol=1e-4):
                logger.warning("re-run of %s differs from its forward pass (max abs diff %.2e)",
                               key, (out - output[0]).abs().max().item())
                self.mismatch_warned = True
            probs = probs.transpose(0, 1)  # (H, B, T, S) -> (B, H, T, S)
            if self.keep_probs:
                self.last_probs[key] = probs.detach()
            self.stats[key].add(locality_shares(probs, self.padding_mask, self.windows), self.padding_mask)
            return None
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []
