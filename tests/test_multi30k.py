"""Multi30k: data preparation, configs, and the whole reproduce pipeline end to end.

The pipeline tests run the real scripts (prepare-multi30k.sh -> fairseq-train -> averaging ->
fairseq-generate -> sacreBLEU -> run records -> paired bootstrap -> table + PNG) on a synthetic folder in
the release's layout (always; the real ../shared/data/multi30k head is in test_multi30k_real.py), with
a tiny model for a few updates.
"""

import datetime
import fcntl
import gzip
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TINY_MODEL

from man_recipes.training import fairseq_log
from man_recipes.options import cpu_cores
from man_recipes.studies import bleu_table, reproduce
from man_recipes.studies.study_records import read_records
from man_recipes.config import ConfigError, all_configs, load_config, validate

FAMILY_CONFIGS = sorted((REPO / "configs" / "multi30k").glob("*.yaml"))

DE = {"adj": ["kleiner", "großer", "junger", "alter", "roter"], "noun": ["Hund", "Mann", "Junge", "Vogel", "Radfahrer"],
      "verb": ["läuft", "springt", "sitzt", "steht", "wartet"], "place": ["im Park", "am Strand", "auf der Straße",
                                                                          "vor dem Haus", "im Schnee"]}
EN = {"adj": ["small", "big", "young", "old", "red"], "noun": ["dog", "man", "boy", "bird", "cyclist"],
      "verb": ["runs", "jumps", "sits", "stands", "waits"], "place": ["in the park", "on the beach", "on the street",
                                                                      "in front of the house", "in the snow"]}


