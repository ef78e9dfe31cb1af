"""The verdict section of a study table: :mod:`seed_level`'s figures of every family against the
Transformer over seeds, one table per protocol on the headline metric, and what its columns can say
(the interval's coverage from :mod:`seed_coverage`, what an ASO ε of 0 means at these seed counts,
the level the detectable size is computed at)."""

from man_recipes.studies import seed_level
from man_recipes.studies.seed_coverage import coverage_line
from man_recipes.studies.study_table import fmt_p

FEW_SEEDS = "fewer than 2 seeds a side"
PROTOCOL_NAMES = {"fixed-budget": "fixed budget", "to-convergence": "to convergence"}


def verdict(entry, metric):
    """The verdict cell of one family on its study's headline metric, from the Holm-corrected p."""
    if entry["untestable"] == FEW_SEEDS:
        return f"not tested ({FEW_SEEDS})"
    if entry["untestable"]:
        return f"not testable: {entry['untestable']}"
    p = entry["holm_p"]
    if p < seed_level.ALPHA:
        return f"{'better' if entry['difference'] > 0 else 'worse'} (Holm p {fmt_p(p)})"
    return f"none detected (80 % power from {entry['detectable']:.2f} {metric} on)"


def interval_cell(entry):
    """The 95 % interval, or why there is none (one seed on a side: that side's spread is unknown)."""
    if entry["ci95"] is not None:
        return f"[{entry['ci95'][0]:+.2f}, {entry['ci95'][1]:+.2f}]"
    if entry["untestable"] == FEW_SEEDS:
        return "not available (one seed on a side leaves out its spread between trainings)"
    return "–"


def verdict_rows(verdicts, labels, headline):
    """The rows of one protocol's :func:`seed_level.study_verdicts` on its ``headline`` metric."""
    rows = []
    for fam, metrics in verdicts.items():
        e = metrics[headline]
        a = e["aso"]
        rows.append([labels.get(fam, fam), f"{', '.join(map(str, e['family_seeds']))} / "
                                           f"{', '.join(map(str, e['baseline_seeds']))}",
                     f"{e['difference']:+.2f}", interval_cell(e),
                     "–" if e["welch_p"] is None else fmt_p(e["welch_p"]),
                     "–" if e.get("holm_p") is None else fmt_p(e["holm_p"]),
                     "–" if a is None else f"{a['family_better']:.2f} / {a['baseline_better']:.2f}",
                     "–" if e["detectable"] is None else f"{e['detectable']:.2f}", verdict(e, headline)])
    return rows


def tested_count(verdicts, headline):
    """How many families of one protocol the Holm correction runs over (those with a p)."""
    return sum(m[headline]["welch_p"] is not None for m in verdicts.values())


def aso_reading(seed_counts):
    """What an ASO ε of 0 (or 1) says at each of ``seed_counts`` ((family seeds, Transformer seeds) of
    the rows with an ASO): only that the seeds do not overlap, no more than a permutation test's best p."""
    if not seed_counts:
        return ""
    said = "; ".join(f"at {f} against {b} seeds {seed_level.smallest_permutation_p(f, b):.2f}"
                     for f, b in sorted(seed_counts))
    return (" An ε of 0.00 (or 1.00) says only that the two sides' seeds do not overlap, every seed of one side "
            "above every seed of the other, for which the best a permutation test over the seeds can say is "
            f"p = 2 / C(n_f + n_b, n_f): {said}.")


def protocol_sections(protocols, families, labels, metrics, headline, scored_on, baseline="transformer"):
    """(Markdown lines, JSON) of the seed-level verdicts of a study: one table per protocol on the
    ``headline`` metric (every metric in the JSON), then how they are computed and what they can say.
    ``protocols``: [(protocol, its records)]; ``metrics`` as :func:`seed_level.study_verdicts` takes
    them; ``scored_on``: the test set's name."""
    from man_recipes.tables import markdown_table

    lines, payload, aso_counts = [], {}, set()
    for name, records in protocols:
        runs = {f: sorted((r for r in records if r["family"] == f), key=lambda r: r["seed"]) for f in families}
        verdicts = seed_level.study_verdicts(runs, families, baseline, metrics, headline)
        payload[name] = verdicts
        rows = verdict_rows(verdicts, labels, headline)
        aso_counts |= {tuple(m[headline]["seeds"]) for m in verdicts.values() if m[headline]["aso"] is not None}
        if rows:
            tested = tested_count(verdicts, headline)
            level = f" (α = {seed_level.ALPHA}/{tested}, Holm's first step)" if tested else ""
            lines += [f"### {PROTOCOL_NAMES.get(name, name).capitalize()}", "", *markdown_table(
                ["family", "seeds (family / Transformer)", f"Δ {headline} (mean over seeds)",
                 "95 % CI (Welch's t over seeds, with the test set's part)", "Welch p", "Holm p",
                 "ASO ε (family / Transformer better)", f"detectable at 80 % power{level}",
                 "verdict"], rows), ""]
    if not lines:
        return [], payload
    scorer = next(iter(metrics.values()))[2]
    return [f"## The verdict: over seeds ({headline}, {scored_on})", "",
            f"Every seed of a family against every seed of the Transformer of the same protocol: whether the "
            f"architectures differ beyond the spread between trainings, which the per-seed tests below do not "
            "measure.", "", *lines,
            f"Δ: the difference of the two means of the records' {headline}. CI: Welch's t interval over the runs' "
            "scores, its variance each side's variance over seeds divided by its seeds, plus the test set's part: the "
            "variance of Δ over resampled test documents (the same for every run; "
            f"{scorer.RESAMPLED}), less each side's run noise, which the seeds' spread holds already; "
            "Welch-Satterthwaite degrees of freedom. With one seed on a side there is no interval: it would leave "
            f"out that side's spread between trainings. {coverage_line()} Welch p: the two-sided p of that t, where "
            "each side has 2 or more seeds, no run twice (identical hypotheses) and a spread (seeds that all score "
            "alike leave nothing to test against: not testable). Holm p: Holm's correction of the Welch p over the "
            "families the protocol tests; the verdict rests on it (p < 0.05). ASO: Almost Stochastic Order (Dror "
            f"et al. 2019; deepsig's `aso`, seed {seed_level.SEED}) where both sides have {seed_level.ASO_MIN_SEEDS} "
            "or more seeds: an ε below 0.5 says that side's scores dominate, the smaller the more."
            f"{aso_reading(aso_counts)} Detectable: the smallest true difference the verdict's test finds with "
            "probability 0.8 (noncentral t, the same standard error and degrees of freedom) at the level of Holm's "
            "first step, 0.05 over the families tested: the strictest Holm applies, so a family whose p ranks "
            "later is tested at a larger α and may be found from a smaller difference.", ""], payload
