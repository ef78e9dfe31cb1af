"""The calibration analysis' figures: mask heat maps, JSD and entropies per layer, JSD by the
original attention's entropy and maximum weight, Kendall-τ bars (matplotlib through
:func:`man_recipes.logging_setup.pyplot`, imported when a figure is drawn)."""

from typing import Dict, List

import torch

from man_recipes.analysis.calibration_stats import SERIES_NAMES
from man_recipes.logging_setup import pyplot


def save_heatmap(path, mask: torch.Tensor, src: List[str], tgt: List[str], title: str = ""):
    plt = pyplot()
    layers = mask.size(0)
    width = max(3.0, 0.32 * len(src) + 1.2)
    fig, axes = plt.subplots(1, layers, figsize=(width * layers + 1.0, 0.32 * len(tgt) + 2.0), squeeze=False)
    for layer in range(layers):
        ax = axes[0, layer]
        image = ax.imshow(mask[layer].mean(0).numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(src)))
        ax.set_xticklabels(src, rotation=90, fontsize=8)
        ax.set_yticks(range(len(tgt)))
        ax.set_yticklabels(tgt, fontsize=8)
        ax.set_xlabel("source token")
        if layer == 0:
            ax.set_ylabel("target token (teacher-forced)")
        ax.set_title(f"decoder layer {layer + 1}", fontsize=9)
    fig.colorbar(image, ax=axes.ravel().tolist(), label="mask m (mean over heads)")
    fig.suptitle(f"Perturbation mask m: {title}", fontsize=9)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def save_stats_plot(path, results: List[Dict], subset: str):
    plt = pyplot()
    calibrated = [r for r in results if r["calibrated"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    n = len(calibrated)
    for i, r in enumerate(calibrated):
        layers = [x["layer"] for x in r["layers"]]
        offset = (i - (n - 1) / 2) * 0.8 / n
        ax1.bar([l + offset for l in layers], [x["jsd"] for x in r["layers"]], width=0.8 / n, label=r["label"])
        ax2.plot(layers, [x["entropy_original"] for x in r["layers"]], "o-", label=f"{r['label']}: original a")
        ax2.plot(layers, [x["entropy_calibrated"] for x in r["layers"]], "s--", label=f"{r['label']}: calibrated")
        ax1.set_xticks(layers)
        ax2.set_xticks(layers)
    ax1.set_xlabel("decoder layer")
    ax1.set_ylabel("mean JSD(a, a_cal) [bits]")
    ax1.set_title("JSD between original and calibrated attention", fontsize=10)
    ax2.set_xlabel("decoder layer")
    ax2.set_ylabel("mean attention entropy [bits]")
    ax2.set_title("Entropy before / after calibration", fontsize=10)
    if n > 1:
        ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.suptitle(f"Cross-attention, {subset}: means over (target token, head) rows", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_binned_plot(path, results: List[Dict], subset: str):
    plt = pyplot()
    calibrated = [r for r in results if r["calibrated"]]
    fig, axes = plt.subplots(len(calibrated), 2, figsize=(10, 3.8 * len(calibrated)), squeeze=False)
    for row, r in enumerate(calibrated):
        for ax, key, xlabel in ((axes[row, 0], "by_entropy", "entropy of the original attention a [bits]"),
                                (axes[row, 1], "by_max_weight", "maximum weight of the original attention a")):
            t = r["jsd_bins"][key]
            centres = [low + t["bin_width"] / 2 for low in t["bin_low"]]
            for layer, means in enumerate(t["mean_jsd"]):
                xs = [c for c, m in zip(centres, means) if m is not None]
                ys = [m for m in means if m is not None]
                ax.plot(xs, ys, "o-", markersize=3, label=f"layer {layer + 1}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("mean JSD(a, a_cal) [bits]")
            ax.set_title(f"{r['label']}: JSD {key.replace('_', ' ')} (bins of {t['bin_width']:g})", fontsize=10)
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"JSD vs the original attention's entropy and maximum weight (P3 Figure 7), {subset}; "
                 "points at bin centres, empty bins left out", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_kendall_plot(path, results: List[Dict], subset: str, importance: str):
    plt = pyplot()
    bars = [(r["label"], s, v["tau"]) for r in results if r["kendall"] for s, v in r["kendall"].items()]
    num_layers = max(len(t) for _, _, t in bars)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * num_layers + 2), 3.8))
    width = 0.8 / len(bars)
    for i, (label, series, taus) in enumerate(bars):
        xs = [layer + 1 + (i - (len(bars) - 1) / 2) * width for layer in range(len(taus))]
        ax.bar(xs, [t if t is not None else 0.0 for t in taus], width=width, label=f"{label}: {SERIES_NAMES[series]}")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(1, num_layers + 1))
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("mean Kendall τ-b")
    what = "gradient × input" if importance == "grad_input" else "gradient norm"
    ax.set_title(f"Kendall-τ between head-averaged weights and {what} importance (P3 Figure 2)", fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.text(0.01, 0.01, f"{subset}; mean over real target tokens; τ over the real source tokens",
             fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