def caption_pairs(n, seed):
    """Caption-like German-English pairs from a fixed word table (deterministic)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        idx = {k: rng.randrange(5) for k in DE}
        de = f"Ein {DE['adj'][idx['adj']]} {DE['noun'][idx['noun']]} {DE['verb'][idx['verb']]} {DE['place'][idx['place']]}."
        en = f"A {EN['adj'][idx['adj']]} {EN['noun'][idx['noun']]} {EN['verb'][idx['verb']]} {EN['place'][idx['place']]}."
        pairs.append((de, en))
    return pairs


def write_side(path, lines, gz):
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        Path(path).write_bytes(data)


def synthetic_release(folder):
    """train/val/test_2016_flickr (.gz, like the release) + an extra plain test_2017_flickr."""
    folder.mkdir(parents=True)
    for stem, n, seed, gz in [("train", 300, 1, True), ("val", 30, 2, False), ("test_2016_flickr", 25, 3, True),
                              ("test_2017_flickr", 20, 4, False)]:
        pairs = caption_pairs(n, seed)
        write_side(folder / f"{stem}.de", [p[0] for p in pairs], gz)
        write_side(folder / f"{stem}.en", [p[1] for p in pairs], gz)
    return folder


def run(cmd, timeout=600, check=True):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-6000:]
    return proc


def prepare(src_folder, tmp_path, *extra):
    work, dest = tmp_path / "work", tmp_path / "data-bin"
    out = run([REPO / "data-prep" / "prepare-multi30k.sh", "--from", src_folder, "--work", work, "--dest", dest,
               "--bpe-merges", "300", "--allow-nonstandard-splits", *extra]).stdout
    return dest, out


TINY_RUN = TINY_MODEL + ["--max-epoch", "2", "--max-tokens", "1500", "--warmup-updates", "4", "--lr", "0.003",
                         "--log-interval", "1"]


def reproduce_cmd(data, tmp_path, *ours):
    return [sys.executable, "-m", "man_recipes.studies.reproduce", "multi30k", "--seeds", "1", "--families", "man",
            "--device", "cpu", "--data", data, "--runs-dir", tmp_path / "runs", "--results-dir", tmp_path / "results",
            "--avg-last", "2", "--bootstrap-samples", "200", *ours, "--", *TINY_RUN]


def logged_epoch_seconds(train_log):
    """Seconds from each "begin training epoch N" to its "end of epoch N" in a one-start log,
    read here with a pattern of its own (not fairseq_log's)."""
    stamps = {"begin": {}, "end": {}}
    for line in Path(train_log).read_text().splitlines():
        m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| INFO \| .*(begin training epoch|end of epoch) (\d+)", line)
        if m:
            when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            stamps["begin" if m.group(2).startswith("begin") else "end"][int(m.group(3))] = when
    assert sorted(stamps["begin"]) == sorted(stamps["end"]) == [1, 2], stamps
    return sum(stamps["end"][e] - stamps["begin"][e] for e in stamps["end"])


def check_results(tmp_path, test_names):
    results = tmp_path / "results"
    md = (results / "multi30k.md").read_text()
    data = json.loads((results / "multi30k.json").read_text())
    assert [r["family"] for r in data["runs"]] == ["man", "transformer"]  # records, sorted by family
    man, transformer = data["runs"]
    for name in test_names:
        assert f"## {name}" in md
    sections = {part.split("\n", 1)[0]: part for part in md.split("\n## ")}  # heading -> its lines
    rows = [l for name in test_names for l in sections[name].splitlines()
            if l.startswith("| Transformer") or l.startswith("| MAN")]
    assert len(rows) == 2 * len(test_names)  # the test sets' tables; the verdict over seeds is its own section
    assert "not tested (fewer than 2 seeds a side)" in sections[f"The verdict: over seeds (sacreBLEU, {test_names[0]})"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 9 and all(cells) and "–" not in cells, row  # both p-values
    records = {r["family"]: r for r in read_records(results / "multi30k")}
    assert set(records) == {"man", "transformer"}
    for subset, res in man["test_sets"].items():
        bs = man["paired_bootstrap"][subset]
        assert 0.0 <= bs["p_value"] <= 1.0 and "bs:200" in bs["signature"]
        # computed on the records' hypothesis files: the bootstrap's BLEUs are the two runs' sacreBLEU
        assert bs["system_bleu"] == res["sacrebleu"]
        assert bs["baseline_bleu"] == transformer["test_sets"][subset]["sacrebleu"]
        ar = man["paired_randomization"][subset]
        assert 0.0 < ar["p_value"] <= 1.0 and "ar:" in ar["signature"] and ar["system_bleu"] == res["sacrebleu"]
        hyp = (results / "multi30k" / f"man-seed1.{subset}.hyp").read_text().splitlines()
        assert len(hyp) == res["n_sentences"] > 0
        assert res["sacrebleu_signature"].startswith("nrefs:1|case:mixed")
    for r in records.values():
        # train_seconds: the epochs' time in the run's log (second-resolution stamps: 0 possible for a toy epoch)
        train_log = tmp_path / "runs" / f"{r['family']}-seed{r['seed']}" / "train.log"
        assert r["train_seconds"] == round(logged_epoch_seconds(train_log), 1)
        assert r["params"] > 0 and r["train_attempts"] == 1
        assert len(r["valid_curve"]) == r["epochs"] == 2
        assert r["fingerprint"] and r["commit"] and r["threads"] == "1" and "CPU" in r["device"]
        assert r["train_command"][0] == "fairseq-train" and "--seed" in r["train_command"]
    png = results / "multi30k-valid-loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000
    return md, data


# ------------------------------------------------------------------------------ unit tests

def test_configs_share_width_class_and_budget():
    cfgs = {p.stem: load_config(p) for p in FAMILY_CONFIGS}
    assert set(cfgs) == set(reproduce.FAMILIES)
    base = cfgs["transformer"]
    for name, cfg in cfgs.items():
        assert cfg["paper"] == "none" and cfg["dataset"] == "multi30k"
        # same training budget and optimizer for every family; only the criterion of calibration differs
        same = {k: v for k, v in cfg["train"].items() if k != "criterion"}
        assert same == {k: v for k, v in base["train"].items() if k != "criterion"}, name
        assert cfg["eval"] == base["eval"]
        assert "small" in cfg["arch"] or cfg["arch"] == "transformer_iwslt_de_en"
    assert cfgs["calibration"]["train"]["criterion"] == "calibrated_label_smoothed_cross_entropy"
    assert cfgs["diffwin"]["model"]["diffwin-preset"] == "enc_aw-cr_aw_seg-dec_mw"
    assert cfgs["localness"]["model"]["localness-window"] == "query"
    assert cfgs["sman2"]["model"]["encoder-sublayers"].startswith("sman2")


@pytest.mark.parametrize("path", FAMILY_CONFIGS, ids=[p.stem for p in FAMILY_CONFIGS])
def test_config_builds_with_fairseq(path, tmp_path):
    """fairseq-train's parser accepts the config and the model builds (toy dictionary, real width)."""
    from fairseq import options, tasks

    from man_recipes.training import launch

    cfg = load_config(path)
    for lang in ("de", "en"):
        (tmp_path / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(20)))
    argv = launch.train_args(cfg, tmp_path / "ckpt", device="cpu", precision="fp32", data=tmp_path)
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    assert args.arch == cfg["arch"] and args.encoder_embed_dim == 512 and args.encoder_layers == 6
    assert args.max_epoch == 40 and args.dropout == 0.3
    model = tasks.setup_task(args).build_model(args)
    assert sum(p.numel() for p in model.parameters()) > 1_000_000


def test_paper_none_configs_need_no_table_and_stay_out_of_paper_tables():
    cfg = load_config(FAMILY_CONFIGS[0])
    assert "table" not in cfg and "row" not in cfg
    names = {c["name"] for c in all_configs()}
    assert not any(n.startswith("multi30k-") for n in names)
    assert {c["name"] for c in all_configs(include_no_paper=True)} >= {"multi30k-man", "multi30k-transformer"}
    bad = dict(cfg, paper="nonsense", table="1", row="x")
    with pytest.raises(ConfigError, match="paper must be one of"):
        validate(bad)
    row = dict(cfg, paper="man")  # a paper row still needs its table and row
    with pytest.raises(ConfigError, match="missing key 'table'"):
        validate(row)


def test_paired_bootstrap_separates_better_from_equally_good_systems():
    rng = random.Random(0)
    words = "a the dog cat man runs sits in on park beach red big small".split()
    refs = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(100)]

    def noisy(p, seed):  # each reference word replaced with probability p
        r = random.Random(seed)
        return [" ".join(w if r.random() > p else r.choice(words) for w in s.split()) for s in refs]

    equally_good = bleu_table.paired_bootstrap(noisy(0.3, 1), noisy(0.3, 2), refs, n_samples=200)
    assert equally_good["p_value"] > 0.05
    better = bleu_table.paired_bootstrap(noisy(0.6, 3), noisy(0.3, 1), refs, n_samples=200)
    assert better["p_value"] < 0.01 and better["system_bleu"] > better["baseline_bleu"] + 20
    assert better["signature"].startswith("nrefs:1|bs:200|seed:12345")
    assert bleu_table.paired_bootstrap(noisy(0.6, 3), noisy(0.3, 1), refs, n_samples=200) == better  # seeded


