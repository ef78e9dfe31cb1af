"""The score step: :func:`score` is the one place that decides how a metric is computed from
hypotheses and references, for ``scripts/evaluate.sh`` (the config's ``eval.metric``), for the
studies (``scripts/reproduce.sh``: their runs and their lead baselines) and for ``scripts/demo.py``.
The metrics are :mod:`man_recipes.metrics`'s records (each declared once there), their scorers
:mod:`man_recipes.scoring`'s.

Metrics (a config's ``eval.metric``):

* ``bleu_ci``: case-insensitive tokenized BLEU (multi-bleu.perl's formula; IWSLT14, Multi30k);
* ``bleu_wmt``: tokenized BLEU with compound splitting (WMT14's convention) and the same without
  compound splitting;
* both BLEU metrics: detokenized sacreBLEU against the untokenized references, or, without them, against
  the Moses-detokenized tokenized references (not the official sacreBLEU setting);
* ``rouge``: ROUGE-1/2/L F1, ROUGE-1.5.5 as files2rouge runs it unless asked otherwise.

The demo's metric, :data:`DEMO_METRIC`, is no config's: sacreBLEU's default BLEU on the tokenized text.
"""

from typing import Callable, List, Optional, Sequence

from man_recipes.metrics import DEMO, Names, Scores, metric as metric_named  # noqa: F401  (Names, Scores: the step's types)

# the demo's BLEU: sacreBLEU's default (exponential smoothing, case-sensitive) on the tokenized text,
# unrounded (scoring.sacrebleu_tokenized)
DEMO_METRIC = DEMO.name


def score(metric: str, hyps: Sequence[str], refs: Sequence[str], *, raw_refs: Optional[Sequence[str]] = None,
          target_lang: Optional[str] = None, rouge_order: str = "hyp-ref", rouge_implementation: str = "rouge155",
          rouge_exception_db: Optional[str] = None, names: Names = Names(),
          keep_detokenized: Optional[Callable[[List[str]], object]] = None) -> Scores:
    """``metric`` (the name of a :mod:`man_recipes.metrics` record: a config's ``eval.metric`` or
    :data:`DEMO_METRIC`) of ``hyps`` against ``refs``, one per line.

    ``refs``: the references BLEU's tokenized scores and ROUGE read. ``raw_refs``: the untokenized
    references of sacreBLEU (without them: the Moses-detokenized ``refs``). ``target_lang``: the Moses
    detokenizer's language. ``rouge_*``: :func:`man_recipes.scoring.rouge`'s options.
    ``keep_detokenized``: called with the detokenized hypotheses before sacreBLEU reads them (evaluate.sh
    writes them to the file ``names.detok_hyps`` names). Misaligned or blank inputs raise
    :class:`~man_recipes.scoring.ScoreInputError` naming them as ``names`` says."""
    m = metric_named(metric)
    return m.scores(m, hyps, refs, raw_refs=raw_refs, target_lang=target_lang, rouge_order=rouge_order,
                    rouge_implementation=rouge_implementation, rouge_exception_db=rouge_exception_db, names=names,
                    keep_detokenized=keep_detokenized)
