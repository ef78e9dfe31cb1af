"""A study's figure, taken in at a glance: each family's score with every seed as a dot (each run to
convergence as a star beside them), the Transformer's seeds as a grey band, beside every run's
validation loss zoomed on the second half of training, where the curves separate (from the start
they overlap: the first epochs' losses are several bits above the last ones); where the study has
runs to convergence, a panel with every such run's whole curve to its stop and its best (scored)
checkpoint marked, and one with its dev loss against its training loss (how far each overfits)."""

from man_recipes.studies.experiments import BASELINE
from man_recipes.atomic import replacing
from man_recipes.metrics import experiment_metric


def figure_path(results_dir, experiment, metric):
    """The figure a study's table names: a ROUGE study's scores beside its loss curves, or a BLEU
    study's loss curves."""
    return results_dir / (f"{experiment}.png" if experiment_metric(metric).is_rouge else f"{experiment}-valid-loss.png")


def _fit_ylim(ax, values):
    """The y axis to ``values`` with a margin of 8 % of their range (0.05 where they are all equal)."""
    lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo) or 0.05
    ax.set_ylim(lo - pad, hi + pad)


def short_labels(families, labels):
    """Each family's name in a figure: its label without the parenthesis, unless another family's label
    shortens to the same name (calibration at two α), which then keeps its whole label."""
    short = {f: labels.get(f, f).split(" (")[0] for f in families}
    names = list(short.values())
    return {f: labels.get(f, f) if names.count(s) > 1 else s for f, s in short.items()}


def columns(families, records, converged):
    """The families a score panel shows, in the study's order: a family with runs to convergence only
    (no fixed-budget run) still gets its column, of stars."""
    return [f for f in families if any(r["family"] == f for r in list(records) + list(converged))]


def plot_study(records, families, labels, panels, path, title, converged=()):
    """``panels``: [(title, score of a record or None[, (label, value) of a baseline line or None])], one dot
    panel each, then the loss panel, then (``converged``: records of runs to convergence) their curves
    and their dev loss against their training loss, these three on a second row."""
    from man_recipes.logging_setup import pyplot

    plt = pyplot()
    fams = columns(families, records, converged)
    colors = plt.get_cmap("tab10")
    short = short_labels(families, labels)
    gaps = [r for r in converged if r.get("train_curve")]  # records before 2026-11-29 lack the training loss
    curves = 1 + bool(converged) + bool(gaps)
    if curves == 1:
        fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4 * len(panels) + 6.5, 4.8), dpi=110,
                                 gridspec_kw={"width_ratios": [1] * len(panels) + [1.7]})
        score_axes, curve_axes = axes[:-1], axes[-1:]
    else:  # the loss panels on a row of their own: one row of six is too wide to read
        fig = plt.figure(figsize=(max(4 * len(panels), 6.5 * curves), 9.6), dpi=110)
        rows = fig.add_gridspec(2, 1)
        score_axes = [fig.add_subplot(cell) for cell in rows[0].subgridspec(1, len(panels))]
        curve_axes = [fig.add_subplot(cell) for cell in rows[1].subgridspec(1, curves)]
    if converged:
        plot_converged(curve_axes[1], converged, families, short, colors)
    if gaps:
        plot_generalisation(curve_axes[2], gaps, families, short, colors)
    for ax, (name, score, *line) in zip(score_axes, panels):
        base = [v for v in (score(r) for r in records if r["family"] == BASELINE) if v is not None]
        if base:
            ax.axhspan(min(base), max(base), color="0.85", zorder=0)
        if line and line[0]:
            label, value = line[0]
            ax.axhline(value, color="0.35", ls="--", lw=1, zorder=1)
            ax.annotate(f"{label} {value:.2f}", (0, value), xycoords=("axes fraction", "data"), xytext=(3, 3),
                        textcoords="offset points", fontsize=7, color="0.25")
        for i, fam in enumerate(fams):
            # seeds side by side, so that equal scores stay visible as separate dots; the runs to
            # convergence as stars to their right: where each family ends beside how fast it learns
            for runs, dx, style in ((records, 0, {"s": 28}),
                                    (converged, 0.3, {"s": 80, "marker": "*", "edgecolors": "0.2", "linewidths": 0.4})):
                vals = [v for v in (score(r) for r in sorted(runs, key=lambda r: r["seed"]) if r["family"] == fam)
                        if v is not None]
                ax.scatter([i + dx + 0.12 * (k - (len(vals) - 1) / 2) for k in range(len(vals))], vals,
                           color=colors(families.index(fam) % 10), zorder=2, **style)
        ax.set_xticks(range(len(fams)))
        ax.set_xticklabels([short[f] for f in fams], rotation=40, ha="right", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    score_axes[0].set_ylabel("score (a dot per seed; grey: the Transformer's seeds)" if not converged else
                             "score: fixed budget (dots), to convergence (stars),\na mark per seed; grey: the "
                             "Transformer's seeds", fontsize=8)
    ax = curve_axes[0]
    tail, last = [], 0
    for fam in fams:
        for r in sorted((r for r in records if r["family"] == fam), key=lambda r: r["seed"]):
            if r.get("valid_curve"):
                x, y = zip(*r["valid_curve"])
                last = max(last, x[-1])
                tail += [v for u, v in r["valid_curve"] if u >= x[-1] / 2]
                ax.plot(x, y, ["-", "--", ":", "-."][(r["seed"] - 1) % 4], color=colors(families.index(fam) % 10),
                        marker=".", label=f"{short[fam]} s{r['seed']}")
    if tail:
        ax.set_xlim(last / 2 * 0.95, last * 1.02)
        _fit_ylim(ax, tail)
    if converged:  # beside the panels of the runs to convergence, say which runs these are
        ax.set_title("fixed budget: each run's validation loss", fontsize=10)
    ax.set_xlabel("updates (second half of training)")
    ax.set_ylabel("validation loss (label-smoothed CE, base 2)", fontsize=8)
    ax.legend(fontsize=6.5, ncol=2)
    ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    try:
        with replacing(path, "wb") as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)


