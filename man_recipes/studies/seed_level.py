"""The verdict of a study: a family against the Transformer over their seeds, so over the spread between
trainings, not between test sentences.

A paired test over the documents of two runs (:mod:`..studies.rouge_significance`, sacreBLEU's)
says whether *those two trained networks* differ on this test set; two seeds of one config already do
(the Gigaword Transformer's seed 2 against its seed 1: +0.88 R-1, randomization p 0.004). Whether one
*architecture* beats another is a question about the distribution of its trainings, so here one
statistic gives the interval, the test and the size it could detect:

* :func:`test_set_variance`: the part of the difference of the two means that the test documents
  make and the spread between seeds does not show (each architecture's own per-document strengths,
  shared by its seeds on the one test set), from the documents resampled, less what each run's own
  document noise already puts into the seeds' spread;
* :func:`welch`: Welch's t over the runs' scores with that component added to its variance
  (Welch-Satterthwaite degrees of freedom of the seeds' part): the 95 % interval of the difference
  (:func:`welch_interval`; its coverage on simulated studies is :mod:`seed_coverage`'s) and the
  two-sided p; >= 2 seeds a side with a spread, no run repeated (:func:`untestable`);
* :func:`aso`: Almost Stochastic Order (Dror et al. 2019) as ``deepsig.aso`` computes it, both ways,
  where both sides have >= 3 seeds (``ASO_MIN_SEEDS``);
* :func:`holm`: Holm's step-down correction over the tested families of one study and protocol;
* :func:`detectable_difference`: the smallest difference that test detects at 80 % power at the
  level of Holm's first step (alpha / the number of families tested, the strictest), for seeds
  spread as these are.

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

    # how :meth:`resampled_variance` gets the documents' part, as the tables say it
    RESAMPLED = "exact for a mean of documents: their variance over their number"

    @staticmethod
    def scores(units, idx):
        """The score of one run on each row of document indices ``idx`` (resamples x documents)."""
        return 100.0 * np.asarray(units, dtype=float)[idx].mean(axis=-1)

    @staticmethod
    def resampled_variance(units, weights, n_samples=None, seed=None):
        """The variance over resamplings of the documents of each weighted sum of the runs' scores (a row
        of ``weights``, runs wide): exact for a mean of documents, their variance over their number
        (``n_samples`` and ``seed`` unused). ``units``: (..., runs, documents), leading axes kept
        (simulated studies); returns (..., rows)."""
        units = 100.0 * np.asarray(units, dtype=float)
        combined = np.einsum("kr,...rd->...kd", np.asarray(weights, dtype=float), units)
        return combined.var(axis=-1) / units.shape[-1]


class CorpusBleu:
    """sacreBLEU's corpus BLEU, recomputed from the summed per-sentence statistics of the resampled
    sentences (as sacreBLEU's own paired bootstrap does)."""

    RESAMPLED = f"{BOOTSTRAP_SAMPLES} resamples of the sentences, numpy default_rng seed {SEED}"

    def __init__(self):
        from sacrebleu.metrics import BLEU

        self.bleu = BLEU()

    def units(self, hypotheses, references):
        """Each sentence's statistics (matches and totals per n-gram order, lengths)."""
        return np.asarray(self.bleu._extract_corpus_statistics(hypotheses, [references]), dtype=np.int64)

    def scores(self, units, idx):
        summed = np.asarray(units)[idx].sum(axis=-2)
        return np.array([self.bleu._compute_score_from_stats(list(map(int, row))).score for row in summed])

    def resampled_variance(self, units, weights, n_samples=BOOTSTRAP_SAMPLES, seed=SEED, chunk=100):
        """As :meth:`MeanOfDocuments.resampled_variance`, from ``n_samples`` resamples of the sentences
        (the same ones for every run: they are paired): corpus BLEU is no mean of sentences."""
        n_docs = len(units[0])
        rng = np.random.default_rng(seed)
        scored = []
        for start in range(0, n_samples, chunk):
            docs = rng.integers(n_docs, size=(min(chunk, n_samples - start), n_docs))
            scored.append(np.stack([self.scores(u, docs) for u in units]))  # runs x resamples
        return (np.asarray(weights, dtype=float) @ np.concatenate(scored, axis=1)).var(axis=-1, ddof=1)


def test_set_variance(units, n_family, n_baseline, scorer, n_samples=BOOTSTRAP_SAMPLES, seed=SEED):
    """The variance the test documents add to the difference of the two sides' mean scores beyond the
    seeds' spread (each architecture's own strengths on these documents, shared by its seeds): the
    variance of that difference over resampled documents, less each side's run noise, which the
    seeds' spread holds already (a run's deviation from its side's mean varies by (n - 1)/n of it);
    0 where nothing is left. ``units``: the family's runs, then the baseline's (>= 2 a side), all
    over the same documents."""
    n = n_family + n_baseline
    sides = np.r_[np.full(n_family, 1.0 / n_family), np.full(n_baseline, -1.0 / n_baseline)]
    same_side = np.zeros((n, n))
    same_side[:n_family, :n_family] = 1.0 / n_family
    same_side[n_family:, n_family:] = 1.0 / n_baseline
    var = scorer.resampled_variance(units, np.vstack([sides, np.eye(n) - same_side]), n_samples, seed)
    run_f = var[..., 1:1 + n_family].sum(axis=-1) / (n_family - 1)
    run_b = var[..., 1 + n_family:].sum(axis=-1) / (n_baseline - 1)
    return np.maximum(var[..., 0] - run_f / n_family - run_b / n_baseline, 0.0)


def welch(family, baseline, test_set_var=0.0):
    """(difference of the means, its standard error, degrees of freedom, two-sided p) of Welch's t over
    the runs' scores, ``test_set_var`` (:func:`test_set_variance`) added to its variance; the
    Welch-Satterthwaite degrees of freedom of the seeds' part (the documents' counted as known).
    Arrays with leading axes work alike (simulated studies, seeds on the last axis). Only for sides
    :func:`untestable` lets through."""
    from scipy import stats

    family, baseline = np.asarray(family, dtype=float), np.asarray(baseline, dtype=float)
    n_f, n_b = family.shape[-1], baseline.shape[-1]
    var_f, var_b = family.var(axis=-1, ddof=1) / n_f, baseline.var(axis=-1, ddof=1) / n_b
    total = var_f + var_b + test_set_var
    df = total ** 2 / (var_f ** 2 / (n_f - 1) + var_b ** 2 / (n_b - 1))
    difference = family.mean(axis=-1) - baseline.mean(axis=-1)
    se = np.sqrt(total)
    return difference, se, df, 2 * stats.t.sf(np.abs(difference) / se, df)


def welch_interval(difference, se, df, level=0.95):
    """(low, high) of the ``level`` interval of :func:`welch`'s difference."""
    from scipy import stats

    half = stats.t.ppf(0.5 + level / 2, df) * se
    return difference - half, difference + half


def untestable(family, baseline, seeds=None, names=("the family", "the Transformer")):
    """Why the two sides cannot be tested over seeds, or None: fewer than 2 seeds a side, a run
    repeated on a side (identical units: the same hypotheses under two seeds), or a side whose seeds
    all score alike (no spread to test against: Welch's p would be 0). ``family`` and ``baseline``:
    [(score, units)] per seed; ``seeds``: their seed numbers, named in the reason."""
    if len(family) < 2 or len(baseline) < 2:
        return "fewer than 2 seeds a side"
    seeds = seeds or ([i + 1 for i in range(len(family))], [i + 1 for i in range(len(baseline))])
    for runs, side, name in zip((family, baseline), seeds, names):
        for i in range(len(runs)):
            for j in range(i + 1, len(runs)):
                if np.array_equal(runs[i][1], runs[j][1]):
                    return f"{name}'s seeds {side[i]} and {side[j]} are the same run (identical hypotheses)"
        if len({s for s, _ in runs}) == 1:
            return f"{name}'s seeds all score {runs[0][0]:.2f}: no spread between trainings to test against"
    return None


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


def smallest_permutation_p(n_family, n_baseline):
    """The smallest two-sided p a permutation test over the seeds' scores can give: every seed of one
    side above every seed of the other, 2 of the C(n_f + n_b, n_f) splits (0.10 at 3 against 3)."""
    return min(1.0, 2 / math.comb(n_family + n_baseline, n_family))


def holm(p_values):
    """Holm's step-down adjusted p-values, in the order given (None stays None)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted, running = list(p_values), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def holm_first_alpha(p_values, alpha=ALPHA):
    """The level of Holm's first (strictest) step over ``p_values``: alpha over the number tested."""
    return alpha / max(1, sum(p is not None for p in p_values))


def detectable_difference(se, df, alpha=ALPHA, power=POWER):
    """The smallest true difference a two-sided t-test at ``alpha`` with standard error ``se`` and
    ``df`` degrees of freedom (:func:`welch`'s) detects with probability ``power`` (noncentral t)."""
    from scipy import optimize, stats

    crit = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(delta):
        nc = delta / se
        # the far tail is below double precision where scipy's noncentral t returns nan: it is 0 there
        return stats.nct.sf(crit, df, nc) + np.nan_to_num(stats.nct.cdf(-crit, df, nc)) - power

    high = se
    while shortfall(high) < 0:  # one degree of freedom at a strict level needs hundreds of standard errors
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high))


