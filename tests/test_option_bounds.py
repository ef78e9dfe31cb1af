"""No option value exhausts the machine (issue #72 item 3): each count is bounded where it is parsed,
by what the machine and the method can take, and a value beyond is one argparse line (exit status 2)
naming the bound, before any work starts. No test here runs the exhausting value: each checks that
the refusal comes first (a Pool, ROUGE or sentencepiece call would fail the test)."""

import argparse

import pytest

from man_recipes.cli import files2rouge
from man_recipes import options
from man_recipes.data import multi30k, prepare
from man_recipes.studies import reproduce


@pytest.fixture
def no_work(monkeypatch):
    """Any process pool, ROUGE run or sentencepiece training is a failure: the refusal comes first."""
    import multiprocessing

    def forbidden(*a, **k):
        raise AssertionError("work started before the option was refused")

    monkeypatch.setattr(multiprocessing, "Pool", forbidden)
    monkeypatch.setattr(files2rouge.rouge155, "run", forbidden)


def refusal(capsys, main, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_workers_beyond_the_cores_are_refused(capsys, no_work, monkeypatch):
    monkeypatch.setattr(options, "cpu_cores", lambda: 2)
    line = refusal(capsys, prepare.main, ["gigaword", "--workers", "1000000"])
    assert line.endswith("argument --workers: invalid value '1000000': must be >= 1 and <= 2 "
                         "(the 2 CPU core(s) this process may use)"), line
    line = refusal(capsys, multi30k.main, ["--workers", "3"])
    assert "argument --workers: invalid value '3': must be >= 1 and <= 2" in line
    assert options.workers()("2") == 2


def test_the_cores_are_this_process_s():
    assert 1 <= options.cpu_cores()


def test_bootstrap_samples_within_the_ceiling(capsys, no_work):
    line = refusal(capsys, reproduce.parse_args, ["multi30k", "--bootstrap-samples", str(10 ** 12)])
    assert line.endswith("argument --bootstrap-samples: invalid value '1000000000000': must be >= 1 and <= 10000 "
                         "(10 x the field's 1000 resamples)"), line
    assert reproduce.parse_args(["multi30k", "--bootstrap-samples", "10000"]).bootstrap_samples == 10000


def test_spm_vocab_size_within_sentencepiece_s_range(capsys, no_work):
    line = refusal(capsys, prepare.main, ["gigaword", "--subword", "sentencepiece", "--spm-vocab-size", "2147483648"])
    assert line.endswith("argument --spm-vocab-size: invalid value '2147483648': must be >= 1 and <= 1000000 "
                         "(sentencepiece's seed pieces)"), line


def test_rouge_n_within_the_ceiling(tmp_path, capsys, no_work):
    ref = tmp_path / "ref.txt"
    ref.write_text("a b\n")
    line = refusal(capsys, files2rouge.main, [str(ref), str(ref), "-n", "1000000"])
    assert line.endswith("argument -n/--rouge_n: invalid value '1000000': must be >= 0 and <= 9 "
                         "(0: no ROUGE-N, ROUGE-L only)"), line


@pytest.mark.parametrize("rouge_args, said", [
    ("-c 95 -r 1000000000000 -n 2 -a",
     "ROUGE's -r 1000000000000: must be >= 1 and <= 10000 (10 x the field's 1000 resamples)"),
    ("-c 95 -r 1000 -n 1000000 -a", "ROUGE's -n 1000000: must be >= 0 and <= 9"),
    # read as ROUGE-1.5.5's getopts reads them: a value glued to its letter, flags bundled, the last kept
    ("-c 95 -r 1000 -a -n1000000", "ROUGE's -n 1000000: must be >= 0 and <= 9"),
    ("-c 95 -r1000000000000 -n 2 -a", "ROUGE's -r 1000000000000: must be >= 1 and <= 10000"),
    ("-c 95 -amn1000000", "ROUGE's -n 1000000: must be >= 0 and <= 9"),
    ("-c 95 -n 2 -n 1000000 -a", "ROUGE's -n 1000000: must be >= 0 and <= 9"),
    ("-c 95 -n2x", "ROUGE's -n 2x: not an integer"),
])
def test_rouge_s_own_resamples_and_n_within_the_same_ceilings(tmp_path, capsys, no_work, rouge_args, said):
    ref = tmp_path / "ref.txt"
    ref.write_text("a b\n")
    assert files2rouge.main([str(ref), str(ref), f"-a={rouge_args}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR: -a {rouge_args!r}: {said}") and err.count("\n") == 1, err


def test_rouge_s_arguments_are_read_as_its_getopts_reads_them():
    from man_recipes.rouge155 import getopts

    assert getopts("-c 95 -r 1000 -n 2 -a".split()) == {"c": "95", "r": "1000", "n": "2", "a": True}
    assert getopts(["-mn4", "-c95", "-x"]) == {"m": True, "n": "4", "c": "95", "x": True}
    assert getopts(["-n", "-2"]) == {"n": "-2"}  # the next word is the value, whatever it looks like
    assert getopts(["-q", "-n3", "conf.xml", "-n", "1000000"]) == {"n": "3"}  # unknown -q skipped; stops at conf.xml
    assert getopts(["-n", "3", "--", "-n", "1000000"]) == {"n": "3"}


def test_a_bound_is_named_in_the_refusal():
    parse = options.number("--x", low=1, high=4, ceiling="why four")
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be >= 1 and <= 4 \(why four\)"):
        parse("5")


def test_speed_threads_and_generated_sentences_within_their_ceilings(tmp_path, capsys, no_work, monkeypatch):
    from lab.speed import profile, synthetic

    monkeypatch.setattr(options, "cpu_cores", lambda: 2)
    line = refusal(capsys, lambda argv: profile.parse(argv, "scripts/speed.sh profile"),
                   ["gigaword-cpu", "--threads", "1000000"])
    assert line.endswith("argument --threads: invalid value '1000000': must be >= 1 and <= 2 "
                         "(the 2 CPU core(s) this process may use)"), line
    monkeypatch.setattr(synthetic.tempfile, "mkdtemp", lambda *a, **k: pytest.fail("work started"))
    line = refusal(capsys, synthetic.main, ["--sentences", str(10 ** 12), "--results-dir", str(tmp_path)])
    assert line.endswith("argument --sentences: invalid value '1000000000000': must be >= 1 and <= 1000000 "
                         "(the ceiling of a generated corpus)"), line
