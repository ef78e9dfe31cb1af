"""The score step: :func:`score` is the one place that decides how a metric is computed from
hypotheses and references, for ``scripts/evaluate.sh`` (the config's ``eval.metric``), for the
studies (``scripts/reproduce.sh``: their runs and their lead baselines) and for ``scripts/demo.py``.
The scorers themselves are :mod:`man_recipes.scoring`'s.

Metrics (a config's ``eval.metric``):

* ``bleu_ci``: case-insensitive tokenized BLEU (multi-bleu.perl's formula; IWSLT14, Multi30k);
* ``bleu_wmt``: tokenized BLEU with compound splitting (WMT14's convention) and the same without
  compound splitting;
* both BLEU metrics: detokenized sacreBLEU against the untokenized references, or, without them, against
  the Moses-detokenized tokenized references (not the official sacreBLEU setting);
* ``rouge``: ROUGE-1/2/L F1, ROUGE-1.5.5 as files2rouge runs it unless asked otherwise.

The demo's metric, :data:`DEMO_METRIC`, is no config's: sacreBLEU's default BLEU on the tokenized text.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from man_recipes import scoring
from man_recipes.config import METRICS


# the demo's BLEU: sacreBLEU's default (exponential smoothing, case-sensitive) on the tokenized text,
# unrounded (scoring.sacrebleu_tokenized)
DEMO_METRIC = "sacrebleu_tokenized"


@dataclass(frozen=True)
class Names:
    """How errors name the inputs (their files): the hypotheses, the (tokenized) references, the
    detokenized hypotheses sacreBLEU reads (default: as the hypotheses) and the untokenized references."""
    hyps: str = "hypotheses"
    refs: str = "references"
    detok_hyps: Optional[str] = None
    raw_refs: str = "raw references"


@dataclass
class Scores:
    """What :func:`score` computed; a field is None where the metric has no such score."""
    metric: str
    bleu: Optional[dict] = None  # tokenized BLEU (compound-split for bleu_wmt), scoring.tokenized_bleu's dict;
    # DEMO_METRIC: {"bleu": its unrounded score}
    bleu_no_compound_split: Optional[dict] = None  # bleu_wmt only
    sacrebleu: Optional[dict] = None  # scoring.sacrebleu_detok's dict
    detokenized: Optional[List[str]] = None  # the hypotheses sacreBLEU scored
    rouge: Optional[dict] = None  # scoring.rouge's dict
    rouge_order: Optional[str] = None

    def summary(self) -> str:
        """One line for a log."""
        if self.rouge is not None:
            r = self.rouge
            return f"ROUGE-1/2/L {r['rouge1']:.2f}/{r['rouge2']:.2f}/{r['rougeL']:.2f}"
        line = f"tokenized BLEU {self.bleu['bleu']:.2f}"
        return f"sacreBLEU {self.sacrebleu['bleu']:.2f}, {line}" if self.sacrebleu is not None else line


def score(metric: str, hyps: Sequence[str], refs: Sequence[str], *, raw_refs: Optional[Sequence[str]] = None,
          target_lang: Optional[str] = None, rouge_order: str = "hyp-ref", rouge_implementation: str = "rouge155",
          rouge_exception_db: Optional[str] = None, names: Names = Names(),
          keep_detokenized: Optional[Callable[[List[str]], object]] = None) -> Scores:
    """``metric`` (a config's ``eval.metric``, :data:`..config.METRICS`, or :data:`DEMO_METRIC`) of
    ``hyps`` against ``refs``, one per line.

    ``refs``: the references BLEU's tokenized scores and ROUGE read. ``raw_refs``: the untokenized
    references of sacreBLEU (without them: the Moses-detokenized ``refs``). ``target_lang``: the Moses
    detokenizer's language. ``rouge_*``: :func:`man_recipes.scoring.rouge`'s options.
    ``keep_detokenized``: called with the detokenized hypotheses before sacreBLEU reads them (evaluate.sh
    writes them to the file ``names.detok_hyps`` names). Misaligned or blank inputs raise
    :class:`~man_recipes.scoring.ScoreInputError` naming them as ``names`` says."""
    if metric == "rouge":
        r = scoring.rouge(hyps, refs, implementation=rouge_implementation, order=rouge_order,
                          names=(names.hyps, names.refs), exception_db=rouge_exception_db)
        return Scores(metric, rouge=r, rouge_order=rouge_order)
    if metric == DEMO_METRIC:
        return Scores(metric, bleu={"bleu": scoring.sacrebleu_tokenized(hyps, refs, names=(names.hyps, names.refs))})
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, not {metric!r}")
    wmt = metric == "bleu_wmt"
    out = Scores(metric, bleu=scoring.tokenized_bleu(hyps, refs, lowercase=not wmt, compound=wmt,
                                                     names=(names.hyps, names.refs)))
    if wmt:
        out.bleu_no_compound_split = scoring.tokenized_bleu(hyps, refs, names=(names.hyps, names.refs))
    out.detokenized = scoring.moses_detokenize(hyps, target_lang)
    raw_name = names.raw_refs
    if raw_refs is None:
        raw_name, raw_refs = "Moses-detokenized " + names.refs, scoring.moses_detokenize(refs, target_lang)
    if keep_detokenized is not None:
        keep_detokenized(out.detokenized)
    out.sacrebleu = scoring.sacrebleu_detok(out.detokenized, raw_refs, names=(names.detok_hyps or names.hyps, raw_name))
    return out