def compare(family, baseline, scorer, n_samples=BOOTSTRAP_SAMPLES, seed=SEED, with_aso=True, seeds=None):
    """Every seed-level figure of a family against the baseline on one metric but the detectable size
    (:func:`study_verdicts` adds it: it depends on how many families are tested), ASO only
    ``with_aso`` (deepsig takes seconds a call). ``family`` and ``baseline``: [(a run's score as its
    record says, its units)] per seed; ``seeds``: (the family's seed numbers, the baseline's)."""
    fs, bs = [s for s, _ in family], [s for s, _ in baseline]
    out = {"seeds": [len(fs), len(bs)], "difference": round(float(np.mean(fs) - np.mean(bs)), 2),
           "sd": [None if len(v) < 2 else round(float(np.std(v, ddof=1)), 3) for v in (fs, bs)],
           "untestable": untestable(family, baseline, seeds), "ci95": None, "welch_p": None, "se": None, "df": None,
           "test_set_sd": None, "aso": None, "detectable": None}
    if out["untestable"] is None:
        doc_var = float(test_set_variance([u for _, u in family + baseline], len(fs), len(bs), scorer, n_samples, seed))
        difference, se, df, p = welch(fs, bs, doc_var)
        low, high = welch_interval(difference, se, df)
        out.update(ci95=[round(float(low), 2), round(float(high), 2)], welch_p=float(p), se=float(se), df=float(df),
                   test_set_sd=round(math.sqrt(doc_var), 3), test_set_part=scorer.RESAMPLED,
                   aso=aso(fs, bs) if with_aso else None)
    return out


