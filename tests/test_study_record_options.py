"""scripts/reproduce.sh's scoring options in a record's fingerprint (the committed records, made with
the defaults, still match; another --avg-last, --batch-size, --device or --precision does not), and
broken records or hypothesis files named in one line, exit status 2."""

import json
import shutil
import subprocess
import sys
import types

import pytest
from conftest import REPO, child_env

from man_recipes.studies import reproduce, study_table
from man_recipes.studies import study_records as sr
from man_recipes.config import CONFIG_DIR, load_config

CPU_CONFIGS = CONFIG_DIR / "multi30k-cpu"


def _args(data=None, **options):
    """scripts/reproduce.sh's arguments as main() resolves them (its defaults unless given)."""
    base = {"avg_last": None, "batch_size": 128, "device": "cpu", "precision": "fp16", "fairseq_args": [],
            "data": data}
    return types.SimpleNamespace(**dict(base, **options))


@pytest.mark.parametrize("family", reproduce.FAMILIES)
def test_the_defaults_keep_the_fingerprint_records_were_made_with(family, tmp_path):
    cfg = load_config(CPU_CONFIGS / f"{family}.yaml")
    (tmp_path / "dict.de.txt").write_text("a 1\n")
    for data in (None, tmp_path):
        before = sr.config_fingerprint(cfg, [], 2, data)  # the hash of every record made so far
        assert sr.record_fingerprint(cfg, _args(data), 2) == before
        # the same values spelt out: the config's avg_last, fp32 (what CPU runs in)
        assert sr.record_fingerprint(cfg, _args(data, avg_last=cfg["eval"]["avg_last"], precision="fp32"), 2) == before
        # run folders stamped before the training fingerprint left out `eval` are still recognised
        assert sr.legacy_training_fingerprint(cfg, _args(data), 2) == before


def test_every_option_that_changes_a_score_changes_the_fingerprint():
    cfg = load_config(CPU_CONFIGS / "man.yaml")
    assert cfg["eval"]["avg_last"] == 5
    variants = {"default": {}, "avg 1": {"avg_last": 1}, "avg 3": {"avg_last": 3}, "batch 64": {"batch_size": 64},
                "cuda fp16": {"device": "cuda"}, "cuda fp32": {"device": "cuda", "precision": "fp32"},
                "cuda bf16": {"device": "cuda", "precision": "bf16"}}
    fps = {name: sr.record_fingerprint(cfg, _args(**o), 1) for name, o in variants.items()}
    assert len(set(fps.values())) == len(fps), fps
    # a config whose own avg_last is 3: --avg-last 3 is its default, --avg-last 5 is not
    cfg3 = dict(cfg, eval=dict(cfg["eval"], avg_last=3))
    assert sr.record_fingerprint(cfg3, _args(avg_last=3), 1) == sr.config_fingerprint(cfg3, [], 1)
    assert sr.record_fingerprint(cfg3, _args(avg_last=5), 1) != sr.config_fingerprint(cfg3, [], 1)


def test_a_run_folder_is_rescored_not_retrained_for_a_scoring_option():
    """The run folder's fingerprint (training) leaves out what changes only the scoring."""
    cfg = load_config(CPU_CONFIGS / "man.yaml")
    trained = sr.record_fingerprint(cfg, _args(), 1, training=True)
    for scoring in ({"avg_last": 3}, {"batch_size": 64}):
        assert sr.record_fingerprint(cfg, _args(**scoring), 1, training=True) == trained
        assert sr.record_fingerprint(cfg, _args(**scoring), 1) != sr.record_fingerprint(cfg, _args(), 1)
    assert sr.record_fingerprint(cfg, _args(device="cuda"), 1, training=True) != trained


def test_a_config_whose_eval_changes_is_rescored_not_retrained():
    cfg = load_config(CPU_CONFIGS / "man.yaml")
    last = dict(cfg, eval=dict(cfg["eval"], avg_last=1))
    assert sr.record_fingerprint(last, _args(), 1, training=True) == sr.record_fingerprint(cfg, _args(), 1, training=True)
    assert sr.record_fingerprint(last, _args(), 1) != sr.record_fingerprint(cfg, _args(), 1)
    trained = dict(cfg, train=dict(cfg["train"], lr=1e-3))
    assert sr.record_fingerprint(trained, _args(), 1, training=True) != sr.record_fingerprint(cfg, _args(), 1, training=True)


