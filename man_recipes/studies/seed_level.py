"""The verdict of a study: a family against the Transformer over their seeds, so over the spread between
trainings, not between test sentences.

A paired test over the documents of two runs (:mod:`..studies.rouge_significance`, sacreBLEU's)
says whether *those two trained networks* differ on this test set; two seeds of one config already do
(the Gigaword Transformer's seed 2 against its seed 1: +0.88 R-1, randomization p 0.004). Whether one
*architecture* beats another is a question about the distribution of its trainings, so here:

* :func:`two_level_bootstrap`: the mean difference over seeds with a 95 % interval that resamples
  both levels, the seeds of each side (training noise) and then the test documents (test-set
  sampling), each run rescored on the resampled documents;
* :func:`welch`: Welch's t-test over the runs' scores (two-sided; >= 2 seeds a side);
* :func:`aso`: Almost Stochastic Order (Dror et al. 2019) as ``deepsig.aso`` computes it, both ways,
  where both sides have >= 3 seeds (``ASO_MIN_SEEDS``);
* :func:`holm`: Holm's step-down correction over the families of one study and protocol;
* :func:`detectable_difference`: the smallest difference a two-sample t-test over these seeds detects
  at 80 % power (alpha 0.05, two-sided) with the seeds' pooled standard deviation.

A run's units are what its score is made of: per-document F1 for ROUGE (:class:`MeanOfDocuments`),
per-sentence n-gram statistics for BLEU (:class:`CorpusBleu`).
"""

import math

import numpy as np

SEED = 12345  # sacreBLEU's default seed, as every other test of the tables
BOOTSTRAP_SAMPLES = 2000
ALPHA = 0.05
POWER = 0.8
ASO_MIN_SEEDS = 3  # deepsig's ASO estimates two score distributions: below 3 a side it says nothing


class MeanOfDocuments:
    """A score that is the mean of per-document values (ROUGE-1.5.5's Average_F, x 100)."""

    @staticmethod
    def scores(units, idx):
        """The score of one run on each row of document indices ``idx`` (resamples x documents)."""
        return 100.0 * np.asarray(units, dtype=float)[idx].mean(axis=-1)


class CorpusBleu:
    """sacreBLEU's corpus BLEU, recomputed from the summed per-sentence statistics of the resampled
    sentences (as sacreBLEU's own paired bootstrap does)."""

    def __init__(self):
        from sacrebleu.metrics import BLEU

        self.bleu = BLEU()

    def units(self, hypotheses, references):
        """Each sentence's statistics (matches and totals per n-gram order, lengths)."""
        return np.asarray(self.bleu._extract_corpus_statistics(hypotheses, [references]), dtype=np.int64)

    def scores(self, units, idx):
        summed = np.asarray(units)[idx].sum(axis=-2)
        return np.array([self.bleu._compute_score_from_stats(list(map(int, row))).score for row in summed])


def two_level_bootstrap(family, baseline, scorer, n_samples=BOOTSTRAP_SAMPLES, seed=SEED, chunk=100):
    """(low, high): the 95 % percentile interval of the family's mean score minus the baseline's, each
    resample drawing the seeds of either side with replacement and then the test documents (the same
    ones for every run: they are paired), every drawn run rescored on those documents. ``family`` and
    ``baseline``: one array of units per seed (all over the same documents)."""
    runs = list(family) + list(baseline)
    n_docs = len(runs[0])
    if any(len(u) != n_docs for u in runs):
        raise ValueError("two-level bootstrap: the runs were scored on different numbers of documents")
    rng = np.random.default_rng(seed)
    diffs = []
    for start in range(0, n_samples, chunk):
        size = min(chunk, n_samples - start)
        docs = rng.integers(n_docs, size=(size, n_docs))
        scored = np.stack([scorer.scores(u, docs) for u in runs])  # runs x resamples
        fam = rng.integers(len(family), size=(size, len(family)))
        base = len(family) + rng.integers(len(baseline), size=(size, len(baseline)))
        cols = np.arange(size)[:, None]
        diffs.append(scored[fam, cols].mean(axis=1) - scored[base, cols].mean(axis=1))
    low, high = np.percentile(np.concatenate(diffs), [2.5, 97.5])
    return float(low), float(high)