def test_mean_std_and_log_parsing(tmp_path):
    assert bleu_table.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert bleu_table.mean_std([5.0]) == (5.0, None)
    log = tmp_path / "train.log"
    log.write_text(
        "INFO | fairseq_cli.train | num. model params: 1,234,567 (num. trained: 1,234,567)\n"
        "INFO | train_inner | epoch 001:     10 / 118 loss=9.1, num_updates=10, lr=1e-05, train_wall=19, wall=20.0\n"
        "INFO | train_inner | epoch 001:     30 / 118 loss=8.1, num_updates=30, lr=3e-05, train_wall=38, wall=60.0\n"
        "INFO | valid | epoch 001 | valid on 'valid' subset | loss 7.5 | nll_loss 6.9 | ppl 119 | wps 1 | num_updates 118\n"
        "INFO | train | epoch 001 | loss 8.5 | nll_loss 8.1 | ppl 274 | wps 9 | num_updates 118 | lr 1e-4\n"
        "INFO | valid | epoch 002 | valid on 'valid' subset | loss 6.25 | nll_loss 5.9 | ppl 59 | wps 1 | num_updates 236\n"
        "INFO | train | epoch 002 | loss 7.0 | nll_loss 6.5 | ppl 90 | wps 9 | num_updates 236 | lr 1e-4\n"
        # resumed from epoch 1's checkpoint: epoch 2 again, the later line wins
        "INFO | train | epoch 002 | loss 6.75 | nll_loss 6.2 | ppl 74 | wps 9 | num_updates 236 | lr 1e-4\n")
    assert fairseq_log.model_params(log) == 1234567
    assert fairseq_log.valid_curve(log) == [(118, 7.5), (236, 6.25)]
    assert fairseq_log.train_curve(log) == [(118, 8.5), (236, 6.75)]
    assert fairseq_log.train_curve(log, "mask_mean") == []
    calibrated = tmp_path / "calibrated.log"
    calibrated.write_text(
        "INFO | train | epoch 001 | loss 11.203 | nll_loss 10.868 | perturbed_loss 11.204 | mask_penalty 0.247 "
        "| mask_mean 0.956 | ppl 1869.37 | num_updates 246 | lr 0.0016\n"
        "INFO | train | epoch 002 | loss 9.886 | nll_loss 9.356 | perturbed_loss 9.887 | mask_penalty 0.002 "
        "| mask_mean 1 | ppl 655.21 | num_updates 492 | lr 0.0015\n")
    assert fairseq_log.train_curve(calibrated) == [(246, 11.203), (492, 9.886)]
    assert fairseq_log.train_curve(calibrated, "mask_mean") == [(246, 0.956), (492, 1.0)]
    assert fairseq_log.seconds_per_update(log) == (2.0, 118)