def study_verdicts(runs, families, baseline, metrics, headline, n_samples=BOOTSTRAP_SAMPLES):
    """{family: {metric: :func:`compare`}} of every family of ``families`` with runs against
    ``baseline``, with Holm's correction of the ``headline`` metric's Welch p over the families tested
    (``holm_p``), ASO on that metric alone, and each metric's detectable size at Holm's first step
    (``detectable``, at ``detectable_alpha``). ``runs``: {family: [record]}; ``metrics``: {name: (a
    record's score, its units, scorer)}."""
    out = {}
    for fam in families:
        if fam == baseline or not runs.get(fam) or not runs.get(baseline):
            continue
        seeds = ([r["seed"] for r in runs[fam]], [r["seed"] for r in runs[baseline]])
        out[fam] = {name: dict(compare([(score(r), units(r)) for r in runs[fam]],
                                       [(score(r), units(r)) for r in runs[baseline]], scorer, n_samples,
                                       with_aso=name == headline, seeds=seeds),
                               family_seeds=seeds[0], baseline_seeds=seeds[1])
                    for name, (score, units, scorer) in metrics.items()}
    p_values = [v[headline]["welch_p"] for v in out.values()]
    alpha = holm_first_alpha(p_values)
    for v, p in zip(out.values(), holm(p_values)):
        v[headline]["holm_p"] = p
        for e in v.values():
            if e["se"] is not None:
                e.update(detectable=round(detectable_difference(e["se"], e["df"], alpha), 2), detectable_alpha=alpha)
                e.update(se=round(e["se"], 4), df=round(e["df"], 2))
    return out