def welch(family, baseline):
    """Two-sided p of Welch's t-test over the runs' scores; None below 2 seeds a side; 1 when both
    sides are constant and equal, 0 when constant and different (no spread to test against)."""
    from scipy import stats

    if len(family) < 2 or len(baseline) < 2:
        return None
    if np.var(family) == 0 and np.var(baseline) == 0:
        return 1.0 if np.mean(family) == np.mean(baseline) else 0.0
    return float(stats.ttest_ind(family, baseline, equal_var=False).pvalue)


def aso(family, baseline, seed=SEED):
    """{"family_better": eps_min, "baseline_better": eps_min} of deepsig's Almost Stochastic Order over
    the runs' scores (below 0.5: that side is stochastically dominant, the smaller the stronger); None
    below :data:`ASO_MIN_SEEDS` seeds a side."""
    if len(family) < ASO_MIN_SEEDS or len(baseline) < ASO_MIN_SEEDS:
        return None
    import warnings

    from deepsig import aso as deepsig_aso

    def eps(a, b):
        with warnings.catch_warnings():  # identical score sets: deepsig warns of a zero distance, ratio 0.5
            warnings.simplefilter("ignore", UserWarning)
            return float(deepsig_aso(list(a), list(b), seed=seed, show_progress=False, num_jobs=1))

    return {"family_better": eps(family, baseline), "baseline_better": eps(baseline, family)}


def holm(p_values):
    """Holm's step-down adjusted p-values, in the order given (None stays None)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted, running = list(p_values), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def pooled_sd(family, baseline):
    """The pooled sample standard deviation of the two sides' scores, and its degrees of freedom."""
    df = len(family) + len(baseline) - 2
    ss = sum(float(np.sum((np.asarray(v) - np.mean(v)) ** 2)) for v in (family, baseline))
    return (math.sqrt(ss / df) if df > 0 else None), df


def detectable_difference(sd, n_family, n_baseline, alpha=ALPHA, power=POWER):
    """The smallest true difference a two-sided two-sample t-test at ``alpha`` detects with probability
    ``power``, for seeds of standard deviation ``sd`` (noncentral t); None without a spread to go by."""
    from scipy import optimize, stats

    df = n_family + n_baseline - 2
    if sd is None or df < 1:
        return None
    if sd == 0:
        return 0.0
    se = sd * math.sqrt(1 / n_family + 1 / n_baseline)
    crit = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(delta):
        nc = delta / se
        # the far tail is below double precision where scipy's noncentral t returns nan: it is 0 there
        return stats.nct.sf(crit, df, nc) + np.nan_to_num(stats.nct.cdf(-crit, df, nc)) - power

    return float(optimize.brentq(shortfall, 0.0, 20 * se))


def compare(family, baseline, scorer, n_samples=BOOTSTRAP_SAMPLES, seed=SEED, with_aso=True):
    """Every seed-level figure of a family against the baseline on one metric (ASO only ``with_aso``:
    deepsig takes seconds a call). ``family`` and ``baseline``: [(a run's score as its record says, its
    units)] per seed."""
    fs, bs = [s for s, _ in family], [s for s, _ in baseline]
    low, high = two_level_bootstrap([u for _, u in family], [u for _, u in baseline], scorer, n_samples, seed)
    sd, _ = pooled_sd(fs, bs)
    return {"seeds": [len(fs), len(bs)], "difference": round(float(np.mean(fs) - np.mean(bs)), 2),
            "ci95": [round(low, 2), round(high, 2)], "welch_p": welch(fs, bs), "aso": aso(fs, bs) if with_aso else None,
            "pooled_sd": None if sd is None else round(sd, 3),
            "detectable": _rounded(detectable_difference(sd, len(fs), len(bs))),
            "bootstrap": {"samples": n_samples, "seed": seed}}


def _rounded(value):
    return None if value is None else round(value, 2)


def study_verdicts(runs, families, baseline, metrics, headline, n_samples=BOOTSTRAP_SAMPLES):
    """{family: {metric: :func:`compare`}} of every family of ``families`` with runs against
    ``baseline``, with Holm's correction of the ``headline`` metric's Welch p over the families
    (``holm_p``) and ASO on that metric alone. ``runs``: {family: [record]}; ``metrics``: {name: (a
    record's score, its units, scorer)}."""
    out = {}
    for fam in families:
        if fam == baseline or not runs.get(fam) or not runs.get(baseline):
            continue
        out[fam] = {name: dict(compare([(score(r), units(r)) for r in runs[fam]],
                                       [(score(r), units(r)) for r in runs[baseline]], scorer, n_samples,
                                       with_aso=name == headline),
                               family_seeds=[r["seed"] for r in runs[fam]],
                               baseline_seeds=[r["seed"] for r in runs[baseline]])
                    for name, (score, units, scorer) in metrics.items()}
    adjusted = holm([v[headline]["welch_p"] for v in out.values()])
    for v, p in zip(out.values(), adjusted):
        v[headline]["holm_p"] = p
    return out


