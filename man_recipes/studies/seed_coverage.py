"""How often the seed-level interval (:func:`seed_level.welch_interval`, with
:func:`seed_level.test_set_variance`) covers the true difference of two architectures, on simulated
studies whose truth is known: the figure the study tables print beside the interval, and what
``tests/test_seed_level.py`` holds within a tolerance of 95 %.

Each simulated study draws a test set of documents and, per seed, one run of either architecture.
A run's per-document score is the document's difficulty (shared by every run), its architecture's
own strength on that document (shared by the architecture's seeds: the part of the difference a
test set makes), the run's offset (its training: the seeds' spread, wider for the family, as MAN's
on Gigaword), and the run's own noise on the document. The true difference is that of the two
architectures over all documents and trainings: ``TRUE_DIFFERENCE``.
"""

import numpy as np

from man_recipes.studies import seed_level

SEEDS_A_SIDE = (2, 3, 5)  # the studies' seed counts and the next step up
STUDIES = 4000  # simulated studies a seed count: the coverage's Monte Carlo error about 0.35 %
DOCUMENTS = 100
TRUE_DIFFERENCE = 1.0  # score points
DIFFICULTY_SD = 15.0  # of a document's difficulty, score points
# standard deviations, in score points: of an architecture's strength on a document, of a run's training
# offset (the family's, the baseline's) and of a run's noise on a document. The tables' figure: all
# three parts matter; the tests also take one where the seeds' spread is nearly all of it
SPREADS = {"documents matter": (3.0, 1.2, 0.6, 6.0), "seeds dominate": (1.0, 2.0, 0.5, 2.0)}


def simulated_units(n_seeds, studies=STUDIES, documents=DOCUMENTS, seed=seed_level.SEED, spread="documents matter"):
    """(studies, 2 n_seeds runs, documents) per-document scores / 100 (the units of
    :class:`seed_level.MeanOfDocuments`), the family's ``n_seeds`` runs first; ``spread``: one of :data:`SPREADS`."""
    architecture, family_seeds, baseline_seeds, noise = SPREADS[spread]
    rng = np.random.default_rng(seed)
    shape, runs = (studies, 1, documents), (studies, n_seeds, documents)
    difficulty = 40 + rng.normal(0, DIFFICULTY_SD, shape)
    family = (TRUE_DIFFERENCE + difficulty + rng.normal(0, architecture, shape)
              + rng.normal(0, family_seeds, (studies, n_seeds, 1)) + rng.normal(0, noise, runs))
    baseline = (difficulty + rng.normal(0, architecture, shape)
                + rng.normal(0, baseline_seeds, (studies, n_seeds, 1)) + rng.normal(0, noise, runs))
    return np.concatenate([family, baseline], axis=1) / 100


def coverage(n_seeds, studies=STUDIES, documents=DOCUMENTS, seed=seed_level.SEED, with_test_set=True,
             spread="documents matter"):
    """The share of simulated studies with ``n_seeds`` seeds a side whose 95 % interval covers the
    true difference (``with_test_set=False``: Welch's over the seeds alone, without the documents' part)."""
    units = simulated_units(n_seeds, studies, documents, seed, spread)
    scorer = seed_level.MeanOfDocuments()
    scores = 100 * units.mean(axis=-1)
    doc_var = seed_level.test_set_variance(units, n_seeds, n_seeds, scorer) if with_test_set else 0.0
    difference, se, df, _ = seed_level.welch(scores[:, :n_seeds], scores[:, n_seeds:], doc_var)
    low, high = seed_level.welch_interval(difference, se, df)
    return float(np.mean((low <= TRUE_DIFFERENCE) & (TRUE_DIFFERENCE <= high)))


def coverage_line():
    """The table's sentence on the interval's coverage, computed here, not copied."""
    shares = ", ".join(f"{100 * coverage(n):.1f} % at {n}" for n in SEEDS_A_SIDE)
    return (f"The interval's coverage on {STUDIES:,} simulated studies per seed count (`man_recipes/studies/seed_coverage.py`: a known "
            f"true difference, scores that are means of {DOCUMENTS} documents, the family's seeds spread twice the "
            f"Transformer's, each architecture's own strengths on the documents and each run's noise on them): "
            f"{shares} seeds a side, where 95 % is aimed at.")
