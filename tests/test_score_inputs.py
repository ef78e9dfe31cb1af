"""No wrong score with exit status 0: every metric refuses inputs of unequal or no length
(scoring.check_aligned, the one check they all call), and a failed evaluation never leaves an
earlier result looking current (evaluate.py, result_files.py).

sacreBLEU itself zips unequal streams without a word, so these checks are all that stands between
a truncated or shifted reference file and a plausible number."""

import json
import re
import subprocess

import pytest
import torch
import yaml

from conftest import REPO, child_env, run_bounded

from man_recipes.evaluation import decode, evaluate, results_table
from man_recipes.studies import bleu_table
from man_recipes import rouge155, scoring
from man_recipes.studies import study_records as sr
from man_recipes.config import CONFIG_DIR, load_config

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
    message = _error(bleu_table.paired_bootstrap, HYPS, HYPS[:3], HYPS, n_samples=10,
                     names=("hypotheses T.hyp", "hypotheses M.hyp", "references R.en"))
    assert message.startswith("unequal line counts: hypotheses T.hyp has 4 lines, hypotheses M.hyp has 3 lines, "
                              "references R.en has 4 lines")


def _record(family, seed):
    # every field read_records checks (study_records.RECORD_FIELDS, TEST_SET_FIELDS)
    return {"family": family, "seed": seed, "fingerprint": "f" * 16, "arch": "transformer_iwslt_de_en",
            "params": 1000, "train_seconds": 1.0, "updates": 1, "valid_curve": [[1, 9.0]],
            "test_sets": {"test": {"name": "test_2016_flickr", "n_sentences": 4, "sacrebleu": 100.0,
                                   "bleu_tok_ci": 100.0, "sacrebleu_signature": "nrefs:1"}}}


def test_study_table_refuses_a_record_whose_hypotheses_do_not_match_the_references(tmp_path):
    refs = {"test": HYPS}
    for family in ("transformer", "man"):
        sr.write_record(tmp_path, _record(family, 1), {"test": HYPS})
    boot = bleu_table.significance(sr.read_records(tmp_path), tmp_path, refs, 10, {"test": "data/test.raw.en"})
    assert set(boot) == {("man", 1, "test")} and boot[("man", 1, "test")]["paired_bootstrap"]["system_bleu"] == 100.0
    # a record without a Transformer of its seed is bootstrapped against nothing, but its
    # hypotheses (the table shows its scores) must still be one per reference
    short = _record("sman2", 2)
    short["test_sets"]["test"]["n_sentences"] = 3
    sr.write_record(tmp_path, short, {"test": HYPS[:3]})
    message = _error(bleu_table.significance, sr.read_records(tmp_path), tmp_path, refs, 10,
                     {"test": "data/test.raw.en"})
    assert message.startswith(f"unequal line counts: hypotheses {tmp_path / 'sman2-seed2.test.hyp'} has 3 lines "
                              "but references data/test.raw.en has 4 lines")
    # a hypothesis file shorter than its own record is named by the record reader first
    (tmp_path / "sman2-seed2.test.hyp").write_text("\n".join(HYPS[:2]) + "\n")
    with pytest.raises(sr.RecordError, match="sman2-seed2.test.hyp: 2 hypotheses, but its record"):
        bleu_table.significance(sr.read_records(tmp_path), tmp_path, refs, 10, {"test": "data/test.raw.en"})
    (tmp_path / "sman2-seed2.test.hyp").write_text("\n".join(HYPS[:3]) + "\n")
    assert "references data/test.raw.en has 0 lines" in _error(
        bleu_table.significance, sr.read_records(tmp_path), tmp_path, {"test": []}, 10, {"test": "data/test.raw.en"})


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


# ------------------------------------------------------------------------------ evaluate.sh

@pytest.fixture
def toy_run(tmp_path, toy_data_bin, toy_raw):
    """A run folder of a Multi30k config (``paper: none``) on the toy data, with one checkpoint
    that records its progress; decoding is replaced by the references themselves (``decode``)."""
    cfg = load_config(CONFIG_DIR / "multi30k" / "transformer.yaml")
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    cfg.update(data=str(toy_data_bin), source_lang="src", target_lang="tgt")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save({"optimizer_history": [{"num_updates": 7}], "extra_state": {"train_iterator": {"epoch": 3}}},
               run / "checkpoints" / "checkpoint_last.pt")
    refs = (toy_raw / "test.tgt").read_text().splitlines()
    return run, refs


