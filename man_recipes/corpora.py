"""The one template of a corpus: a :class:`Corpus` record, declared once with :func:`register_corpus`.

A corpus declares

* ``name``: what a config's ``dataset`` says, the data record's file (``<dest>/<name>.json``) and, for the
  shared preparation command, its first argument (``python -m man_recipes.data.prepare NAME``);
* ``display``: its name in the paper tables (``results_table``, docs/reproducing.md's rows);
* ``prepare``: the function that prepares it, ``"module:function"`` (``function(args)``; named, not imported:
  the preparation modules read this record), and ``entry``: the module whose command runs it
  (``man_recipes.data.prepare``, the shared one, or a module of its own, ``man_recipes.data.multi30k``),
  ``command``: the ``data-prep/*.sh`` script that runs that command;
* ``dest``: the default data folder under ``data-bin/`` (``{src}`` / ``{tgt}``: the chosen language pair);
* ``languages``: the (source, target) suffixes of its binarized pair (the default pair where it is a choice);
* ``archives``: the release archives ``--from`` may be (what staging unpacks; none: plain files);
* ``standard_counts``: its splits (``train``, ``valid``, ``test``) and their standard sizes in pairs (None:
  no standard size), which preparation checks (``--allow-nonstandard-splits``) and the paper tables hold
  a test set to;
* ``tokenizer``: the tokenizer of the text its subword model was trained on, as fairseq's options
  (``from_pretrained`` keywords, the data folder's record; empty: the release is tokenized already);
* ``bpe_merges``: the default number of joint-BPE merges; ``max_len``: the default length cleaning (max
  tokens per side; None: it drops no pair by length); ``truncates``: it cuts articles and summaries instead
  (``--max-source-tokens``, ``--max-target-tokens``);
* ``raw_splits``: the splits whose untokenized (as scored) text data-prep keeps beside the binarized data
  (``<split>.raw.<lang>``: the references sacreBLEU and ROUGE read, the articles of a lead baseline);
* ``metrics``: the metrics (``man_recipes/metrics.py``) that score it, its configs' ``eval.metric``
  (tests/test_corpora.py holds every config under configs/ to it);
* ``lead``: its usual lead baseline (:class:`Lead`), ``published_rows`` / ``published_data``: the paper rows
  a summarization study shows for reference and what they were trained and scored on;
* ``known_subsets``: the subsets we know by name, {release counts (train, valid, test): what it is}.

Every site that treats corpora differently reads these fields (:func:`corpus`, :func:`display_name`,
:func:`standard_test_size`), never a corpus's name, so a new corpus is one ``register_corpus(Corpus(...))``
below and its preparation function (docs/architecture.md, "Where a new corpus goes").
"""

import importlib
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Tuple

from man_recipes.metrics import metric

SHARED_ENTRY = "man_recipes.data.prepare"  # the preparation command that takes the corpus's name first


@dataclass(frozen=True)
class Lead:
    """A lead baseline: the first ``n`` ``unit`` (words or sentences) of the article; ``what``: its name in a table."""
    what: str
    unit: str
    n: int

    UNITS = ("words", "sentences")


@dataclass(frozen=True)
class Corpus:
    """One corpus; the module's docstring says what each field means."""
    name: str
    display: str
    prepare: str
    command: str
    dest: str
    languages: Tuple[str, str]
    standard_counts: Mapping[str, Optional[int]]
    tokenizer: Mapping[str, object]
    bpe_merges: int
    metrics: Tuple[str, ...]
    entry: str = SHARED_ENTRY
    archives: Tuple[str, ...] = ()
    max_len: Optional[int] = None
    truncates: bool = False
    raw_splits: Tuple[str, ...] = ("test",)
    lead: Optional[Lead] = None
    published_rows: Tuple[str, ...] = ()
    published_data: Optional[str] = None
    known_subsets: Mapping[Tuple[int, int, int], str] = field(default_factory=dict)

    SPLITS = ("train", "valid", "test")

    def prepare_function(self) -> Callable:
        """The function :attr:`prepare` names."""
        module, _, name = self.prepare.partition(":")
        return getattr(importlib.import_module(module), name)


CORPORA: Dict[str, Corpus] = {}  # name -> Corpus, in declaration order (the paper tables' order of rows)


def register_corpus(c: Corpus) -> Corpus:
    """Declare ``c``; a second corpus of one name, or a field outside its valid values, is refused."""
    if c.name in CORPORA:
        raise ValueError(f"corpus {c.name!r} is already registered")
    for name in c.metrics:
        metric(name)  # an unknown metric is a ValueError naming the choices
    if list(c.standard_counts) != list(Corpus.SPLITS) or not set(c.raw_splits) <= set(Corpus.SPLITS):
        raise ValueError(f"corpus {c.name!r}: standard_counts must give the splits {Corpus.SPLITS} in that order "
                         f"and raw_splits some of them, not {list(c.standard_counts)} / {list(c.raw_splits)}")
    if c.prepare.count(":") != 1 or (c.lead is not None and c.lead.unit not in Lead.UNITS):
        raise ValueError(f"corpus {c.name!r}: prepare must be 'module:function' and a lead's unit one of "
                         f"{Lead.UNITS}, not {c.prepare!r} / {c.lead and c.lead.unit!r}")
    CORPORA[c.name] = c
    return c