def test_train_seconds_count_each_finished_epoch_once_across_kills(tmp_path):
    # attempt 1 finishes epoch 1 and is killed in epoch 2; attempt 2 resumes and redoes epoch 2
    start = "{} | INFO | fairseq_cli.train | {{'_name': None, 'common': {{}}}}\n"
    begin = "{} | INFO | fairseq.trainer | begin training epoch {}\n"
    end = "{} | INFO | fairseq_cli.train | end of epoch {} (average epoch stats below)\n"
    log = tmp_path / "train.log"
    log.write_text(start.format("2026-11-24 23:00:00") + begin.format("2026-11-24 23:00:01", 1)
                   + end.format("2026-11-24 23:05:01", 1) + begin.format("2026-11-24 23:05:01", 2)
                   + "2026-11-24 23:07:00 | INFO | train_inner | epoch 002:     50 / 127 loss=4.1\n"
                   + start.format("2026-11-25 03:00:00") + begin.format("2026-11-25 03:00:02", 2)
                   + end.format("2026-11-25 03:06:02", 2) + "2026-11-25 03:06:02 | INFO | fairseq_cli.train | "
                   "done training in 362.0 seconds\n")
    # 300 s (epoch 1) + 360 s (epoch 2, second try); neither the lost 2 minutes nor the 4-hour gap
    assert fairseq_log.epoch_seconds(log) == (660.0, 2)
    assert fairseq_log.epoch_seconds(tmp_path / "missing.log") == (0, 0)


def test_train_seconds_keep_what_a_killed_start_saved_mid_epoch(tmp_path):
    # --save-interval-updates: attempt 1 saves twice in epoch 1 and is killed 10 minutes after the
    # second save; attempt 2 resumes from that save, ends epoch 1, saves once in epoch 2, is killed;
    # attempt 3 resumes there and finishes
    start = "{} | INFO | fairseq_cli.train | {{'_name': None, 'common': {{}}}}\n"
    begin = "{} | INFO | fairseq.trainer | begin training epoch {}\n"
    saved = "{} | INFO | fairseq.checkpoint_utils | Saved checkpoint ckpt/checkpoint_1_{}.pt (epoch 1 @ {} updates)\n"
    end = "{} | INFO | fairseq_cli.train | end of epoch {} (average epoch stats below)\n"
    log = tmp_path / "train.log"
    log.write_text(start.format("2026-11-27 05:00:00") + begin.format("2026-11-27 05:00:10", 1)
                   + saved.format("2026-11-27 05:30:10", 250, 250) + saved.format("2026-11-27 06:00:10", 500, 500)
                   + "2026-11-27 06:10:10 | INFO | train_inner | epoch 001:    600 / 900 loss=9.1\n"
                   + start.format("2026-11-27 09:00:00") + begin.format("2026-11-27 09:00:05", 1)
                   + saved.format("2026-11-27 09:40:05", 900, 900) + end.format("2026-11-27 09:40:05", 1)
                   + begin.format("2026-11-27 09:40:06", 2) + saved.format("2026-11-27 09:50:06", 1000, 1000)
                   + start.format("2026-11-27 12:00:00") + begin.format("2026-11-27 12:00:02", 2)
                   + saved.format("2026-11-27 12:50:02", 1800, 1800) + end.format("2026-11-27 12:50:02", 2))
    # epoch 1: 60 min kept of attempt 1 (not its last 10) + 40 min; epoch 2: 10 min + 50 min
    assert fairseq_log.epoch_seconds(log) == (160 * 60.0, 3)