def _run_folder(tmp_path, stamp):
    run = tmp_path / "man-seed1"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (run / ".fingerprint").write_text(stamp + "\n")
    (run / ".train.done").write_text("done\n")
    return run


def test_a_finished_run_folder_with_a_legacy_stamp_is_restamped_not_retrained(tmp_path):
    run = _run_folder(tmp_path, "legacyhash")
    assert reproduce.prepare_run_dir(run, "newhash", force=False, legacy="legacyhash") is True
    assert (run / ".fingerprint").read_text().strip() == "newhash"


def test_a_run_folder_of_another_training_is_refused(tmp_path):
    run = _run_folder(tmp_path, "otherhash")
    with pytest.raises(reproduce.ReproduceError, match="another config"):
        reproduce.prepare_run_dir(run, "newhash", force=False, legacy="legacyhash")
    assert (run / ".fingerprint").read_text().strip() == "otherhash"


def _reproduce(*argv):
    proc = subprocess.run([sys.executable, "-m", "man_recipes.studies.reproduce", *map(str, argv)], cwd=REPO,
                          env=child_env({"OMP_NUM_THREADS": "1"}), capture_output=True, text=True, timeout=600)
    return proc


def _without_date(md):
    return [line for line in md.splitlines() if not line.startswith("- built: ")]


