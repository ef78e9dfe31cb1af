"""The score step is one function (man_recipes/evaluation/metric.py:score): evaluate.sh and the studies
get the same numbers from the same inputs, and what an error names exists."""

import types

import pytest

from man_recipes import scoring
from man_recipes.evaluation.evaluate import score_decoded
from man_recipes.evaluation.metric import score
from man_recipes.studies.study_eval import score_test_set

# case differs from the references: a BLEU that is not case-insensitive scores these lower
HYPS = ["Two Dogs run on the grass .", "a man , riding a bike .", "The girl sings ."]
REFS = ["two dogs run in the grass .", "a man is riding a bike .", "the girl sings loudly ."]
RAW = ["Two dogs run in the grass.", "A man is riding a bike.", "The girl sings loudly."]


def test_evaluate_sh_and_the_studies_score_bleu_the_same(tmp_path):
    (tmp_path / "test.raw.en").write_text("\n".join(RAW) + "\n")
    cfg = {"eval": {"metric": "bleu_ci"}, "target_lang": "en"}
    scores, details = score_decoded(cfg, tmp_path, "test", HYPS, REFS, tmp_path)
    study, kept, line = score_test_set("bleu", HYPS, REFS, RAW, tmp_path / "test.raw.en", cfg, {"target_lang": "en"},
                                       types.SimpleNamespace(rouge_exception_db=None), "hypotheses of run test")
    assert details["bleu"] == study["tokenized_bleu_details"] and details["bleu"]["lowercase"] is True
    assert scores["bleu"] == study["bleu_tok_ci"] > scoring.tokenized_bleu(HYPS, REFS)["bleu"]
    # both add the same sacreBLEU of the detokenized hypotheses against the raw references (issue 81)
    assert kept == scoring.moses_detokenize(HYPS, "en") == score("bleu_wmt", HYPS, REFS, raw_refs=RAW,
                                                                 target_lang="en").detokenized
    assert study["sacrebleu"] == scoring.sacrebleu_detok(kept, RAW)["bleu"] == scores["sacrebleu"]
    assert details["sacrebleu_signature"] == study["sacrebleu_signature"]
    assert details["sacrebleu_references"] == f"raw references {tmp_path / 'test.raw.en'}"
    assert line == f"sacreBLEU {study['sacrebleu']:.2f}, tokenized BLEU {study['bleu_tok_ci']:.2f}"


def test_the_detokenized_hypotheses_a_sacrebleu_error_names_are_written_first(tmp_path):
    (tmp_path / "test.raw.en").write_text("\n".join(RAW[:2]) + "\n")  # one line short
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    cfg = {"eval": {"metric": "bleu_wmt"}, "target_lang": "en"}
    with pytest.raises(scoring.ScoreInputError, match=f"hypotheses {eval_dir / 'test.detok.hyp'} has 3 lines but "
                                                      f"references {tmp_path / 'test.raw.en'} has 2 lines"):
        score_decoded(cfg, tmp_path, "test", HYPS, REFS, eval_dir)
    assert (eval_dir / "test.detok.hyp").read_text().splitlines() == scoring.moses_detokenize(HYPS, "en")


@pytest.mark.parametrize("metric", ["bleu_wmt", "bleu_ci"])
def test_bleu_without_raw_references_scores_the_detokenized_tokenized_ones(metric):
    got = score(metric, HYPS, REFS, target_lang="en")
    assert got.bleu["compound_split"] is (metric == "bleu_wmt")
    assert (got.bleu_no_compound_split or {}).get("compound_split", False) is False
    assert got.sacrebleu == scoring.sacrebleu_detok(got.detokenized, scoring.moses_detokenize(REFS, "en"))


@pytest.fixture
def registry(monkeypatch):
    """The metric registry, restored after the test: a metric a test declares stays in it."""
    from man_recipes import metrics

    monkeypatch.setattr(metrics, "METRICS", dict(metrics.METRICS))
    return metrics


