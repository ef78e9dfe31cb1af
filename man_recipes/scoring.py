"""Scores used by the papers: tokenized BLEU (optionally with compound splitting), detokenized
sacreBLEU, and ROUGE-1/2/L F1.

* Tokenized BLEU = multi-bleu.perl / fairseq-score: corpus BLEU-4 on whitespace tokens, no
  smoothing, brevity penalty exp(1 - r/c) when c < r. Computed with sacreBLEU's implementation of
  the same formula (``tokenize='none'``, ``smooth_method='none'``).
* Compound splitting (the usual WMT14 En-De convention, fairseq's ``compound_split_bleu.sh`` and
  tensor2tensor's ``get_ende_bleu.sh``): ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`` on hypotheses and
  references, so a hyphenated compound counts as three tokens. Reproduced with the same regex,
  including its non-overlapping behaviour on ``a-b-c`` (Perl and Python agree).
* ROUGE: ROUGE-1.5.5 (the Perl package the papers used) exactly as ``files2rouge`` runs it
  (:mod:`.rouge155`); Google's ``rouge-score`` only when asked for, and the result names which
  one produced the numbers.

Every scorer first calls :func:`check_aligned` (:mod:`man_recipes.textfile`): sacreBLEU zips unequal
streams without a word (4 hypotheses against 2 references score 100.0) and scores blank references 0, so a truncated,
shifted or empty file would otherwise give a wrong number with exit status 0.
"""

import re

from man_recipes.textfile import ScoreInputError, check_aligned  # noqa: F401  (scoring.ScoreInputError: the scorers' error)

COMPOUND_RE = re.compile(r"(\S)-(\S)")


def compound_split(line):
    return COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


def _aligned(hyps, refs, names, blank_reference_lines=True):
    """(hypotheses, references) as lists, refused by :func:`check_aligned` unless one per sentence."""
    hyp_name, ref_name = names or ("hypotheses", "references")
    return check_aligned([(hyp_name, hyps), (ref_name, refs)], references=ref_name,
                         blank_reference_lines=blank_reference_lines)


def tokenized_bleu(hyps, refs, lowercase=False, compound=False, names=None):
    """Corpus BLEU on already tokenized text; returns a dict with the score and its parts.
    ``names``: (hypotheses, references) as the error names them, e.g. their files."""
    import sacrebleu

    hyps, refs = _aligned(hyps, refs, names)
    prep = (lambda s: compound_split(s.strip())) if compound else (lambda s: s.strip())
    hyps = [prep(h) for h in hyps]
    refs = [prep(r) for r in refs]
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", lowercase=lowercase,
                                  force=True)
    res = bleu.corpus_score(hyps, [refs])
    return {
        "bleu": round(res.score, 2),
        "precisions": [round(p, 2) for p in res.precisions],
        "bp": round(res.bp, 4), "sys_len": res.sys_len, "ref_len": res.ref_len,
        "lowercase": lowercase, "compound_split": compound,
        "implementation": "multi-bleu.perl formula (sacrebleu, tokenize=none, no smoothing)",
    }


def sacrebleu_tokenized(hyps, refs, names=None):
    """sacreBLEU's default BLEU (exponential smoothing, case-sensitive) on already tokenized text
    (``tokenize='none'``), unrounded: ``scripts/demo.py``'s score."""
    import sacrebleu

    hyps, refs = _aligned(hyps, refs, names)
    return sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score


def sacrebleu_detok(detok_hyps, raw_refs, names=None):
    """Standard detokenized sacreBLEU (13a, case-sensitive) with its signature."""
    import sacrebleu

    detok_hyps, raw_refs = _aligned(detok_hyps, raw_refs, names)
    bleu = sacrebleu.metrics.BLEU()
    res = bleu.corpus_score(detok_hyps, [raw_refs])
    return {"bleu": round(res.score, 2), "signature": str(bleu.get_signature()),
            "score_line": str(res)}


def moses_detokenize(lines, lang):
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    return [md.detokenize(line.split()) for line in lines]


# --------------------------------------------------------------------------------------- ROUGE