def test_committed_records_still_make_their_table_and_another_avg_last_does_not(shared_data, tmp_path):
    """scripts/reproduce.sh multi30k-cpu --table-only on the real data and a copy of results/."""
    if not (shared_data / "multi30k").is_dir():
        pytest.skip(f"{shared_data / 'multi30k'} is not present")
    data = tmp_path / "data-bin"
    prep = subprocess.run([str(REPO / "data-prep" / "prepare-multi30k.sh"), "--from", str(shared_data / "multi30k"),
                           "--work", str(tmp_path / "work"), "--dest", str(data)], cwd=REPO,
                          env=child_env({"PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}),
                          capture_output=True, text=True, timeout=900)
    assert prep.returncode == 0, prep.stdout[-3000:] + prep.stderr[-3000:]
    results = tmp_path / "results"
    shutil.copytree(REPO / "results", results)
    committed = (REPO / "results" / "multi30k-cpu.md").read_text()
    n_records = len(list((REPO / "results" / "multi30k-cpu").glob("*-seed*.json")))
    assert n_records >= 2
    # the same table sets the runs to convergence beside them; another --avg-last makes those stale too
    n_converged = len(list((REPO / "results" / "multi30k-cpu-converge").glob("*-seed*.json")))

    proc = _reproduce("multi30k-cpu", "--table-only", "--data", data, "--results-dir", results)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "stale record" not in proc.stdout
    assert len(json.loads((results / "multi30k-cpu.json").read_text())["runs"]) == n_records
    # the same table but for where its data and results are, which its title and command of one run name
    rebuilt = (results / "multi30k-cpu.md").read_text()
    assert f" [data `{data}`, bpe subwords]" in rebuilt and f" --data {data} --results-dir {results}" in rebuilt
    rebuilt = rebuilt.replace(f" [data `{data}`, bpe subwords]", "").replace(f" --data {data} --results-dir {results}", "")
    assert _without_date(rebuilt) == _without_date(committed)

    proc = _reproduce("multi30k-cpu", "--table-only", "--data", data, "--results-dir", results, "--avg-last", "3")
    assert proc.returncode == 2
    assert proc.stdout.count("stale record") == n_records + n_converged
    assert proc.stderr.strip().startswith("ERROR: no current run record") and len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ broken records and hypotheses

def _record(family, seed, fp, n=3):
    return {"family": family, "seed": seed, "fingerprint": fp, "arch": "a", "params": 1000, "train_seconds": 60.0,
            "updates": 10, "valid_curve": [[5, 7.0], [10, 6.0]], "device": "CPU", "commit": "abc",
            "test_sets": {"test": {"name": "test_2016_flickr", "n_sentences": n, "sacrebleu": 100.0,  # its hypotheses: the references
                                   "bleu_tok_ci": 31.0, "sacrebleu_signature": "nrefs:1|case:mixed"}}}


# the hypotheses of both records, and the references: sacreBLEU 100 (each has 4-grams)
HYPOTHESES = ["a b c d e", "f g h i j", "k l m n o"]


@pytest.fixture
def study(tmp_path):
    """A data folder (manifest, dictionaries, references) and current records of two families."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "multi30k.json").write_text(json.dumps({"test_sets": {"test": "test_2016_flickr"}, "target_lang": "en"}))
    (data / "dict.de.txt").write_text("a 1\n")
    (data / "test.raw.en").write_text("".join(line + "\n" for line in HYPOTHESES))
    records = tmp_path / "results" / "multi30k-cpu"
    for family in ("transformer", "man"):
        fp = sr.record_fingerprint(load_config(CPU_CONFIGS / f"{family}.yaml"), _args(data), 1)
        sr.write_record(records, _record(family, 1, fp), {"test": HYPOTHESES})
    return data, tmp_path / "results"


def _table(data, results, capsys):
    rc = reproduce.main(["multi30k-cpu", "--table-only", "--data", str(data), "--results-dir", str(results),
                         "--bootstrap-samples", "10"])
    return rc, capsys.readouterr().err.strip()


def _refused(rc, err):
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("ERROR: "), err
    assert "Traceback" not in err
    return lines[0]


def test_a_current_study_makes_its_table(study, capsys):
    data, results = study
    rc, err = _table(data, results, capsys)
    assert rc == 0, err
    assert len(json.loads((results / "multi30k-cpu.json").read_text())["runs"]) == 2


def test_a_file_of_the_tables_name_it_did_not_write_is_not_replaced(study, capsys):
    """Issue 82.7: --table-only replaced a user's own multi30k-cpu.md in --results-dir with no word. A
    table of ours (its marker line, or, written before it, the title of the .json beside it) is
    rebuilt; another file of that name is refused in one line and kept, unless --force."""
    data, results = study
    md, table, png = (results / name for name in ("multi30k-cpu.md", "multi30k-cpu.json", "multi30k-cpu-valid-loss.png"))
    for mine in (md, table, png):
        mine.write_text("my own notes\n")
        line = _refused(*_table(data, results, capsys))
        assert line.startswith(f"ERROR: {mine} was not written by scripts/reproduce.sh") and "--force" in line
        assert mine.read_text() == "my own notes\n"
        mine.unlink()
    assert _table(data, results, capsys)[0] == 0
    assert md.read_text().endswith(f"\n{study_table.MARKER}\n")
    md.write_text(md.read_text().replace(study_table.MARKER, ""))  # a table written before the marker
    assert _table(data, results, capsys)[0] == 0 and study_table.MARKER in md.read_text()
    md.write_text("my own notes\n")
    rc = reproduce.main(["multi30k-cpu", "--table-only", "--data", str(data), "--results-dir", str(results),
                         "--bootstrap-samples", "10", "--force"])
    assert rc == 0 and study_table.MARKER in md.read_text()


def test_a_study_whose_configs_changed_under_every_record_says_so(study, capsys):
    """Every record stale under the default options (the configs changed after the runs): the table
    says no run is current and lists them, and the last table's figure goes; the records stay. With
    other options given, the same state is refused and nothing is touched (a forgotten option is
    the likelier cause)."""
    data, results = study
    assert _table(data, results, capsys)[0] == 0
    png = results / "multi30k-cpu-valid-loss.png"
    assert png.is_file()
    for family in ("transformer", "man"):
        path = results / "multi30k-cpu" / f"{family}-seed1.json"
        path.write_text(json.dumps(dict(json.loads(path.read_text()), fingerprint="0" * 16)))
    before = (results / "multi30k-cpu.md").read_text()
    mine = results / "multi30k-cpu.png"  # not this study's figure name: never removed
    mine.write_bytes(b"a user's figure")
    rc = reproduce.main(["multi30k-cpu", "--table-only", "--data", str(data), "--results-dir", str(results),
                         "--avg-last", "3"])
    assert "pass the options they were made with" in _refused(rc, capsys.readouterr().err.strip())
    assert (results / "multi30k-cpu.md").read_text() == before and png.is_file()

    rc, err = _table(data, results, capsys)
    assert rc == 0, err
    md = (results / "multi30k-cpu.md").read_text()
    assert "No run record matches today's configs" in md and "| man-seed1 | `0000000000000000` |" in md
    assert "Transformer (small) |" not in md and not png.exists()
    assert mine.read_bytes() == b"a user's figure"
    table = json.loads((results / "multi30k-cpu.json").read_text())
    assert table["runs"] == [] and sorted(table["stale"]) == ["man-seed1", "transformer-seed1"]
    assert len(list((results / "multi30k-cpu").glob("*-seed1.json"))) == 2


def test_a_truncated_record_is_named(study, capsys):
    data, results = study
    path = results / "multi30k-cpu" / "man-seed1.json"
    path.write_text(path.read_text()[:100])
    line = _refused(*_table(data, results, capsys))
    assert f"{path}: not a readable record" in line


def test_a_record_without_family_is_named(study, capsys):
    data, results = study
    path = results / "multi30k-cpu" / "man-seed1.json"
    record = json.loads(path.read_text())
    del record["family"]
    path.write_text(json.dumps(record))
    assert f"{path}: the record lacks family" in _refused(*_table(data, results, capsys))
    record = dict(record, family="transformer")  # another run's record under this name
    path.write_text(json.dumps(record))
    assert f"{path}: holds the record of transformer-seed1" in _refused(*_table(data, results, capsys))


def test_hypotheses_cut_short_are_named(study, capsys):
    data, results = study
    hyp = results / "multi30k-cpu" / "man-seed1.test.hyp"
    hyp.write_text("a b c\nd e\n")
    line = _refused(*_table(data, results, capsys))
    assert f"{hyp}: 2 hypotheses, but its record" in line and "scored 3 sentences" in line


def test_a_record_whose_hypotheses_do_not_give_its_score_is_refused(study, capsys):
    """A score edited by hand (hypotheses unchanged) never reaches the table (issue 48, item 6)."""
    data, results = study
    path = results / "multi30k-cpu" / "man-seed1.json"
    record = json.loads(path.read_text())
    record["test_sets"]["test"]["sacrebleu"] = 45.0
    path.write_text(json.dumps(record))
    line = _refused(*_table(data, results, capsys))
    assert line == (f"ERROR: {path}: its sacrebleu on test is 45.00, but its hypotheses (man-seed1.test.hyp) score "
                    "100.00; restore both (git checkout) or rerun that run (--force)")
    assert not (results / "multi30k-cpu.md").exists()


@pytest.mark.parametrize("damage, field", [
    (lambda r: r["test_sets"]["test"].update(sacrebleu=float("nan")), "test set test: its sacrebleu is nan"),
    (lambda r: r["test_sets"]["test"].update(sacrebleu="100.0"), "test set test: its sacrebleu is '100.0'"),
    (lambda r: r.update(train_seconds=None), "its train_seconds is None"),
    (lambda r: r.update(updates=10.5), "its updates is 10.5"),
    (lambda r: r["test_sets"].update(tst=r["test_sets"].pop("test")), "its test set tst is not one of the data folder's"),
])
def test_a_damaged_record_is_one_line_naming_its_file_and_field(study, capsys, damage, field):
    """Issue 82.9: a NaN score, a score as text, train_seconds null, a renamed test set ended
    --table-only in tracebacks (or, for the NaN, a table of nan)."""
    data, results = study
    path = results / "multi30k-cpu" / "man-seed1.json"
    record = json.loads(path.read_text())
    damage(record)
    if "tst" in record["test_sets"]:
        shutil.copy(path.with_name("man-seed1.test.hyp"), path.with_name("man-seed1.tst.hyp"))
    path.write_text(json.dumps(record))
    line = _refused(*_table(data, results, capsys))
    assert line.startswith(f"ERROR: {path}: ") and field in line, line
    assert not (results / "multi30k-cpu.md").exists()


def test_a_record_to_convergence_whose_stop_fields_were_edited_is_refused(study, capsys):
    """Its stop fields edited by hand (issue 72, item 4): printed as "40 (best 5), 5.000" with exit 0."""
    data, results = study
    converged = results / "multi30k-cpu-converge"
    converged.mkdir()
    for name in ("transformer-seed1.json", "transformer-seed1.test.hyp"):  # a committed record (stale here)
        shutil.copy(REPO / "results" / "multi30k-cpu-converge" / name, converged / name)
    path = converged / "transformer-seed1.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), stopping_epoch=40, best_epoch=5,
                                    best_valid_loss=5.0)))
    line = _refused(*_table(data, results, capsys))
    assert line == (f"ERROR: {path}: it stopped at epoch 40 (26 epochs), but its dev curve has 26 validations, "
                    "one per epoch; restore it (git checkout) or rerun that run (--force)")
    assert not (results / "multi30k-cpu.md").exists()


def test_table_only_without_records_does_not_ask_for_data(tmp_path, capsys):
    rc = reproduce.main(["multi30k-cpu", "--table-only", "--data", str(tmp_path / "none"), "--results-dir",
                         str(tmp_path / "results")])
    line = _refused(rc, capsys.readouterr().err.strip())
    assert "no run record in" in line and "nothing to tabulate" in line and "prepare" not in line


def test_table_only_says_what_it_reads_of_a_missing_data_folder(study, tmp_path, capsys):
    _, results = study
    rc = reproduce.main(["multi30k-cpu", "--table-only", "--data", str(tmp_path / "none"), "--results-dir", str(results)])
    line = _refused(rc, capsys.readouterr().err.strip())
    assert line.startswith(f"ERROR: --table-only reads the data folder {tmp_path / 'none'} (its dictionaries")
    assert "prepare-multi30k.sh" in line


def test_time_updates_below_two_is_refused_before_any_training(tmp_path, capsys):
    """One update gives one progress line, and seconds per update need two: it failed after training."""
    with pytest.raises(SystemExit) as e:
        reproduce.main(["multi30k-cpu", "--data", str(tmp_path / "nothing"), "--time-updates", "1"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "scripts/reproduce.sh: error: argument --time-updates: invalid value '1': must be >= 2 and <= 100000 (a timing, not a training)")


def test_a_table_of_runs_with_fairseq_overrides_says_so_in_its_headings(study, capsys):
    """"d=256, 3+3 layers" in the title is the configs'; options after -- may override it."""
    data, results = study
    records = results / "multi30k-cpu"
    args = _args(data, fairseq_args=["--encoder-layers", "2"])
    for family in ("transformer", "man"):
        path = records / f"{family}-seed1.json"
        fp = sr.record_fingerprint(load_config(CPU_CONFIGS / f"{family}.yaml"), args, 1)
        path.write_text(json.dumps(dict(json.loads(path.read_text()), fingerprint=fp)))
    rc = reproduce.main(["multi30k-cpu", "--table-only", "--data", str(data), "--results-dir", str(results),
                         "--bootstrap-samples", "10", "--", "--encoder-layers", "2"])
    assert rc == 0, capsys.readouterr().err
    title = (results / "multi30k-cpu.md").read_text().splitlines()[0]
    assert "d=256, 3+3 layers" in title and title.endswith(
        "[with fairseq options `--encoder-layers 2`, which override the configs' values above]")


def test_an_interrupted_study_says_what_and_how_to_resume(study, monkeypatch, capsys):
    data, results = study

    def interrupted(args, cfgs, manifest):
        args.doing = ("training man-seed1", "it resumes from its last epoch checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce, "run_study", interrupted)
    rc = reproduce.main(["multi30k-cpu", "--data", str(data), "--results-dir", str(results)])
    assert rc == 130 and capsys.readouterr().err.strip().splitlines() == [
        "scripts/reproduce.sh: interrupted while training man-seed1; run the same command again to resume: "
        "finished runs are skipped and it resumes from its last epoch checkpoint"]
