"""ROUGE's significance tests over documents, the summarization studies' two p-values per seed: whether
two trained networks differ on these documents (test-set sampling), not whether two architectures do
(that is :mod:`..studies.seed_level`, over seeds).

ROUGE-1.5.5's Average_F is a mean over documents of each document's F1, so resampling or swapping
documents resamples or swaps the score.

* :func:`paired_bootstrap`: sacreBLEU's paired bootstrap (Koehn 2004, as ``sacrebleu --paired-bs``
  computes it for BLEU): the same resampled document indices for both systems, ``|mean_sys -
  mean_base|`` per resample centred on its mean, and ``p = (#{resampled statistic > observed
  difference} + 1) / (n + 1)``; 1 where the two systems' document scores are identical. The field
  reports it; its statistic reads a near-zero difference as more significant than it is.
* :func:`paired_randomization`: paired approximate randomization (Noreen 1989; ``sacrebleu
  --paired-ar`` for BLEU): each trial swaps each document's two scores with probability 1/2 (the
  null: the two systems are exchangeable), statistic ``|mean difference|``, ``p = (#{trial
  statistic >= observed} + 1) / (n + 1)``. sacreBLEU counts
  ``>`` instead of ``>=``: the two differ only on exact ties, and a system against itself then
  gets 1 here (every trial ties), ``1/(n+1)`` from sacreBLEU.
"""

import numpy as np

BOOTSTRAP_SEED = 12345  # sacreBLEU's default seed (SACREBLEU_SEED)


def scored_documents(hyps, refs, order, exception_db):
    """ROUGE-1.5.5's scores as files2rouge runs it (``rouge1`` ... : its Average_F x100, a run's score,
    which its bootstrap makes other than the documents' mean) and ``documents``: each document's F1."""
    from man_recipes import scoring

    return scoring.rouge(hyps, refs, order=order, exception_db=exception_db, per_document=True)


def paired_bootstrap(baseline, system, n_samples=1000, seed=BOOTSTRAP_SEED):
    """p-value of ``system``'s per-document scores against ``baseline``'s (same documents, same order)."""
    b, s = np.asarray(baseline, dtype=float), np.asarray(system, dtype=float)
    if b.shape != s.shape or b.ndim != 1 or len(b) == 0:
        raise ValueError(f"paired bootstrap: {len(b)} baseline and {len(s)} system document scores")
    idx = np.random.default_rng(seed).choice(len(b), size=(n_samples, len(b)), replace=True)
    observed = abs(s.mean() - b.mean())
    resampled = np.abs(s[idx].mean(axis=1) - b[idx].mean(axis=1))
    stats = resampled - resampled.mean()
    # identical scores: nothing to test (sacreBLEU's formula would give 1/(n+1), i.e. "significant")
    p = 1.0 if observed == 0 else (int(np.sum(stats > observed)) + 1) / (n_samples + 1)
    return {"p_value": p, "baseline": round(100 * float(b.mean()), 2), "system": round(100 * float(s.mean()), 2),
            "n_documents": len(b), "n_samples": n_samples, "seed": seed}


AR_TRIALS = 10000  # sacreBLEU's --paired-ar-n default
# what |mean difference| may lose to summation order and still be a tie (scores are in [0, 1])
TIE_TOLERANCE = 1e-12


def paired_randomization(baseline, system, n_trials=AR_TRIALS, seed=BOOTSTRAP_SEED):
    """p-value of approximate randomization of ``system``'s per-document scores against ``baseline``'s
    (same documents, same order). The swaps are drawn as sacreBLEU's ``_paired_ar_test`` draws them
    (``default_rng(seed).integers(2, size=(n_trials, n_documents), dtype=bool)``), so on a metric that
    is a mean over documents the two give the same p but on exact ties."""
    b, s = np.asarray(baseline, dtype=float), np.asarray(system, dtype=float)
    if b.shape != s.shape or b.ndim != 1 or len(b) == 0:
        raise ValueError(f"approximate randomization: {len(b)} baseline and {len(s)} system document scores")
    diff = s - b
    observed = abs(diff.mean())
    swaps = np.random.default_rng(seed).integers(2, size=(n_trials, len(b)), dtype=bool)
    count = 0
    for start in range(0, n_trials, 1000):  # 1,000 trials at a time: a float matrix of 10,000 x 13,368 is 1 GB
        signs = 1.0 - 2.0 * swaps[start:start + 1000]
        count += int(np.sum(np.abs(signs @ diff) / len(b) >= observed - TIE_TOLERANCE))
    return {"p_value": (count + 1) / (n_trials + 1), "baseline": round(100 * float(b.mean()), 2),
            "system": round(100 * float(s.mean()), 2), "n_documents": len(b), "n_trials": n_trials, "seed": seed}


def lead_words(article, n):
    """The lead baseline of headline generation: the article's first ``n`` tokens."""
    return " ".join(article.split()[:n])


# sentence-final tokens of PTB-tokenized text, and what may close a sentence after them
SENTENCE_END = {".", "!", "?"}
CLOSERS = {"\'\'", "\'", "-rrb-", ")", "-rsb-", "]"}


def lead_sentences(article, n):
    """The lead baseline of news summarization (lead-3): the article's first ``n`` sentences. See et
    al.'s text keeps no sentence boundaries in the article, so a sentence ends at a ``.``, ``!`` or
    ``?`` token and the closing quotes or brackets that follow it (``... northeast ! '' says`` ends
    after ``''``)."""
    tokens, out, sentences = article.split(), [], 0
    for i, tok in enumerate(tokens):
        out.append(tok)
        closing = tok in CLOSERS and len(out) > 1 and (out[-2] in SENTENCE_END or out[-2] in CLOSERS)
        ends = (tok in SENTENCE_END or closing) and (i + 1 == len(tokens) or tokens[i + 1] not in CLOSERS)
        if ends:
            sentences += 1
            if sentences == n:
                break
    return " ".join(out)
