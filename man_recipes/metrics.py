"""The one template of a metric: a :class:`Metric` record, declared once with :func:`register_metric`.

A metric declares

* ``name``: what a config's ``eval.metric`` says (``config=False``: no config's, e.g. the demo's);
* ``kind``: which scores it writes, ``"bleu"`` (tokenized BLEU, and sacreBLEU where ``sacrebleu``) or
  ``"rouge"`` (ROUGE-1/2/L F1): the results' fields, the tables' columns, the ROUGE options it reads;
* ``scores``: how it scores, ``scores(metric, hyps, refs, **options) -> Scores`` (:func:`score_bleu`,
  :func:`score_rouge`, :func:`score_demo` or a new one over :mod:`man_recipes.scoring`);
* ``references``: which references it reads, ``"tokenized+raw"`` (tokenized BLEU on fairseq's target
  lines, sacreBLEU on the raw references data-prep keeps, their Moses detokenization without them) or
  ``"raw"`` (the raw references alone, the test set decoded from its sources) or ``"tokenized"``
  (fairseq's target lines alone);
* ``help``: one line saying what it is;
* ``signature``: the key its score's signature has in a record (``sacrebleu_signature``), or None;
* ``lowercase`` / ``compound_split``: tokenized BLEU's settings; ``sacrebleu_column``: the paper
  tables show our sacreBLEU beside the paper's BLEU; ``experiment``: the name an experiment
  (``studies/experiments.py``) gives it.

Every site that treats metrics differently reads these fields (:func:`metric`, :func:`config_metrics`,
:func:`experiment_metric`), never a metric's name, so a new metric is one ``register_metric(Metric(...))``
below (docs/architecture.md, "Where a new metric goes").
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from man_recipes import scoring


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
    """What a metric computed; a field is None where the metric has no such score."""
    metric: str
    bleu: Optional[dict] = None  # tokenized BLEU (compound-split for bleu_wmt), scoring.tokenized_bleu's dict;
    # the demo's metric: {"bleu": its unrounded score}
    bleu_no_compound_split: Optional[dict] = None  # compound-splitting BLEU only
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


@dataclass(frozen=True)
class Metric:
    """One metric; the module's docstring says what each field means."""
    name: str
    kind: str
    scores: Callable[..., Scores]
    references: str
    help: str
    signature: Optional[str] = None
    lowercase: bool = False
    compound_split: bool = False
    sacrebleu: bool = False
    sacrebleu_column: bool = False
    experiment: Optional[str] = None
    config: bool = True

    KINDS = ("bleu", "rouge")
    REFERENCES = ("tokenized+raw", "raw", "tokenized")

    @property
    def is_rouge(self) -> bool:
        return self.kind == "rouge"

    @property
    def raw_references_only(self) -> bool:
        """Scores against the raw references alone: the test set is decoded from its sources."""
        return self.references == "raw"


METRICS: Dict[str, Metric] = {}  # name -> Metric, in declaration order


def register_metric(m: Metric) -> Metric:
    """Declare ``m``; a second metric of one name, or a field outside its valid values, is refused."""
    if m.name in METRICS:
        raise ValueError(f"metric {m.name!r} is already registered")
    if m.sacrebleu and not m.signature:
        raise ValueError(f"metric {m.name!r}: sacreBLEU's signature needs its key in a record (signature=...)")
    if m.kind not in Metric.KINDS or m.references not in Metric.REFERENCES:
        raise ValueError(f"metric {m.name!r}: kind must be one of {Metric.KINDS} and references one of "
                         f"{Metric.REFERENCES}, not {m.kind!r} / {m.references!r}")
    METRICS[m.name] = m
    return m


def config_metrics() -> List[str]:
    """The names a config's ``eval.metric`` may hold, sorted."""
    return sorted(name for name, m in METRICS.items() if m.config)


def metric(name: str) -> Metric:
    """The metric ``name``; an unknown one is a ValueError naming the choices."""
    if name not in METRICS:
        raise ValueError(f"metric must be one of {config_metrics()}, not {name!r}")
    return METRICS[name]


