"""The corpus record (man_recipes/corpora.py, issue 81 item 7): every corpus the recipes know is declared
there, and a corpus declared once is picked up by every site that lists or treats corpora (preparation,
data records, the paper tables, the summarization tables), none of which names a corpus."""

import json
import re
import types

import pytest

from conftest import REPO
from man_recipes import corpora
from man_recipes.config import all_configs
from man_recipes.corpora import CORPORA, Corpus, Lead, corpus, register_corpus
from man_recipes.studies.experiments import EXPERIMENTS

EXEC = re.compile(r'^exec "\$python" -m (\S+)(?: (\w+))? "\$@"$', re.M)


def test_the_registry_holds_every_corpus_the_recipes_know():
    from man_recipes.data import prepare

    for cfg in all_configs(include_no_paper=True):  # every config's dataset, scored by one of its metrics
        assert cfg["eval"]["metric"] in corpus(cfg["dataset"]).metrics, cfg["_path"]
    assert {exp["dataset"] for exp in EXPERIMENTS.values()} <= set(CORPORA)
    scripts = {}
    for script in sorted((REPO / "data-prep").glob("prepare-*.sh")):  # each runs one corpus's command
        entry, name = EXEC.search(script.read_text()).groups()
        scripts[str(script.relative_to(REPO))] = (entry, name)
    assert scripts == {c.command: (c.entry, c.name if c.entry == corpora.SHARED_ENTRY else None)
                       for c in CORPORA.values()}
    for c in CORPORA.values():
        assert callable(c.prepare_function()), c.name
        if c.entry == corpora.SHARED_ENTRY:  # the shared command takes it, with its folder and tokenizer
            args = prepare.parse_args([c.name])
            assert args.dest == str(REPO / "data-bin" / c.dest) and args.record["tokenizer"] == c.tokenizer
    with pytest.raises(SystemExit):  # the shared command takes the corpora of its entry only
        prepare.parse_args(["multi30k"])


def test_a_second_or_malformed_declaration_is_refused():
    with pytest.raises(ValueError, match="corpus 'iwslt14' is already registered"):
        register_corpus(CORPORA["iwslt14"])
    fields = dict(name="toy", display="Toy", prepare="x:y", command="c", dest="d", languages=("a", "b"),
                  standard_counts={"train": 1, "valid": 1, "test": 1}, tokenizer={}, bpe_merges=1, metrics=("rouge",))
    with pytest.raises(ValueError, match=r"metric must be one of \['bleu_ci', 'bleu_wmt', 'rouge'\], not 'bleu_x'"):
        register_corpus(Corpus(**dict(fields, metrics=("bleu_x",))))
    with pytest.raises(ValueError, match="standard_counts must give the splits"):
        register_corpus(Corpus(**dict(fields, standard_counts={"train": 1, "test": 1})))
    with pytest.raises(ValueError, match="a lead's unit one of"):
        register_corpus(Corpus(**dict(fields, lead=Lead("Lead-2", "paragraphs", 2))))
    assert "toy" not in CORPORA
    with pytest.raises(ValueError, match=r"corpus must be one of \['cnndm', 'gigaword', 'iwslt14', 'multi30k', "
                                         r"'wmt14'\], not 'toy'"):
        corpus("toy")


class Prepared(Exception):
    """What :func:`prepare_toy` raises: the arguments the shared command prepared the toy corpus with."""


def prepare_toy(args):
    raise Prepared(args)


@pytest.fixture
def toy_corpus():
    """A corpus declared here, removed from the registry after the test."""
    c = register_corpus(Corpus(
        "toy", "Toy Xx-Yy", f"{__name__}:prepare_toy", "data-prep/prepare-toy.sh", "toy-bin", ("xx", "yy"),
        {"train": 20, "valid": 5, "test": 7}, {"tokenizer": "moses"}, 500, ("bleu_ci",), max_len=30,
        lead=Lead("Lead-2 (first 2 words of the article)", "words", 2), known_subsets={(2, 1, 7): "toy-small"}))
    try:
        yield c
    finally:
        del CORPORA[c.name]


def test_a_corpus_declared_once_is_prepared_by_the_shared_command(toy_corpus, tmp_path, capsys):
    from man_recipes.data import prepare

    with pytest.raises(SystemExit):
        prepare.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{cnndm,gigaword,iwslt14,toy,wmt14}" in text
    assert "(default 10000 IWSLT14, 40000 WMT14, 32000 CNN/DM and Gigaword, 500 Toy)" in text
    assert "(IWSLT14, WMT14, Gigaword, Toy; default 175, 250, 200, 30)" in text
    assert prepare.parse_args(["toy"]).dest == str(REPO / "data-bin" / "toy-bin")  # its default folder
    with pytest.raises(Prepared) as e:  # run, with its defaults in the folder's record
        prepare.run(["toy", "--work", str(tmp_path / "work"), "--dest", str(tmp_path / "dest")])
    args = e.value.args[0]
    assert args.record["dataset"] == "toy" and args.record["tokenizer"] == {"tokenizer": "moses"}
    assert args.record["options"]["bpe_merges"] == 500 and args.record["options"]["max_len"] == 30
    assert "max_source_tokens" not in args.record["options"]
    with pytest.raises(SystemExit):
        prepare.parse_args(["toy", "--max-source-tokens", "9"])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --max-source-tokens: CNN/DM only; the toy recipe cuts no sentence (--max-len drops longer pairs)")


def test_a_corpus_declared_once_is_named_in_its_data_record_and_the_tables(toy_corpus, tmp_path, monkeypatch):
    from toy_config import toy_config
    from man_recipes.data.manifest import write_manifest
    from man_recipes.evaluation.results_table import build_tables, deviations
    from man_recipes.studies import summarization_table

    release = {"train": 2, "valid": 1, "test": 7}
    record = json.loads(write_manifest(tmp_path, "toy", "xx", "yy", release, release, dict(toy_corpus.standard_counts),
                                       {"test": "toy test"}).read_text())
    assert record["subset"] == "toy-small" and record["standard_counts"] == {"train": 20, "valid": 5, "test": 7}

    cfg = dict(toy_config(tmp_path, "toy-row", {}, {"paper_gpus": 1, "paper_update_freq": 1}, {}),
               _path=str(tmp_path / "toy-row.yaml"))
    res = {"name": "toy-row", "scores": {"bleu": 1.0}, "subset": "test", "n_sentences": 6, "data": cfg["data"],
           "overrides": [], "run_config": {k: cfg.get(k) for k in ("arch", "model", "train", "batch")}, "_run": "r"}
    assert deviations(cfg, res) == ["6 test sentences (standard test set: 7)"]
    assert deviations(cfg, dict(res, n_sentences=7)) == []
    assert "| toy | Toy Xx-Yy | – | 1.00 |" in build_tables([cfg], {"r": dict(res, n_sentences=7)})

    scored = []

    def score(name, lead, refs, **options):  # the lead baseline's lines, instead of ROUGE-1.5.5
        scored.append(lead)
        return types.SimpleNamespace(rouge={"rouge1": 1.0, "rouge2": 2.0, "rougeL": 3.0})

    monkeypatch.setattr(summarization_table, "score", score)
    rows = summarization_table.references_table("toy", {"test_sets": {"test": "toy test"}}, None, "hyp-ref",
                                                {"test": ["a b c", "d"]}, {"test": ["x", "y"]})
    assert scored == [["a b", "d"]]
    assert [row["what"] for row in rows] == ["Lead-2 (first 2 words of the article), toy test"]
