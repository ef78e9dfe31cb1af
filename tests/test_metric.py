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
