"""No option value exhausts the machine (issue #72 item 3): each count is bounded where it is parsed,
by what the machine and the method can take, and a value beyond is one argparse line (exit status 2)
naming the bound, before any work starts. No test here runs the exhausting value: each checks that
the refusal comes first (a Pool, ROUGE or sentencepiece call would fail the test)."""

import argparse
import subprocess

import pytest
from conftest import REPO, child_env

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


# ------------------------------------------------------------ issue 82: the lab's counts, --batch-size, --time-updates

BIG = str(10 ** 12)


def _lab_main(name):
    import importlib

    module = importlib.import_module(name)
    if name == "lab.speed.study":
        return lambda argv: module.main(["gigaword-cpu", *argv])
    return module.main


@pytest.mark.parametrize("module, argv, said", [
    # hung, segfaulted, or died on SIGFPE before
    ("lab.speed.fused_bias", ["--repeats", BIG], f"argument --repeats: invalid value '{BIG}': must be >= 1 and <= 100 "
                                                  "(20 x a measurement's usual 5 repeats)"),
    ("lab.speed.fused_bias", ["--threads", "1000000"], "argument --threads: invalid value '1000000': must be >= 1 and "
                                                       "<= 2 (the 2 CPU core(s) this process may use)"),
    ("lab.speed.fused_bias", ["--memory-repeats", "0"], "argument --memory-repeats: invalid value '0': must be >= 1"),
    ("lab.speed.fused_bias", ["--batch", "1", "--length", "100000"],
     "--batch 1 x --length 100000²: 10,000,000,000 attention scores a head, at most 67,108,864 (1 GiB of float32 a "
     "head)"),
    ("lab.speed.fused_bias", ["--blocks", "4096,0"], "argument --blocks: invalid value '0': must be >= 1"),
    ("lab.speed.fused_bias", ["--blocks", "4096,,8"], "argument --blocks: invalid value '4096,,8': an empty item"),
    ("lab.flex_keys", ["data", "--required-batch-size-multiple", "0"],
     "argument --required-batch-size-multiple: invalid value '0': must be >= 1 and <= 1000000 (no batch holds more "
     "sentences than --max-tokens' ceiling of tokens)"),
    ("lab.flex_keys", ["data", "--max-tokens", str(10 ** 30)], "argument --max-tokens: invalid value "),
    ("lab.flex_keys", ["data", "--max-source-positions", "0"], "argument --max-source-positions: invalid value '0'"),
    ("lab.lr_probe", ["multi30k/man", "--updates", BIG], f"argument --updates: invalid value '{BIG}': must be >= 1 and "
                                                         "<= 1000000 (the ceiling of a measurement's training run)"),
    ("lab.lr_probe", ["multi30k/man", "--time-limit", "1e9"], "argument --time-limit: invalid value '1e9': must be > 0 "
                                                              "and <= 1440 (a day)"),
    ("lab.gpu_check", ["--updates", BIG], f"argument --updates: invalid value '{BIG}'"),
    ("lab.gpu_check", ["--timeout", "inf"], "argument --timeout: invalid value 'inf': must be a finite number"),
    ("lab.speed.study", ["--repeats", BIG], f"argument --repeats: invalid value '{BIG}': must be >= 1 and <= 100"),
    ("lab.speed.study", ["--log-interval", BIG], f"argument --log-interval: invalid value '{BIG}'"),
    ("lab.speed.study", ["--batch-size", str(10 ** 30)], "argument --batch-size: invalid value "),
    ("lab.decode_paths", ["c.yaml", "c.pt", "--batch-size", str(10 ** 30)],
     f"argument --batch-size: invalid value '{10 ** 30}': must be >= 1 and <= 1000000 (sentences per batch: more than "
     "any test set holds)"),
    ("lab.compare_rouge_scorers", ["shared", "--max-docs", "0"], "argument --max-docs: invalid value '0': must be >= 1"),
])
def test_every_count_of_the_lab_is_bounded_where_it_is_parsed(module, argv, said, capsys, no_work, monkeypatch):
    monkeypatch.setattr(options, "cpu_cores", lambda: 2)
    line = refusal(capsys, _lab_main(module), argv)
    assert said in line, line


@pytest.mark.parametrize("command", ["evaluate", "reproduce"])
def test_a_batch_size_beyond_any_test_set_is_one_line_naming_it(command, tmp_path, capsys, no_work):
    # fairseq-generate's batching overflowed int64 on --batch-size 10^30: an OverflowError naming no option
    from man_recipes.evaluation import evaluate

    main = {"evaluate": lambda argv: evaluate.main([str(tmp_path), *argv]),
            "reproduce": lambda argv: reproduce.main(["multi30k-cpu", "--results-dir", str(tmp_path / "r"), *argv])}
    line = refusal(capsys, main[command], ["--batch-size", str(10 ** 30)])
    assert line.endswith(f"argument --batch-size: invalid value '{10 ** 30}': must be >= 1 and <= 1000000 "
                         "(sentences per batch: more than any test set holds)"), line


def test_time_updates_is_bounded_and_blamed_when_the_run_stops_first(tmp_path, capsys, no_work, monkeypatch):
    from types import SimpleNamespace

    from man_recipes.config import CONFIG_DIR
    from man_recipes.training import launch

    line = refusal(capsys, reproduce.main, ["multi30k-cpu", "--results-dir", str(tmp_path / "r"),
                                            "--time-updates", BIG])
    assert line.endswith(f"argument --time-updates: invalid value '{BIG}': must be >= 2 and <= 100000 "
                         "(a timing, not a training)"), line

    def stopped_by_max_epoch(cfg, run, **kwargs):  # its epochs ended before a progress line
        run.mkdir(parents=True)
        (run / "train.log").write_text("begin training epoch 1\ndone training in 3.0 seconds\n")
        return 0

    monkeypatch.setattr(launch, "train", stopped_by_max_epoch)
    args = SimpleNamespace(runs_dir=str(tmp_path / "runs"), device="cpu", time_updates=50000, data=str(tmp_path),
                           precision="fp32", fairseq_args=[])
    with pytest.raises(reproduce.ReproduceError) as e:
        reproduce.time_families(["transformer"], {"transformer": {"_path": str(CONFIG_DIR / "multi30k-cpu" /
                                                                                "transformer.yaml")}}, args)
    assert str(e.value).startswith("--time-updates 50000: timing run transformer ended before its progress lines "
                                   "(one every 10000 updates) could time it (") and "--log-interval" not in str(e.value)


@pytest.mark.parametrize("script, env, said", [
    ("lab/man_training_study.sh", {"THREADS": "1000000"}, "THREADS=1000000: must be an integer >= 1 and <= "),
    ("lab/man_training_study.sh", {"EPOCHS": "0"}, "EPOCHS=0: must be an integer >= 1 and <= 1000 (the study trains 3)"),
    ("lab/gpu_session.sh", {"BUDGET": "1e12"}, "BUDGET=1e12: seconds, an integer >= 1 and <= 86400 (a day)"),
])
def test_the_lab_scripts_counts_from_the_environment_are_bounded(script, env, said, tmp_path):
    proc = subprocess.run(["bash", str(REPO / script), "NAME", "ARCH"], cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60,
                          env=child_env({**env, "OUT": str(tmp_path / "out"), "DATA": str(tmp_path)}))
    assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "out").exists()
