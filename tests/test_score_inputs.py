"""No wrong score with exit status 0: every metric refuses inputs of unequal or no length
(scoring.check_aligned, the one check they all call).

sacreBLEU itself zips unequal streams without a word, so these checks are all that stands between
a truncated or shifted reference file and a plausible number."""

import pytest

from man_fairseq.recipes import results_table, rouge155, scoring, study_table
from man_fairseq.recipes import study_records as sr

HYPS = ["the cat sat on the mat", "a dog ran in the park", "it rained all day", "we went home"]


def _error(fn, *args, **kwargs):
    with pytest.raises(scoring.ScoreInputError) as e:
        fn(*args, **kwargs)
    return str(e.value)


# ------------------------------------------------------------------------------ the scorers

def test_sacrebleu_zips_unequal_streams_and_sacrebleu_detok_refuses_them():
    import sacrebleu

    # the defect: 4 hypotheses against the first 2 of them as references score a perfect 100
    assert round(sacrebleu.corpus_bleu(HYPS, [HYPS[:2]]).score, 2) == 100.0
    message = _error(scoring.sacrebleu_detok, HYPS, HYPS[:2], names=("hypotheses out/test.detok.hyp",
                                                                     "references data/test.raw.en"))
    assert message == ("unequal line counts: hypotheses out/test.detok.hyp has 4 lines but references "
                       "data/test.raw.en has 2 lines (one line per sentence is needed, in the same order)")


SCORERS = {
    "sacreBLEU": scoring.sacrebleu_detok,
    "tokenized BLEU": lambda h, r, names: scoring.tokenized_bleu(h, r, lowercase=True, names=names),
    "compound-split BLEU": lambda h, r, names: scoring.tokenized_bleu(h, r, compound=True, names=names),
    # refused before Perl is needed: this runs where ROUGE-1.5.5 cannot
    "ROUGE-1.5.5": lambda h, r, names: scoring.rouge(h, r, names=names),
    "rouge-score": lambda h, r, names: scoring.rouge(h, r, implementation="rouge-score", names=names),
}


@pytest.mark.parametrize("scorer", SCORERS)
def test_every_metric_refuses_unequal_empty_and_blank_inputs(scorer):
    score, names = SCORERS[scorer], ("hypotheses H.txt", "references R.txt")
    shifted = HYPS[1:] + HYPS[:1] + ["one line too many"]
    assert "hypotheses H.txt has 4 lines but references R.txt has 5 lines" in _error(score, HYPS, shifted, names)
    assert "hypotheses H.txt has 4 lines but references R.txt has 2 lines" in _error(score, HYPS, HYPS[:2], names)
    assert _error(score, [], [], names) == (
        "nothing to score: hypotheses H.txt has 0 lines but references R.txt has 0 lines")
    assert _error(score, HYPS, [""] * 4, names) == (
        "nothing to score against: every line of references R.txt is blank "
        "(hypotheses H.txt has 4 lines but references R.txt has 4 lines)")
    # without names the message still says which side is which
    assert "hypotheses has 1 line but references has 2 lines" in _error(score, HYPS[:1], HYPS[:2], None)


def test_an_empty_hypothesis_is_a_score_not_an_error():
    # a model may decode nothing: that scores 0, it is not a broken input
    assert scoring.tokenized_bleu(["", ""], HYPS[:2])["bleu"] == 0.0
    assert scoring.sacrebleu_detok(HYPS[:2], HYPS[:2])["bleu"] == 100.0
    assert scoring.sacrebleu_detok(iter(HYPS), iter(HYPS))["bleu"] == 100.0  # read once, then scored


def test_rouge155_run_refuses_unequal_files_before_perl_runs(monkeypatch):
    monkeypatch.setattr(rouge155, "release_dir", lambda: pytest.fail("ROUGE started on unequal inputs"))
    message = _error(rouge155.run, HYPS, HYPS[:3], names=("REFERENCE r.txt", "SUMMARY s.txt"))
    assert "REFERENCE r.txt has 4 lines but SUMMARY s.txt has 3 lines" in message


def test_paired_bootstrap_names_all_three_inputs():
    message = _error(study_table.paired_bootstrap, HYPS, HYPS[:3], HYPS, n_samples=10,
                     names=("hypotheses T.hyp", "hypotheses M.hyp", "references R.en"))
    assert message.startswith("unequal line counts: hypotheses T.hyp has 4 lines, hypotheses M.hyp has 3 lines, "
                              "references R.en has 4 lines")


def _record(family, seed):
    return {"family": family, "seed": seed, "fingerprint": "f" * 16,
            "test_sets": {"test": {"name": "test_2016_flickr", "n_sentences": 4}}}


def test_study_table_refuses_a_record_whose_hypotheses_do_not_match_the_references(tmp_path):
    refs = {"test": HYPS}
    for family in ("transformer", "man"):
        sr.write_record(tmp_path, _record(family, 1), {"test": HYPS})
    boot = study_table.significance(sr.read_records(tmp_path), tmp_path, refs, 10, {"test": "data/test.raw.en"})
    assert set(boot) == {("man", 1, "test")} and boot[("man", 1, "test")]["system_bleu"] == 100.0
    # a record without a Transformer of its seed is bootstrapped against nothing, but its
    # hypotheses (the table shows its scores) must still be one per reference
    sr.write_record(tmp_path, _record("sman2", 2), {"test": HYPS})
    (tmp_path / "sman2-seed2.test.hyp").write_text("\n".join(HYPS[:3]) + "\n")
    message = _error(study_table.significance, sr.read_records(tmp_path), tmp_path, refs, 10,
                     {"test": "data/test.raw.en"})
    assert message.startswith(f"unequal line counts: hypotheses {tmp_path / 'sman2-seed2.test.hyp'} has 3 lines "
                              "but references data/test.raw.en has 4 lines")
    assert "references data/test.raw.en has 0 lines" in _error(
        study_table.significance, sr.read_records(tmp_path), tmp_path, {"test": []}, 10, {"test": "data/test.raw.en"})


# ---------------------------------------------------------------------------- results_table

def test_results_table_refuses_an_unreadable_result_and_flags_one_scored_on_nothing(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text('{"name": "x", "scores": {"bleu": 3')  # cut short
    assert results_table.main(["--runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR: {tmp_path / 'a' / 'results.json'}: not a readable results file")
    assert err.count("\n") == 1
    (tmp_path / "a" / "results.json").write_text('{"name": "x"}')
    with pytest.raises(results_table.ResultsError, match="holds no scores"):
        results_table.collect_runs(tmp_path)
    cfg = {"dataset": "multi30k", "data": "d", "eval": {}}
    res = {"overrides": [], "run_config": {}, "data": "d", "subset": "test", "n_sentences": 0}
    assert results_table.deviations(cfg, res) == ["scored on no sentence"]
