"""The calibration analysis' statistics, tensors in and numbers out (torch only, no plotting):
JSD and entropies of the original and calibrated cross-attention per layer, the JSD binned by the
original attention's entropy and maximum weight, gradient-based source importance and the
token-pooled Kendall-τ sums. ``export_calibration`` runs the models and writes the outputs."""

from typing import Dict, List

import torch
from torch import Tensor

from man_recipes.analysis.utils import kendall_tau_b

ENTROPY_BIN = 0.4  # bits
MAX_WEIGHT_BIN = 0.1
NUM_ENTROPY_BINS = 40  # up to 16 bits; the last bin is open-ended
NUM_MAX_WEIGHT_BINS = 10
IMPORTANCE = ("grad_input", "grad_norm")  # the kinds of source_importance


def entropy_bits(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log2(p.clamp_min(1e-30))).sum(-1)


def jsd_bits(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    mid = 0.5 * (p + q)

    def kl(x, y):
        return (x * (torch.log2(x.clamp_min(1e-30)) - torch.log2(y.clamp_min(1e-30)))).sum(-1)

    return 0.5 * kl(p, mid) + 0.5 * kl(q, mid)


def normalised_rows(captured_layer: Dict[str, Tensor], src_real: Tensor):
    """(a, a_cal) as float64 distributions over the real keys, (B, H, T, S)."""
    key_mask = src_real[:, None, None, :].double()
    a = captured_layer["attn"].double() * key_mask
    fused = captured_layer["calibrated"].double() * key_mask
    return a / a.sum(-1, keepdim=True).clamp_min(1e-30), fused / fused.sum(-1, keepdim=True).clamp_min(1e-30)


def layer_statistics(captured: List[Dict[str, torch.Tensor]], src_real: torch.Tensor, tgt_real: torch.Tensor):
    """Sums over real (sentence, target token, head) rows, per layer:
    jsd, entropy of a, entropy of fused, mean m; plus the row count."""
    rows = []
    key_mask = src_real[:, None, None, :].double()  # (B,1,1,S)
    row_mask = tgt_real[:, None, :].expand(-1, captured[0]["attn"].size(1), -1)  # (B,H,T)
    for c in captured:
        a, fused = normalised_rows(c, src_real)
        m_mean = c["m"].double().sum(-1) / key_mask.sum(-1)
        stats = {
            "jsd": jsd_bits(a, fused),
            "entropy_original": entropy_bits(a),
            "entropy_calibrated": entropy_bits(fused),
            "mask_mean": m_mean,
        }
        rows.append({k: float(v[row_mask].sum()) for k, v in stats.items()})
    return rows, int(row_mask.sum())


class BinnedJSD:
    """Sum and count of the JSD of every real row, binned by H(a) and by max a, per layer."""

    def __init__(self, num_layers: int):
        self.entropy_sum = torch.zeros(num_layers, NUM_ENTROPY_BINS, dtype=torch.float64)
        self.entropy_count = torch.zeros(num_layers, NUM_ENTROPY_BINS, dtype=torch.long)
        self.max_sum = torch.zeros(num_layers, NUM_MAX_WEIGHT_BINS, dtype=torch.float64)
        self.max_count = torch.zeros(num_layers, NUM_MAX_WEIGHT_BINS, dtype=torch.long)

    def add(self, layer: int, a: Tensor, fused: Tensor, row_mask: Tensor):
        jsd = jsd_bits(a, fused)[row_mask].cpu()
        ent_bin = (entropy_bits(a)[row_mask].cpu() / ENTROPY_BIN).floor().long().clamp(0, NUM_ENTROPY_BINS - 1)
        max_bin = (a.max(-1).values[row_mask].cpu() / MAX_WEIGHT_BIN).floor().long().clamp(0, NUM_MAX_WEIGHT_BINS - 1)
        self.entropy_sum[layer].index_add_(0, ent_bin, jsd)
        self.entropy_count[layer].index_add_(0, ent_bin, torch.ones_like(ent_bin))
        self.max_sum[layer].index_add_(0, max_bin, jsd)
        self.max_count[layer].index_add_(0, max_bin, torch.ones_like(max_bin))

    @staticmethod
    def _table(sums, counts, width):
        used = int((counts.sum(0) > 0).nonzero().max()) + 1 if counts.sum() > 0 else 0
        return {
            "bin_low": [round(i * width, 6) for i in range(used)],
            "bin_width": width,
            "rows": counts[:, :used].tolist(),
            "mean_jsd": [[(float(s) / int(c)) if c > 0 else None for s, c in zip(srow[:used], crow[:used])]
                         for srow, crow in zip(sums, counts)],
        }

    def tables(self):
        return {"by_entropy": self._table(self.entropy_sum, self.entropy_count, ENTROPY_BIN),
                "by_max_weight": self._table(self.max_sum, self.max_count, MAX_WEIGHT_BIN)}


def source_importance(token_logprobs: Tensor, embeddings: Tensor, tgt_real: Tensor, kind: str) -> Tensor:
    """(B, T, S) importance of every source token for every target token (0 at pad targets).

    ``token_logprobs`` (B, T): log p(y_t) of the reference tokens, a function of ``embeddings``
    (B, S, C); one backward pass per target position (the sentences of a batch are independent,
    so summing over the batch gives every sentence its own gradient).
    """
    bsz, tgt_len = token_logprobs.shape
    out = torch.zeros(bsz, tgt_len, embeddings.size(1), dtype=torch.float64)
    for t in range(tgt_len):
        real = tgt_real[:, t]
        if not real.any():
            continue
        (grad,) = torch.autograd.grad(token_logprobs[:, t][real].sum(), embeddings, retain_graph=True)
        if kind == "grad_input":
            value = (grad.double() * embeddings.detach().double()).sum(-1).abs()
        else:
            value = torch.linalg.vector_norm(grad.double(), dim=-1)
        out[:, t] = value.cpu()
    return out


class KendallSums:
    """Token-pooled sums of Kendall-τ per (series, layer)."""

    def __init__(self):
        self.sums: Dict[str, List[float]] = {}
        self.counts: Dict[str, List[int]] = {}
        self.undefined: Dict[str, List[int]] = {}

    def add(self, series: str, layer: int, head_mean: Tensor, importance: Tensor, src_real: Tensor, rows: Tensor):
        """head_mean, importance (B, T, S); rows (B, T) bool: the target tokens to use."""
        for store in (self.sums, self.counts, self.undefined):
            lst = store.setdefault(series, [])
            while len(lst) <= layer:
                lst.append(0)
        b_idx, t_idx = rows.nonzero(as_tuple=True)
        if len(b_idx) == 0:
            return
        tau = kendall_tau_b(head_mean[b_idx, t_idx].cpu(), importance[b_idx, t_idx], src_real[b_idx].cpu())
        defined = ~torch.isnan(tau)
        self.sums[series][layer] += float(tau[defined].sum())
        self.counts[series][layer] += int(defined.sum())
        self.undefined[series][layer] += int((~defined).sum())

    def means(self):
        return {s: {"tau": [v / c if c else None for v, c in zip(self.sums[s], self.counts[s])],
                    "target_tokens": self.counts[s], "undefined": self.undefined[s]} for s in self.sums}


# the series KendallSums is keyed by, as tables and figures name them
SERIES_NAMES = {"attention": "cross-attention a", "calibrated": "calibrated a_cal", "mask": "mask m"}