def verdict(entry, metric):
    """The verdict cell of one family on its study's headline metric, from the Holm-corrected Welch p."""
    p = entry.get("holm_p")
    if p is None:
        return "not tested (fewer than 2 seeds a side)"
    if p < ALPHA:
        return f"{'better' if entry['difference'] > 0 else 'worse'} (Holm p {fmt(p)})"
    size = entry["detectable"]
    return "none detected" + (f" (80 % power from {size:.2f} {metric} on)" if size is not None else "")


def fmt(p):
    """A p-value as the tables print it: 3 decimals, 4 below 0.001."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.4f}"


PROTOCOL_NAMES = {"fixed-budget": "fixed budget", "to-convergence": "to convergence"}


def verdict_rows(verdicts, labels, headline):
    """The rows of one protocol's :func:`study_verdicts` on its ``headline`` metric."""
    rows = []
    for fam, metrics in verdicts.items():
        e = metrics[headline]
        a = e["aso"]
        rows.append([labels.get(fam, fam), f"{', '.join(map(str, e['family_seeds']))} / "
                                           f"{', '.join(map(str, e['baseline_seeds']))}",
                     f"{e['difference']:+.2f}", f"[{e['ci95'][0]:+.2f}, {e['ci95'][1]:+.2f}]",
                     "–" if e["welch_p"] is None else fmt(e["welch_p"]),
                     "–" if e.get("holm_p") is None else fmt(e["holm_p"]),
                     "–" if a is None else f"{a['family_better']:.2f} / {a['baseline_better']:.2f}",
                     "–" if e["detectable"] is None else f"{e['detectable']:.2f}", verdict(e, headline)])
    return rows


def protocol_sections(protocols, families, labels, metrics, headline, scored_on, baseline="transformer"):
    """(Markdown lines, JSON) of the seed-level verdicts of a study: one table per protocol on the
    ``headline`` metric (every metric in the JSON), then how they are computed. ``protocols``:
    [(protocol, its records)]; ``metrics`` as :func:`study_verdicts` takes them; ``scored_on``: the
    test set's name."""
    from man_recipes.tables import markdown_table

    lines, payload = [], {}
    for name, records in protocols:
        runs = {f: sorted((r for r in records if r["family"] == f), key=lambda r: r["seed"]) for f in families}
        verdicts = study_verdicts(runs, families, baseline, metrics, headline)
        payload[name] = verdicts
        rows = verdict_rows(verdicts, labels, headline)
        if rows:
            lines += [f"### {PROTOCOL_NAMES.get(name, name).capitalize()}", "", *markdown_table(
                ["family", "seeds (family / Transformer)", f"Δ {headline} (mean over seeds)",
                 "95 % CI (two-level bootstrap)", "Welch p", "Holm p", "ASO ε (family / Transformer better)",
                 "detectable at 80 % power", "verdict"], rows), ""]
    if not lines:
        return [], payload
    return [f"## The verdict: over seeds ({headline}, {scored_on})", "",
            f"Every seed of a family against every seed of the Transformer of the same protocol: whether the "
            f"architectures differ beyond the spread between trainings, which the per-seed tests below do not "
            "measure.", "", *lines,
            f"Δ: the difference of the two means of the records' {headline}. CI: {BOOTSTRAP_SAMPLES} resamples "
            f"(numpy default_rng seed {SEED}) of the seeds of each side with replacement, then of the test "
            "documents (the same for every run), each run rescored on them. Welch p: Welch's two-sided t-test "
            "over the runs' scores (2 or more seeds a side). Holm p: Holm's correction of the Welch p over the "
            "families of the protocol; the verdict rests on it (p < 0.05). ASO: Almost Stochastic Order (Dror "
            f"et al. 2019; deepsig's `aso`, seed {SEED}) where both sides have {ASO_MIN_SEEDS} or more seeds: an "
            "ε below 0.5 says that side's scores dominate, the smaller the more. Detectable: the smallest true "
            "difference a two-sample t-test over these seeds finds with probability 0.8 at α = 0.05, given the "
            "pooled standard deviation of their scores.", ""], payload