def _generate_output(hyps, refs):
    return "".join(f"S-{i}\tsrc\nT-{i}\t{r}\nH-{i}\t-0.5\t{h}\nD-{i}\t-0.5\t{h}\n"
                   for i, (h, r) in enumerate(zip(hyps, refs)))


def _evaluate(run, monkeypatch, capsys, output=None, *extra):
    """evaluate.main on ``run`` with fairseq-generate replaced: ``output`` is its text, None means
    decoding must not start. Returns (exit status, stdout, stderr)."""
    def fake_run(cmd, log_path, total=None):
        if output is None:
            pytest.fail("decoding started")
        if isinstance(output, Exception):
            raise output
        return output

    monkeypatch.setattr(decode, "run_generate", fake_run)
    code = evaluate.main([str(run), "--cpu", "--checkpoint", str(run / "checkpoints" / "checkpoint_last.pt"), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _with_metric(run, metric, data):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["eval"]["metric"], cfg["data"] = metric, str(data)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))


def test_evaluate_a_multi30k_run_and_replace_its_result_whole(toy_run, monkeypatch, capsys):
    run, refs = toy_run
    (run / "results.json").write_text('{"scores": {"bleu": 1.0}}\n')
    (run / "results.md").write_text("old\n")
    code, out, err = _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs))
    assert (code, err) == (0, ""), err
    assert "previous result moved aside to results.previous.json, results.previous.md" in out
    res = json.loads((run / "results.json").read_text())
    assert (res["paper"], res["table"], res["row"]) == ("none", None, None)  # was KeyError: 'table'
    # a Multi30k config's BLEU and sacreBLEU, as the README says (issue 81)
    assert res["scores"] == {"bleu": 100.0, "sacrebleu": 100.0} and res["n_sentences"] == len(refs) == 20
    assert (res["num_updates"], res["epochs_completed"]) == (7, 2)
    assert "| bleu | 100.0 |" in (run / "results.md").read_text()
    assert sorted(p.name for p in run.glob("results*")) == ["results.json", "results.md"]


def test_every_multi30k_config_can_be_reported():
    # what evaluate.sh reads from the config for its result, checked before decoding
    from man_recipes.evaluation import result_files

    paths = sorted(CONFIG_DIR.glob("multi30k*/*.yaml"))
    assert len(paths) >= 12
    for path in paths:
        fields = result_files.config_fields(load_config(path), REPO, {}, "data-bin", "test")
        assert fields["paper"] == "none" and fields["table"] is None, path


@pytest.mark.parametrize("case", ["10 of 20 lines", "5 lines too many", "20 blank lines", "empty file"])
def test_raw_references_are_refused_before_decoding_and_the_old_result_retired(
        case, toy_run, tmp_path, toy_data_bin, monkeypatch, capsys):
    import shutil

    run, refs = toy_run
    data = tmp_path / "data"
    shutil.copytree(toy_data_bin, data)
    raw = {"10 of 20 lines": refs[:10], "5 lines too many": refs[:5] + refs, "20 blank lines": [""] * 20,
           "empty file": []}[case]
    (data / "test.raw.tgt").write_text("".join(line + "\n" for line in raw))
    _with_metric(run, "bleu_wmt", data)
    (run / "results.json").write_text('{"scores": {"sacrebleu": 100.0}}\n')
    code, _, err = _evaluate(run, monkeypatch, capsys, None)
    assert code == 2 and err.count("\n") == 1 and err.startswith("ERROR: "), err
    named = f"references {data / 'test.raw.tgt'} has {len(raw)} line"
    assert (named if case != "20 blank lines" else f"every line of references {data / 'test.raw.tgt'} is blank") in err
    if case != "20 blank lines":
        assert f"the binarized test set in {data} has 20 lines" in err
    assert f"the previous result is in {run / 'results.previous.json'}" in err
    assert not (run / "results.json").exists()
    assert (run / "results.previous.json").read_text() == '{"scores": {"sacrebleu": 100.0}}\n'