def test_prepare_rejects_nonstandard_sizes_and_missing_files(tmp_path):
    folder = synthetic_release(tmp_path / "raw")
    proc = run([REPO / "data-prep" / "prepare-multi30k.sh", "--from", folder, "--work", tmp_path / "w",
                "--dest", tmp_path / "d"], check=False)
    assert proc.returncode == 2 and "standard Multi30k split has 29,000" in proc.stdout
    assert "--allow-nonstandard-splits" in proc.stdout
    (folder / "val.en").unlink()
    proc = run([REPO / "data-prep" / "prepare-multi30k.sh", "--from", folder, "--work", tmp_path / "w2",
                "--dest", tmp_path / "d2", "--allow-nonstandard-splits"], check=False)
    assert proc.returncode == 2 and "no val.en or val.en.gz" in proc.stdout



@pytest.mark.parametrize("case", ["empty train", "--workers 0", "--bpe-merges 0"])
def test_prepare_refuses_what_would_end_in_a_traceback_or_another_tools_words(tmp_path, case):
    # empty training text: subword-nmt's "ValueError: max() arg is an empty sequence"; --workers 0:
    # a ZeroDivisionError; --bpe-merges 0: subword-nmt's "The line should exist of exactly two
    # subword units" while reading the codes it had written
    folder = synthetic_release(tmp_path / "raw")
    extra = {"--workers 0": ["--workers", "0"], "--bpe-merges 0": ["--bpe-merges", "0"]}.get(case, [])
    if case == "empty train":
        for name in ("train.de.gz", "train.en.gz"):
            with gzip.open(folder / name, "wt"):
                pass
    proc = run([REPO / "data-prep" / "prepare-multi30k.sh", "--from", folder, "--work", tmp_path / "w",
                "--dest", tmp_path / "d", "--allow-nonstandard-splits", *extra], check=False)
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert last == {
        "empty train": f"ERROR: train: {folder / 'train.de.gz'} and {folder / 'train.en.gz'} hold no lines; nothing to prepare",
        "--workers 0": "data-prep/prepare-multi30k.sh: error: argument --workers: invalid value '0': must be >= 1 and "
                       f"<= {cpu_cores()} (the {cpu_cores()} CPU core(s) this process may use)",
        "--bpe-merges 0": "data-prep/prepare-multi30k.sh: error: argument --bpe-merges: invalid value '0': must be >= 1",
    }[case]
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("option", ["--bootstrap-samples", "--avg-last", "--batch-size"])
def test_reproduce_refuses_a_count_below_one_when_reading_its_arguments(tmp_path, option, capsys):
    # --time-updates 0 was taken as "not given": the full trainings started instead of a timing
    with pytest.raises(SystemExit) as e:
        reproduce.main(["multi30k-cpu", "--data", str(tmp_path / "nothing"), "--results-dir", str(tmp_path / "r"),
                        f"{option}=0"])
    assert e.value.code == 2
    ceiling = {"--bootstrap-samples": " and <= 10000 (10 x the field's 1000 resamples)",
               "--batch-size": " and <= 1000000 (sentences per batch: more than any test set holds)"}.get(option, "")
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"scripts/reproduce.sh: error: argument {option}: invalid value '0': must be >= 1{ceiling}")
    assert not (tmp_path / "r").exists()


def test_reproduce_refuses_families_that_name_none(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        reproduce.main(["multi30k-cpu", "--data", str(tmp_path / "nothing"), "--families", " , "])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        f"scripts/reproduce.sh: error: --families ' , ' names no family; choose from "
        f"{reproduce.FAMILIES + ['man-calibration']}")


@pytest.mark.parametrize("option", ["--runs-dir", "--results-dir"])
def test_reproduce_refuses_a_file_as_its_folders(tmp_path, option, capsys):
    # --runs-dir a file: a FileExistsError traceback once the first training was to start
    mine = tmp_path / "mine"
    mine.write_text("my notes\n")
    with pytest.raises(SystemExit) as e:
        reproduce.main(["multi30k-cpu", "--data", str(tmp_path / "nothing"), option, str(mine)])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"scripts/reproduce.sh: error: {option} {mine}: is a file, not a folder"
    assert mine.read_text() == "my notes\n"