def experiment_metric(name: str) -> Metric:
    """The metric an experiment (``studies/experiments.py``) calls ``name``."""
    found = [m for m in METRICS.values() if m.experiment == name]
    if not found:
        raise ValueError(f"no metric is an experiment's {name!r}")
    return found[0]


def score_bleu(m: Metric, hyps: Sequence[str], refs: Sequence[str], *, raw_refs=None, target_lang=None,
               names: Names = Names(), keep_detokenized=None, **_rouge_options) -> Scores:
    """Tokenized BLEU as ``m`` sets it (with compound splitting also the same without), then
    sacreBLEU of the Moses-detokenized hypotheses against ``raw_refs`` (without them: the
    Moses-detokenized ``refs``, not the official sacreBLEU setting)."""
    pair = (names.hyps, names.refs)
    out = Scores(m.name, bleu=scoring.tokenized_bleu(hyps, refs, lowercase=m.lowercase, compound=m.compound_split,
                                                     names=pair))
    if m.compound_split:
        out.bleu_no_compound_split = scoring.tokenized_bleu(hyps, refs, names=pair)
    if not m.sacrebleu:
        return out
    out.detokenized = scoring.moses_detokenize(hyps, target_lang)
    raw_name = names.raw_refs
    if raw_refs is None:
        raw_name, raw_refs = "Moses-detokenized " + names.refs, scoring.moses_detokenize(refs, target_lang)
    if keep_detokenized is not None:
        keep_detokenized(out.detokenized)
    out.sacrebleu = scoring.sacrebleu_detok(out.detokenized, raw_refs, names=(names.detok_hyps or names.hyps, raw_name))
    return out


def score_rouge(m: Metric, hyps, refs, *, rouge_order="hyp-ref", rouge_implementation="rouge155",
                rouge_exception_db=None, names: Names = Names(), **_bleu_options) -> Scores:
    """ROUGE-1/2/L F1 of ``hyps`` against ``refs`` (:func:`man_recipes.scoring.rouge`)."""
    r = scoring.rouge(hyps, refs, implementation=rouge_implementation, order=rouge_order,
                      names=(names.hyps, names.refs), exception_db=rouge_exception_db)
    return Scores(m.name, rouge=r, rouge_order=rouge_order)


def score_demo(m: Metric, hyps, refs, *, names: Names = Names(), **_options) -> Scores:
    """sacreBLEU's default BLEU on the tokenized text, unrounded (:func:`scoring.sacrebleu_tokenized`)."""
    return Scores(m.name, bleu={"bleu": scoring.sacrebleu_tokenized(hyps, refs, names=(names.hyps, names.refs))})


# The metrics. A new one is one more declaration here.
BLEU_CI = register_metric(Metric(
    "bleu_ci", "bleu", score_bleu, "tokenized+raw", "case-insensitive tokenized BLEU (multi-bleu.perl's formula; "
    "IWSLT14, Multi30k) and sacreBLEU", signature="sacrebleu_signature", lowercase=True, sacrebleu=True,
    experiment="bleu"))
BLEU_WMT = register_metric(Metric(
    "bleu_wmt", "bleu", score_bleu, "tokenized+raw", "tokenized BLEU with compound splitting (WMT14's convention), "
    "the same without, and sacreBLEU", signature="sacrebleu_signature", compound_split=True, sacrebleu=True,
    sacrebleu_column=True))
ROUGE = register_metric(Metric(
    "rouge", "rouge", score_rouge, "raw", "ROUGE-1/2/L F1, ROUGE-1.5.5 as files2rouge runs it unless asked otherwise",
    experiment="rouge"))
DEMO = register_metric(Metric(
    "sacrebleu_tokenized", "bleu", score_demo, "tokenized", "the demo's: sacreBLEU's default BLEU (exponential "
    "smoothing, case-sensitive) on the tokenized text", config=False))