def test_a_failure_after_decoding_leaves_no_current_result(toy_run, monkeypatch, capsys):
    run, refs = toy_run
    assert _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs))[0] == 0
    first = (run / "results.json").read_text()
    # fairseq-generate decodes only half the test set: refused, and nothing left looks current
    code, _, err = _evaluate(run, monkeypatch, capsys, _generate_output(refs[:10], refs[:10]))
    assert code == 2 and err.startswith("ERROR: fairseq-generate decoded 10 sentences of `test`, ids 0 to 9, "
                                        "not its 20; see ") and err.count("\n") == 1
    assert not (run / "results.json").exists() and not (run / "results.md").exists()
    assert (run / "results.previous.json").read_text() == first
    assert not (run / "eval" / "test.hyp").exists()  # the earlier decode does not pass for this one's
    # the decoder itself fails
    code, _, err = _evaluate(run, monkeypatch, capsys, evaluate.EvaluateError("fairseq-generate failed (exit code 1)"))
    assert code == 2 and "fairseq-generate failed" in err and not (run / "results.json").exists()
    # the next success removes the previous result
    assert _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs))[0] == 0
    assert sorted(p.name for p in run.glob("results*")) == ["results.json", "results.md"]


def test_rouge_that_cannot_run_stops_before_decoding(toy_run, monkeypatch, capsys):
    run, _ = toy_run
    _with_metric(run, "rouge", yaml.safe_load((run / "config.yaml").read_text())["data"])

    def no_perl():
        raise rouge155.Rouge155Unavailable("perl is not on PATH.")

    monkeypatch.setattr(rouge155, "check_perl", no_perl)
    code, _, err = _evaluate(run, monkeypatch, capsys, None)
    assert code == 2 and err.startswith("ERROR: cannot score ROUGE with ROUGE-1.5.5: perl is not on PATH.")


def test_evaluate_sh_prints_one_error_line_with_status_2(toy_run, tmp_path, toy_data_bin):
    """End to end through scripts/evaluate.sh: references one line short, found before decoding."""
    import shutil
    import sys

    run, refs = toy_run
    data = tmp_path / "data"
    shutil.copytree(toy_data_bin, data)
    (data / "test.raw.tgt").write_text("\n".join(refs[:-1]) + "\n")
    _with_metric(run, "bleu_wmt", data)
    (run / "results.json").write_text("{}\n")
    proc = run_bounded(["bash", "scripts/evaluate.sh", run, "--cpu"], 120, cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=child_env({"PYTHON": sys.executable}))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and re.fullmatch(
        f"ERROR: unequal line counts: the binarized test set in {data} has 20 lines but references "
        f"{data / 'test.raw.tgt'} has 19 lines .*\n", proc.stderr), proc.stderr
    assert not (run / "results.json").exists() and (run / "results.previous.json").read_text() == "{}\n"


@pytest.mark.parametrize("option, value, why", [("--avg-last", "0", "must be >= 1"), ("--avg-last", "-1", "must be >= 1"),
                                                ("--batch-size", "0",
                                                 "must be >= 1 and <= 1000000 (sentences per batch: more than any test set holds)")])