def test_reproduce_without_data_is_a_clear_error(tmp_path):
    proc = run([sys.executable, "-m", "man_recipes.studies.reproduce", "multi30k", "--device", "cpu",
                "--data", tmp_path / "nothing"], check=False)
    assert proc.returncode == 2 and "prepare-multi30k.sh" in proc.stdout


# --------------------------------------------------------------------------- end to end

def test_pipeline_on_synthetic_release_layout(tmp_path):
    folder = synthetic_release(tmp_path / "raw")
    data, out = prepare(folder, tmp_path)
    manifest = json.loads((data / "multi30k.json").read_text())
    assert manifest["counts"] == {"train": 300, "valid": 30, "test": 25, "test_2017_flickr": 20}
    assert manifest["test_sets"] == {"test": "test_2016_flickr", "test_2017_flickr": "test_2017_flickr"}
    assert manifest["nonstandard"] is True
    for name in ("train.de-en.de.bin", "test.de-en.en.idx", "test_2017_flickr.de-en.en.bin", "test.raw.en",
                 "test_2017_flickr.raw.de", "code"):
        assert (data / name).is_file(), name
    assert (data / "test.raw.en").read_text().splitlines()[0].endswith(".")  # untokenized reference
    again = run([REPO / "data-prep" / "prepare-multi30k.sh", "--from", folder, "--work", tmp_path / "work",
                 "--dest", data, "--bpe-merges", "300", "--allow-nonstandard-splits"]).stdout
    assert "skip  tokenize" in again and "skip  binarize" in again  # idempotent

    out = run(reproduce_cmd(data, tmp_path)).stdout
    md, _ = check_results(tmp_path, ["test_2016_flickr", "test_2017_flickr"])
    assert "Multi30k De→En" in out
    rerun = run(reproduce_cmd(data, tmp_path)).stdout  # runs whose record matches are skipped
    assert "skip  transformer-seed1 (its record matches" in rerun and "skip  man-seed1" in rerun
    assert "+ fairseq-train" not in rerun and "+ fairseq-generate" not in rerun

    # a record of another config is stale: out of the table, and it does not stop a retrain
    man_record = tmp_path / "results" / "multi30k" / "man-seed1.json"
    record = json.loads(man_record.read_text())
    man_record.write_text(json.dumps(dict(record, fingerprint="0" * 16)))
    table = run(reproduce_cmd(data, tmp_path, "--table-only")).stdout
    assert "stale record man-seed1" in table and "| MAN" not in table and "| man-seed1 | `0000000000000000`" in table
    # ... and its run folder (trained under the old fingerprint) is refused, not resumed or served again
    (tmp_path / "runs" / "man-seed1" / ".fingerprint").write_text("1" * 16 + "\n")
    refused = run(reproduce_cmd(data, tmp_path), check=False)
    assert refused.returncode == 2 and "pass --force" in refused.stdout and "+ fairseq-train" not in refused.stdout
    # --force really retrains: a fresh fairseq-train from update 0, a new record
    forced = run(reproduce_cmd(data, tmp_path, "--force")).stdout
    assert "force: removing" in forced and "+ fairseq-train" in forced
    assert "No existing checkpoint found" in forced and "Loaded checkpoint" not in forced  # fairseq's words
    assert json.loads(man_record.read_text())["fingerprint"] == record["fingerprint"]
    check_results(tmp_path, ["test_2016_flickr", "test_2017_flickr"])
    # a run another reproduce holds is left to it, even with --force: nothing trained, nothing removed
    with open(tmp_path / "runs" / ".man-seed1.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        busy = run(reproduce_cmd(data, tmp_path, "--force")).stdout
    assert "skip  man-seed1: another scripts/reproduce.sh is running it now" in busy
    assert "+ fairseq-train" not in busy and "force: removing" not in busy
    assert (tmp_path / "runs" / "man-seed1" / ".train.done").is_file()


def test_timing_never_removes_a_folder_it_did_not_make(tmp_path):
    from types import SimpleNamespace

    foreign = tmp_path / "runs" / "timing-cpu-transformer"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    args = SimpleNamespace(runs_dir=str(tmp_path / "runs"), device="cpu", time_updates=2, data=str(tmp_path),
                           precision="fp32", fairseq_args=[])
    with pytest.raises(reproduce.ReproduceError, match="not a timing run of ours"):
        reproduce.time_families(["transformer"], {"transformer": {"_path": "unused.yaml"}}, args)
    assert (foreign / "notes.txt").read_text() == "mine"
