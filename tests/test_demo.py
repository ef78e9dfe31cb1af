"""`make demo` (scripts/demo.py): a short real run, and its checks on user-supplied text."""

import re
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import demo  # noqa: E402
from man_recipes import options  # noqa: E402


def test_demo_runs_the_whole_pipeline(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, REPO / "scripts" / "demo.py", "--out", out, "--epochs", "2", "--average", "2",
         "--train-size", "100", "--eval-size", "10", "--seeds", "3,4",
         "--threads", "1"],  # one thread, like every test process (the demo's default is 2)
        capture_output=True, text=True, timeout=2400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert [r.split("|")[2].strip() for r in rows] == ["`transformer`", "`transformer_man_base`"]
    for row, tag in zip(rows, ("transformer", "man")):
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        # parameters: fairseq-train's own count; BLEU: mean ± sample std over the seeds of sacreBLEU
        # (tokenize none) on each seed's fairseq-generate output, read here on its own
        counts = {re.search(r"num\. shared model params: ([\d,]+)", (out / f"train_{tag}_seed{s}.log").read_text())
                  .group(1) for s in (3, 4)}
        assert counts == {cells[2]}
        bleus = [_generate_bleu(out / f"generate_{tag}_seed{s}.log") for s in (3, 4)]
        mean = sum(bleus) / len(bleus)
        std = (sum((b - mean) ** 2 for b in bleus) / (len(bleus) - 1)) ** 0.5  # sample std
        assert cells[3] == f"{mean:.2f} ± {std:.2f}", (cells, bleus)
        wps, wps_sd = (float(x.replace(",", "")) for x in cells[4].split(" ± "))
        assert wps > 0 and wps_sd >= 0  # wall-clock speed: no value to compare with
    assert "**synthetic**" in table and "seeds 3..4" in table
    assert re.search(r"train \| epoch 002 \| loss", proc.stdout), "epochs are shown as they finish"
    for seed in (3, 4):
        assert (out / f"checkpoints_man_seed{seed}" / "averaged.pt").is_file()
        assert f"'seed': {seed}," in (out / f"train_man_seed{seed}.log").read_text()
    # everything the demo wrote is in its marker, so the next run can remove it (and only it)
    listed = set((out / demo.MARKER).read_text().split())
    assert {p.name for p in out.iterdir()} - {demo.MARKER} <= listed


def _generate_bleu(log):
    """sacreBLEU (tokenize none) of the top hypotheses against the targets in a fairseq-generate log."""
    import sacrebleu

    text = log.read_text()
    hyps = dict(re.findall(r"^H-(\d+)\t[^\t]*\t(.*)$", text, re.M))
    refs = dict(re.findall(r"^T-(\d+)\t(.*)$", text, re.M))
    assert hyps and set(hyps) == set(refs)
    ids = sorted(hyps, key=int)
    return sacrebleu.corpus_bleu([hyps[i] for i in ids], [[refs[i] for i in ids]], tokenize="none").score


def _write(folder, split, src_lines, tgt_lines):
    (folder / f"{split}.de").write_text("".join(l + "\n" for l in src_lines))
    (folder / f"{split}.en").write_text("".join(l + "\n" for l in tgt_lines))


MANY_SEEDS = ",".join(map(str, range(1, 1102)))


@pytest.mark.parametrize("argv, said", [
    (["--epochs", "0"], "argument --epochs: invalid value '0': must be >= 1"),  # trained nothing, then failed
    (["--seeds", "0"], "argument --seeds: invalid value '0': must be >= 1 and <= 1000 (each seed is a training run)"),
    (["--threads", "0"], "argument --threads: invalid value '0': must be >= 1 and <= 2 "
                         "(the 2 CPU core(s) this process may use)"),
    (["--train-size", "-5"], "argument --train-size: invalid value '-5': must be >= 1 and <= 1000000 "
                             "(the ceiling of a generated corpus)"),
    # the ceilings (issue #72): 10^12 seeds filled the memory before any work, 10^6 threads the process table
    (["--seeds", str(10 ** 12)], "argument --seeds: invalid value '1000000000000': must be >= 1 and <= 1000 "
                                 "(each seed is a training run)"),
    (["--seeds", MANY_SEEDS], f"argument --seeds: invalid value '{MANY_SEEDS}': more than 1000 seeds (each seed is "
                              "a training run)"),
    (["--threads", "1000000"], "argument --threads: invalid value '1000000': must be >= 1 and <= 2 "
                               "(the 2 CPU core(s) this process may use)"),
    (["--eval-size", str(10 ** 9)], "argument --eval-size: invalid value '1000000000': must be >= 1 and <= 1000000 "
                                    "(the ceiling of a generated corpus)"),
    (["--epochs", "2", "--average", "3"], "--average 3: more than the 2 epoch(s) of --epochs"),  # failed after training
])
def test_counts_are_checked_when_the_arguments_are_read(tmp_path, argv, said, capsys, monkeypatch):
    monkeypatch.setattr(options, "cpu_cores", lambda: 2, raising=False)
    with pytest.raises(SystemExit) as e:
        demo.main(["--out", str(tmp_path / "out"), *argv])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(f"error: {said}")
    assert not (tmp_path / "out").exists()