def test_a_metric_declared_once_is_picked_up_by_the_config_check_and_evaluate(registry, tmp_path):
    """Issue 81, item 7: a new metric is one register_metric; every site reads the record, none its name."""
    from man_recipes.config import ConfigError, load_config, validate
    from man_recipes.evaluation.evaluate import resolve_rouge_options

    cfg = load_config("t1-iwslt14-man-small")
    with pytest.raises(ConfigError, match=r"eval.metric must be one of \['bleu_ci', 'bleu_wmt', 'rouge'\]"):
        validate(dict(cfg, eval=dict(cfg["eval"], metric="bleu_cs")))
    registry.register_metric(registry.Metric(
        "bleu_cs", "bleu", registry.score_bleu, "tokenized+raw", "case-sensitive tokenized BLEU and sacreBLEU",
        signature="sacrebleu_signature", sacrebleu=True))
    assert registry.config_metrics() == ["bleu_ci", "bleu_cs", "bleu_wmt", "rouge"]  # the choices configs list
    validate(dict(cfg, eval=dict(cfg["eval"], metric="bleu_cs")))
    with pytest.raises(ValueError, match=r"metric must be one of \['bleu_ci', 'bleu_cs', 'bleu_wmt', 'rouge'\], not 'x'"):
        score("x", HYPS, REFS)

    # evaluate.sh scores it: case-sensitive tokenized BLEU, sacreBLEU against the raw references it reads
    (tmp_path / "test.raw.en").write_text("\n".join(RAW) + "\n")
    scores, details = score_decoded({"eval": {"metric": "bleu_cs"}, "target_lang": "en"}, tmp_path, "test", HYPS,
                                    REFS, tmp_path)
    assert details["bleu"] == scoring.tokenized_bleu(HYPS, REFS) and details["bleu"]["lowercase"] is False
    assert scores == {"bleu": details["bleu"]["bleu"], "sacrebleu": scoring.sacrebleu_detok(
        scoring.moses_detokenize(HYPS, "en"), RAW)["bleu"]}
    assert details["sacrebleu_references"] == f"raw references {tmp_path / 'test.raw.en'}"
    assert details["sacrebleu_signature"] == details["sacrebleu"]["signature"]
    # a BLEU metric reads no ROUGE option
    args = types.SimpleNamespace(rouge_order="ref-hyp", rouge_implementation=None, rouge_exception_db=None)
    with pytest.raises(Exception, match="--rouge-order: the run's config scores bleu_cs, not ROUGE"):
        resolve_rouge_options(args, "bleu_cs")

    # a ROUGE-kind metric scores against the raw references alone and is checked as ROUGE before decoding
    registry.register_metric(registry.Metric("rouge_lead", "rouge", registry.score_rouge, "raw", "ROUGE again"))
    summaries = tmp_path / "sum"
    summaries.mkdir()
    (summaries / "test.raw.en").write_text("\n".join(RAW) + "\n")
    scores, details = score_decoded({"eval": {"metric": "rouge_lead"}, "target_lang": "en"}, summaries, "test", HYPS,
                                    REFS, summaries, rouge_implementation="rouge-score")
    assert details["rouge_references"] == f"raw references {summaries / 'test.raw.en'}"
    assert (summaries / "test.ref").read_text().splitlines() == RAW
    assert set(scores) == {"rouge1", "rouge2", "rougeL"}


def test_the_registry_refuses_a_second_metric_of_one_name(registry):
    with pytest.raises(ValueError, match=r"^metric 'rouge' is already registered$"):
        registry.register_metric(registry.Metric("rouge", "rouge", registry.score_rouge, "raw", "another ROUGE"))
    with pytest.raises(ValueError, match="kind must be one of"):
        registry.register_metric(registry.Metric("chrf", "chrf", registry.score_bleu, "raw", "x"))
    with pytest.raises(ValueError, match="signature"):
        registry.register_metric(registry.Metric("bleu_x", "bleu", registry.score_bleu, "tokenized+raw", "x",
                                                 sacrebleu=True))


def test_a_bleu_metric_without_sacrebleu_writes_tokenized_bleu_alone(registry, tmp_path):
    registry.register_metric(registry.Metric("bleu_tok", "bleu", registry.score_bleu, "tokenized", "tokenized BLEU"))
    scores, details = score_decoded({"eval": {"metric": "bleu_tok"}, "target_lang": "en"}, tmp_path, "test", HYPS,
                                    REFS, tmp_path)
    assert scores == {"bleu": scoring.tokenized_bleu(HYPS, REFS)["bleu"]} and "sacrebleu" not in details
    assert not (tmp_path / "test.detok.hyp").exists()
