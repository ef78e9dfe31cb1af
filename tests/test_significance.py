"""The studies' second p-value, paired approximate randomization (issue 47): over documents for ROUGE
(rouge_significance.paired_randomization), sacreBLEU's paired AR for BLEU (bleu_table), each on
cases whose answer is known."""

import random
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from man_recipes.studies.rouge_significance import AR_TRIALS, BOOTSTRAP_SEED, paired_randomization
from man_recipes.studies import bleu_table


def _documents(n=300, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0.1, 0.6, n)


def test_a_system_against_itself_is_not_significant():
    base = _documents()
    assert paired_randomization(base, base)["p_value"] == 1.0
    # the same scores in another array, and a constant 0 difference per document: every trial ties
    assert paired_randomization(base, base.copy(), n_trials=500)["p_value"] == 1.0


def test_a_constant_shift_is_as_significant_as_the_trials_allow():
    base = _documents()
    shifted = paired_randomization(base, base + 0.01, n_trials=2000)
    # every swap of a +0.01 document lowers |mean difference|; only the identity (never drawn) reaches it
    assert shifted["p_value"] == pytest.approx(1 / 2001)
    assert shifted["system"] > shifted["baseline"]
    assert paired_randomization(base + 0.01, base, n_trials=2000)["p_value"] == shifted["p_value"]  # two-sided


def test_equals_the_exact_permutation_test_on_few_documents():
    """8 documents: all 256 sign patterns give the exact p; 20,000 trials land within 0.01 of it."""
    diff = np.array([0.05, 0.03, -0.04, 0.04, 0.02, -0.05, 0.06, -0.03])
    base = np.random.default_rng(3).uniform(0.2, 0.4, 8)
    signs = np.array([[1 - 2 * ((k >> i) & 1) for i in range(8)] for k in range(256)])
    exact = np.mean(np.abs(signs @ diff) / 8 >= abs(diff.mean()) - 1e-12)
    got = paired_randomization(base, base + diff, n_trials=20000)["p_value"]
    assert 0.05 < exact < 0.95 and got == pytest.approx(exact, abs=0.01)


class _MeanScore:
    """A metric whose corpus score is the mean of its documents' scores, in sacreBLEU's Metric interface
    (sufficient statistics: the score and a count per document)."""

    def __init__(self, scores_by_line):
        self.scores = scores_by_line

    def _extract_corpus_statistics(self, hypotheses, references):
        return np.array([[self.scores[h], 1.0] for h in hypotheses])

    def _aggregate_and_compute(self, stats):
        from sacrebleu.metrics.base import Score

        total = np.asarray(stats).sum(0)
        return Score("mean", float(total[0] / total[1]))


def test_equals_sacrebleus_approximate_randomization_on_a_mean_score():
    """sacreBLEU's own AR (its _paired_ar_test), run on a metric that is a mean over documents, gives the
    p of our ROUGE test on the same document scores: the same draws, the same statistic."""
    from sacrebleu.significance import _paired_ar_test

    base, system = _documents(200, 1), _documents(200, 1) + np.random.default_rng(2).normal(0.01, 0.08, 200)
    lines = {f"b{i}": v for i, v in enumerate(base)} | {f"s{i}": v for i, v in enumerate(system)}
    metric = _MeanScore(lines)
    base_stats = metric._extract_corpus_statistics([f"b{i}" for i in range(200)], None)
    _, results = _paired_ar_test({"mean": (base_stats, metric._aggregate_and_compute(base_stats))}, "system",
                                 [f"s{i}" for i in range(200)], None, {"mean": metric}, n_samples=3000,
                                 seed=BOOTSTRAP_SEED)
    ours = paired_randomization(base, system, n_trials=3000)["p_value"]
    assert 0.01 < ours < 0.9 and ours == pytest.approx(results["mean"].p_value, abs=1e-12)


def _captions(n=60, seed=0):
    rng = random.Random(seed)
    words = "a the dog cat man runs sits in on park beach red big small".split()
    return [" ".join(rng.choice(words) for _ in range(8)) for _ in range(n)]


def _noisy(refs, p, seed):
    r = random.Random(seed)
    words = sorted({w for s in refs for w in s.split()})
    return [" ".join(w if r.random() > p else r.choice(words) for w in s.split()) for s in refs]


def test_bleu_randomization_is_sacrebleus_cli(tmp_path):
    """The table's BLEU AR p is what `sacrebleu REF -i BASE SYS --paired-ar --paired-ar-n N` prints."""
    refs = _captions()
    base, system = _noisy(refs, 0.35, 1), _noisy(refs, 0.3, 2)
    for name, lines in (("ref", refs), ("base", base), ("sys", system)):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    ours = bleu_table.paired_randomization(base, system, refs, n_trials=2000)
    cli = subprocess.run([str(Path(sys.executable).parent / "sacrebleu"), tmp_path / "ref.txt", "-i", tmp_path / "base.txt",
                          tmp_path / "sys.txt", "--paired-ar", "--paired-ar-n", "2000", "-m", "bleu"],
                         capture_output=True, text=True, check=True, env={"SACREBLEU_SEED": "12345", "PATH": ""})
    p = json.loads(cli.stdout)[1]["BLEU"]["p_value"]  # its JSON output: the baseline, then the system
    assert ours["p_value"] == pytest.approx(p, abs=1e-12) and 0.01 < p < 0.99
    assert "ar:2000" in ours["signature"]


def test_bleu_randomization_on_known_cases():
    refs = _captions(80)
    same = _noisy(refs, 0.3, 1)
    assert bleu_table.paired_randomization(same, same, refs, n_trials=200)["p_value"] == 1.0
    much_better = bleu_table.paired_randomization(_noisy(refs, 0.7, 3), refs, refs, n_trials=1000)
    assert much_better["p_value"] == pytest.approx(1 / 1001) and much_better["system_bleu"] == 100.0
    assert AR_TRIALS == 10000  # sacreBLEU's --paired-ar-n default, the tables' count