def test_user_data_checks(tmp_path):
    for split in ("train", "valid", "test"):
        _write(tmp_path, split, ["a b", "c"], ["x", "y z"])
    demo.check_user_data(tmp_path, "de", "en")  # fine

    _write(tmp_path, "valid", ["a b", "c"], ["x"])
    with pytest.raises(SystemExit, match="valid.de has 2 lines but .*valid.en has 1"):
        demo.check_user_data(tmp_path, "de", "en")

    _write(tmp_path, "valid", ["a b", ""], ["x", "y"])
    with pytest.raises(SystemExit, match="empty lines .*line 2"):
        demo.check_user_data(tmp_path, "de", "en")

    (tmp_path / "test.en").unlink()
    _write(tmp_path, "valid", ["a"], ["x"])
    with pytest.raises(SystemExit, match="missing .*test.en"):
        demo.check_user_data(tmp_path, "de", "en")


def test_out_folder_of_the_user_is_never_deleted(tmp_path):
    # a non-empty folder the demo did not create is refused before anything runs
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="is not empty and was not created by demo"):
        demo.main(["--out", str(mine)])
    assert (mine / "notes.txt").read_text() == "keep me"

    # --data inside --out: refused, the corpus untouched
    corpus = tmp_path / "work" / "corpus"
    corpus.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        _write(corpus, split, ["a b"], ["x"])
    with pytest.raises(SystemExit, match="lies inside the output folder"):
        demo.main(["--out", str(tmp_path / "work"), "--data", str(corpus), "--src", "de", "--tgt", "en"])
    assert sorted(p.name for p in corpus.iterdir()) == sorted(
        f"{s}.{l}" for s in ("train", "valid", "test") for l in ("de", "en"))


def test_rerun_removes_only_what_the_demo_wrote(tmp_path):
    out = demo.prepare_out_dir(tmp_path / "out")
    (out / "raw").mkdir()
    (out / "raw" / "train.src").write_text("w1\n")
    (out / "results.md").write_text("old")
    demo.created(out, "raw", "results.md")
    (out / "notes.txt").write_text("mine")  # added by the user between runs
    demo.prepare_out_dir(out)
    assert sorted(p.name for p in out.iterdir()) == [demo.MARKER, "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_try_lock_has_one_owner_at_a_time(tmp_path):
    """The lock of scripts/reproduce.sh's runs and of data-prep's --work folders (workdir.try_lock)."""
    from man_recipes.workdir import try_lock

    lock = tmp_path / ".lock"
    with try_lock(lock) as first:
        with try_lock(lock) as second:  # another open file: as another process would
            assert (first, second) == (True, False)
    with try_lock(lock) as again:  # released with the block
        assert again


def test_words_per_second_inputs():
    log = ("2026 | INFO | train | epoch 001 | loss 5 | wps 200 | ups 1 | wpb 100.5 | bsz 10 | num_updates 4 | lr 0.1\n"
           "2026 | INFO | valid | epoch 001 | loss 5 | wps 999 | wpb 70 | num_updates 4\n"
           "2026 | INFO | train | epoch 002 | loss 4 | wps 9000 | ups 1 | wpb 90 | bsz 10 | num_updates 7 | lr 0.1\n")
    assert demo.words_trained(log) == 100.5 * 4 + 90 * 3
    assert demo.mean_std([1.0]) == (1.0, None)  # the one mean_std of every table (man_recipes/tables.py)
    m, sd = demo.mean_std([1.0, 2.0, 3.0])
    assert m == 2.0 and sd == 1.0


def test_seeds_mean_what_they_mean_to_reproduce(capsys):
    """--seeds N is seeds 1..N and "a,b" that list, as scripts/reproduce.sh takes them; --seed S is S alone."""
    p = demo.build_parser()

    def seeds(*argv):
        return demo.seeds_of(p, p.parse_args(list(argv)))

    assert seeds() == [1]
    assert seeds("--seeds", "3") == [1, 2, 3]
    assert seeds("--seeds", "3,4") == [3, 4]
    assert seeds("--seeds", "3,") == [3]
    assert seeds("--seed", "5") == [5]
    for bad, said in ((("--seed", "3", "--seeds", "2"), "--seed 3 and --seeds [1, 2]: give one"),
                      (("--seeds", "0"), "argument --seeds: invalid value '0': must be >= 1"),
                      (("--seeds", "2,2"), "argument --seeds: invalid value '2,2': a list of distinct seeds >= 1")):
        with pytest.raises(SystemExit) as stopped:
            seeds(*bad)
        assert stopped.value.code == 2 and f"error: {said}" in capsys.readouterr().err.splitlines()[-1], bad