def test_a_count_out_of_range_is_refused_when_the_arguments_are_read(toy_run, option, value, why, capsys):
    # --avg-last 0 was taken as "not given" (the config's average, exit status 0); -1 reached the
    # averaging as "--num-epoch-checkpoints -1"
    run, _ = toy_run
    with pytest.raises(SystemExit) as e:
        evaluate.main([str(run), "--cpu", f"{option}={value}"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"scripts/evaluate.sh: error: argument {option}: invalid value '{value}': {why}")


@pytest.mark.parametrize("command", ["train", "evaluate", "reproduce"])
def test_a_half_precision_on_the_cpu_is_refused_not_dropped(command, tmp_path, capsys):
    # fairseq's --fp16/--bf16 do not run on the CPU: --precision bf16 with --cpu trained and decoded in
    # fp32, with exit status 0
    from man_recipes.studies import reproduce
    from man_recipes.training import launch

    argv, prog = {"train": (["multi30k/transformer", "--cpu"], "scripts/train.sh"),
                  "evaluate": ([str(tmp_path), "--cpu"], "scripts/evaluate.sh"),
                  "reproduce": (["multi30k-cpu", "--device", "cpu"], "scripts/reproduce.sh")}[command]
    main = {"train": launch.main, "evaluate": evaluate.main, "reproduce": reproduce.parse_args}[command]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--precision", "bf16"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{prog}: error: --precision bf16: the CPU runs fp32 only (fairseq's --fp16/--bf16 need a GPU)")
    assert reproduce.parse_args(["multi30k-cpu", "--device", "cpu", "--precision", "fp32"]).precision == "fp32"
    assert reproduce.parse_args(["multi30k-cpu", "--device", "cuda"]).precision == "fp16"


@pytest.mark.parametrize("extra, message", [
    (["--rouge-exception-db", "wordnet"], "--rouge-exception-db: the run's config scores bleu_ci, not ROUGE"),
    (["--rouge-order", "ref-hyp", "--rouge-implementation", "rouge-score"],
     "--rouge-order and --rouge-implementation: the run's config scores bleu_ci, not ROUGE"),
])
def test_a_rouge_option_on_a_bleu_run_is_refused_before_decoding(toy_run, monkeypatch, capsys, extra, message):
    # the BLEU scoring read none of them: a user asking for another ROUGE setting got BLEU with exit 0
    run, _ = toy_run
    code, _, err = _evaluate(run, monkeypatch, capsys, None, *extra)
    assert code == 2 and err.startswith(f"ERROR: {message}") and err.count("\n") == 1


def test_the_exception_database_is_refused_where_no_rouge_reads_it(capsys):
    from types import SimpleNamespace

    from man_recipes.studies import reproduce

    args = SimpleNamespace(rouge_order=None, rouge_implementation="rouge-score", rouge_exception_db="wordnet")
    with pytest.raises(evaluate.EvaluateError, match="--rouge-exception-db: read by ROUGE-1.5.5 only"):
        evaluate.resolve_rouge_options(args, "rouge")
    args = SimpleNamespace(rouge_order=None, rouge_implementation=None, rouge_exception_db=None)
    evaluate.resolve_rouge_options(args, "rouge")
    assert (args.rouge_implementation, args.rouge_exception_db) == ("rouge155", "files2rouge")
    with pytest.raises(SystemExit) as e:
        reproduce.parse_args(["multi30k-cpu", "--rouge-exception-db", "wordnet"])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        "scripts/reproduce.sh: error: --rouge-exception-db: multi30k-cpu scores BLEU, not ROUGE")
    assert reproduce.parse_args(["gigaword-cpu", "--device", "cpu"]).rouge_exception_db == "files2rouge"


def test_a_checkpoint_that_is_not_one_is_named_before_decoding(toy_run, tmp_path, monkeypatch, capsys):
    run, _ = toy_run
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    monkeypatch.setattr(evaluate, "decode", lambda *a, **k: pytest.fail("decoding started"))
    code = evaluate.main([str(run), "--cpu", "--checkpoint", str(text)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"ERROR: cannot read checkpoint {text}: not a PyTorch checkpoint ")


def test_a_previous_result_beside_the_current_one_is_never_replaced(toy_run, monkeypatch, capsys):
    # retire() renamed results.json over it: the older file was lost, even when the evaluation failed
    run, refs = toy_run
    (run / "results.json").write_text('{"scores": {"bleu": 2.0}}\n')
    (run / "results.previous.json").write_text('{"scores": {"bleu": 1.0}}\n')
    code, _, err = _evaluate(run, monkeypatch, capsys, None)
    assert code == 2 and err == (f"ERROR: {run / 'results.previous.json'} exists beside results.json; evaluate.sh "
                                 "keeps one earlier result there: move one of them away first\n")
    assert (run / "results.json").read_text() == '{"scores": {"bleu": 2.0}}\n'
    assert (run / "results.previous.json").read_text() == '{"scores": {"bleu": 1.0}}\n'