def corpus(name: str) -> Corpus:
    """The corpus ``name``; an unknown one is a ValueError naming the choices."""
    if name not in CORPORA:
        raise ValueError(f"corpus must be one of {sorted(CORPORA)}, not {name!r}")
    return CORPORA[name]


def display_name(name: str) -> str:
    """A dataset's name in a table: its corpus's ``display``, or ``name`` itself where no corpus is declared."""
    return CORPORA[name].display if name in CORPORA else name


def standard_test_size(name: str) -> Optional[int]:
    """The pairs of the standard test set of the corpus ``name`` (None: not declared or not standard)."""
    return CORPORA[name].standard_counts.get("test") if name in CORPORA else None


# The corpora. A new one is one more declaration here (and its preparation function).
MOSES_NO_DASH_SPLITS = {"tokenizer": "moses", "moses_no_dash_splits": True}

IWSLT14 = register_corpus(Corpus(
    # fairseq's prepare-iwslt14.sh output sizes
    "iwslt14", "IWSLT14 De-En", "man_recipes.data.prepare:prepare_iwslt14", "data-prep/prepare-iwslt14.sh",
    "iwslt14.tokenized.de-en", ("de", "en"), {"train": 160239, "valid": 7283, "test": 6750},
    MOSES_NO_DASH_SPLITS, 10000, ("bleu_ci",), archives=("de-en.tgz",), max_len=175, raw_splits=()))
WMT14 = register_corpus(Corpus(
    # newstest2013 / newstest2014 (full); train ~4.5M pairs (depends on cleaning)
    "wmt14", "WMT14 En-De", "man_recipes.data.prepare:prepare_wmt14", "data-prep/prepare-wmt14en2de.sh",
    "wmt14_en_de", ("en", "de"), {"train": None, "valid": 3000, "test": 3003}, {"tokenizer": "moses"}, 40000,
    ("bleu_wmt",), archives=("training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
                             "training-parallel-nc-v9.tgz", "dev.tgz", "test-full.tgz"), max_len=250))
CNNDM = register_corpus(Corpus(
    # See et al.'s URL lists (all_train.txt, all_val.txt, all_test.txt); the tokenizer is that of the
    # story archives' text (See et al.'s tokenized layouts have none: man_recipes.data.cnndm.prepare_cnndm)
    "cnndm", "CNN/DM", "man_recipes.data.cnndm:prepare_cnndm", "data-prep/prepare-cnndm.sh", "cnndm",
    ("source", "target"), {"train": 287227, "valid": 13368, "test": 11490},
    {**MOSES_NO_DASH_SPLITS, "moses_no_escape": True}, 32000, ("rouge",),
    archives=("cnn_stories.tgz", "dailymail_stories.tgz"), truncates=True,
    lead=Lead("Lead-3 (first 3 sentences of the article)", "sentences", 3),
    published_rows=("man/t2-cnndm-transformer", "man/t2-cnndm-man"),
    published_data="the full 287k-pair training set, the standard 11,490-article test split (not the validation "
                   "split scored here)",
    known_subsets={(40000, 1000, 13368): (
        "cnndm-see: 40,000 pairs sampled (seeded) from the standard training split of See et al.'s non-anonymised "
        "CNN/DM, 1,000 other training pairs as validation set, and the whole standard validation split (13,368 "
        "pairs) as test set (the standard 11,490-pair test split is not part of it)")}))
GIGAWORD = register_corpus(Corpus(
    # the Rush et al. (2015) sumdata release as distributed (train/valid before any cleaning; Giga test set)
    "gigaword", "Gigaword", "man_recipes.data.prepare:prepare_gigaword", "data-prep/prepare-gigaword.sh",
    "gigaword", ("article", "title"), {"train": 3803957, "valid": 189651, "test": 1951}, {}, 32000, ("rouge",),
    archives=("summary.tar.gz", "sumdata.tgz"), max_len=200, raw_splits=("valid", "test"),
    lead=Lead("Lead-8 (first 8 words of the article)", "words", 8),
    published_rows=("man/t2-gigaword-transformer", "man/t2-gigaword-man"),
    published_data="the full 3.8M-pair training set, the same 1,951-pair test set",
    known_subsets={(29911, 1000, 1951): (
        "gigaword-30k: 29,911 training pairs pooled from the sent-summary release's first 10,000 training "
        "pairs and two public subsets of its validation split (deduplicated, no test article), 1,000 dev "
        "pairs from the same pool, the standard 1,951-pair Gigaword test set")}))
MULTI30K = register_corpus(Corpus(
    # WMT16 multimodal translation task 1, text only; any task-1 language pair (--src, --tgt)
    "multi30k", "Multi30k", "man_recipes.data.multi30k:prepare_multi30k", "data-prep/prepare-multi30k.sh",
    "multi30k.{src}-{tgt}", ("de", "en"), {"train": 29000, "valid": 1014, "test": 1000}, MOSES_NO_DASH_SPLITS,
    10000,  # joint BPE; ~10k is the usual size for Multi30k and IWSLT-size corpora
    ("bleu_ci",), entry="man_recipes.data.multi30k"))