# Which file goes in which of files2rouge's slots (REFERENCE SUMMARY). Summary-level ROUGE-L is
# not symmetric, so this changes ROUGE-L (ROUGE-N is symmetric); docs/summarization-scoring.md
# gives the measured difference.
ROUGE_ORDERS = {
    # the MAN authors' test scripts and fairseq's BART README: `files2rouge HYPOTHESES REFERENCES`,
    # so ROUGE's model slot holds the hypotheses; the default, to score as the papers did
    "hyp-ref": "files2rouge HYPOTHESES REFERENCES (the MAN authors' and BART's call)",
    # files2rouge's documented order: references as ROUGE's models
    "ref-hyp": "files2rouge REFERENCES HYPOTHESES (files2rouge's documented order)",
}
ROUGE_IMPLEMENTATIONS = ("rouge155", "rouge-score")


def rouge(hyps, refs, implementation="rouge155", order="hyp-ref", eos=".", names=None, exception_db=None,
          per_document=False):
    """ROUGE-1/2/L F1 (x100) of one hypothesis against one reference per line.

    ``rouge155``: ROUGE-1.5.5 exactly as files2rouge runs it (:mod:`.rouge155`); raises
    :class:`~.rouge155.Rouge155Unavailable` naming what to install when Perl cannot run it.
    ``rouge-score``: Google's reimplementation, only when asked for; its ``rougeL`` is one LCS over
    the whole line, so the ROUGE-L reported is its ``rougeLsum`` on text split into sentences at
    ``" " + eos`` (files2rouge's split), the quantity closer to ROUGE-1.5.5's summary-level LCS.
    ``exception_db``: ROUGE-1.5.5's WordNet exception database (:data:`.rouge155.EXCEPTION_DBS`;
    default files2rouge's, as the published numbers). ``per_document``: also each line's F1
    (``scores["documents"]``, {"rouge1": [...], ...}), for the paired bootstrap."""
    from man_recipes import rouge155

    exception_db = exception_db or rouge155.DEFAULT_EXCEPTION_DB
    hyps, refs = _aligned(hyps, refs, names, blank_reference_lines=False)  # a blank one would score 0
    if order not in ROUGE_ORDERS:
        raise ValueError(f"ROUGE order must be one of {sorted(ROUGE_ORDERS)}, not {order!r}")
    first, second = (hyps, refs) if order == "hyp-ref" else (refs, hyps)
    hyp_name, ref_name = names or ("hypotheses", "references")
    for name, texts in ((hyp_name, hyps), (ref_name, refs)):  # both implementations drop such letters
        rouge155.check_ascii_letters(texts, name)
    if implementation == "rouge155":
        # an empty hypothesis scores 0 and stays in the average (files2rouge would stop)
        output, _ = rouge155.run(first, second, eos=eos, empty_scores_zero=True, exception_db=exception_db,
                                 per_document=per_document,
                                 names=(hyp_name, ref_name) if order == "hyp-ref" else (ref_name, hyp_name))
        scores = rouge155.average_f(output)
        scores["implementation"] = (f"ROUGE-1.5.5 as files2rouge runs it (-c 95 -r 1000 -n 2 -a -m, "
                                    f"sentences split at ' {eos}'), {ROUGE_ORDERS[order]}; "
                                    f"WordNet exceptions: {rouge155.EXCEPTION_DB_NOTES[exception_db]}; "
                                    "an empty line scores 0")
        scores["exception_db"] = exception_db
        if per_document:
            scores["documents"] = rouge155.document_f(output, len(hyps))
        return scores
    if implementation != "rouge-score":
        raise ValueError(f"ROUGE implementation must be one of {ROUGE_IMPLEMENTATIONS}, not {implementation!r}")

    from importlib.metadata import version as pkg_version

    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeLsum": 0.0}
    for model, peer in zip(first, second):  # rouge-score's (target, prediction) = ROUGE's (model, peer)
        s = scorer.score(rouge155.split_sentences(model.strip(), eos), rouge155.split_sentences(peer.strip(), eos))
        for k in totals:
            totals[k] += s[k].fmeasure
    n = len(hyps)
    scores = {k: round(100 * v / n, 2) for k, v in totals.items()}
    scores["rougeL"] = scores.pop("rougeLsum")
    scores["implementation"] = (
        f"rouge-score {pkg_version('rouge-score')} (Python reimplementation, Porter stemmer, mean F1; "
        f"rougeL column = its rougeLsum on sentences split at ' {eos}'), {ROUGE_ORDERS[order]}; "
        "not ROUGE-1.5.5: not comparable to the papers to the decimal")
    return scores