def plot_converged(ax, records, families, names, colors):
    """Every run to convergence: its whole validation curve to the epoch it stopped at, a star at its best
    (scored) checkpoint; the y axis leaves out the first epochs, which lie bits above the rest. ``names``:
    each family's name in the legend (:func:`short_labels`)."""
    fams = [f for f in families if any(r["family"] == f for r in records)]
    tail = []
    for i, fam in enumerate(fams):
        for r in sorted((r for r in records if r["family"] == fam), key=lambda r: r["seed"]):
            if not r.get("valid_curve"):
                continue
            x, y = zip(*r["valid_curve"])
            tail += list(y[len(y) // 4:])
            ax.plot(x, y, ["-", "--", ":", "-."][(r["seed"] - 1) % 4], color=colors(families.index(fam) % 10),
                    marker=".", ms=3, label=f"{names.get(fam, fam)} s{r['seed']} (best {r.get('best_epoch')}"
                                            f", stop {r.get('stopping_epoch')})")
            if r.get("best_updates") is not None:
                ax.plot([r["best_updates"]], [r["best_valid_loss"]], "*", color=colors(families.index(fam) % 10), ms=11)
    if tail:
        _fit_ylim(ax, tail)
    ax.set_title("to convergence: whole curves, * best checkpoint (scored)", fontsize=10)
    ax.set_xlabel("updates")
    ax.set_ylabel("validation loss (label-smoothed CE, base 2)", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)


def plot_generalisation(ax, records, families, names, colors):
    """Every run to convergence that recorded its training loss: its dev loss at the end of each epoch
    against that epoch's mean training loss, training running left to right, a star at the best
    (scored) checkpoint. At the same training loss a lower curve generalises better; where a curve
    turns up, the run overfits. The first quarter of each run is left out, as in :func:`plot_converged`.
    ``names``: each family's name in the legend (:func:`short_labels`)."""
    lo_x, hi_x, tail = [], [], []
    for fam in [f for f in families if any(r["family"] == f for r in records)]:
        for r in sorted((r for r in records if r["family"] == fam), key=lambda r: r["seed"]):
            dev = dict(r["valid_curve"])
            points = [(t, dev[u], u) for u, t in r["train_curve"] if u in dev]
            points = points[len(points) // 4:]
            if not points:
                continue
            x, y, updates = zip(*points)
            lo_x.append(min(x))
            hi_x.append(max(x))
            tail += y
            color = colors(families.index(fam) % 10)
            ax.plot(x, y, ["-", "--", ":", "-."][(r["seed"] - 1) % 4], color=color, marker=".", ms=3,
                    label=f"{names.get(fam, fam)} s{r['seed']}")
            if r.get("best_updates") in updates:
                k = updates.index(r["best_updates"])
                ax.plot([x[k]], [y[k]], "*", color=color, ms=11)
    if tail:
        _fit_ylim(ax, tail)
        ax.set_xlim(max(hi_x) + 0.05, min(lo_x) - 0.05)  # training loss falls: time runs left to right
    ax.set_title("to convergence: dev loss at each training loss (lower: generalises better)", fontsize=10)
    ax.set_xlabel("training loss, epoch mean (label-smoothed, dropout on; falls to the right)")
    ax.set_ylabel("validation loss (label-smoothed CE, base 2)", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
