"""``scripts/speed.sh [study]`` (lab/speed/study.py, records.py): each family against the Transformer on a
study's real batches. The numbers and tables from hand-made records, the interleaving, the refusals,
docs/speed.md's table against the committed records, and one real short measurement of a tiny model on
toy data (nothing timed is asserted)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TINY_MODEL
from lab.speed import records as speed_table, study as speed
from man_recipes.studies.experiments import FAMILY_LABELS
from man_recipes.training.fairseq_log import LogError, train_intervals
from man_recipes import options


def run_of(repeat, family, wps, memory, per_s, wpb=(100.0, 100.0, 100.0), tokens=50):
    return {"repeat": repeat, "family": family, "loadavg": [0.1, 0.1, 0.1],
            "train": {"wps": list(wps), "wpb": list(wpb), "num_updates": [2, 4, 6], "peak_rss_mib": memory},
            "decode": {"sentences": 10, "tokens": tokens, "sentences_per_s": per_s}}


def record(runs, threads=1, families=("transformer", "man"), trained=True, experiment="gigaword-cpu"):
    return {"kind": speed_table.RECORD_KIND, "version": 1, "experiment": experiment, "threads": threads,
            "command": f"scripts/speed.sh {experiment}", "commit": "abc1234", "cpu": "Test CPU", "cpu_count": 2,
            "date": "2026-11-25T10:00:00+00:00", "loadavg_before": [0.05, 0, 0], "loadavg_after": [0.5, 0, 0],
            "families": list(families),
            "settings": {"repeats": 2, "updates": 6, "log_interval": 2, "warmup_intervals": 1, "seed": 1,
                         "test_set": "test", "decode_sentences": 10, "batch_size": 128},
            "checkpoints": {f: {"trained": trained} for f in families}, "runs": runs}


def two_repeats():
    """Repeat 2 runs everything 20 % slower (a load drift): the ratios stay those of repeat 1."""
    return record([run_of(1, "transformer", [5, 1000, 1200], 500, 10.0), run_of(1, "man", [1, 800, 900], 600, 8.0),
                   run_of(2, "transformer", [5, 800, 960], 500, 8.0), run_of(2, "man", [1, 560, 640], 550, 7.2)])


def test_numbers_and_ratios_come_from_each_repeat():
    transformer, man = speed_table.summarize(two_repeats())
    # words/s of a run: the median of its intervals after the warm-up one
    assert transformer["train"] == {"median": 990.0, "min": 880.0, "max": 1100.0, "n": 2}
    assert transformer["train_ratio"] is None and man["family"] == "man"
    # man/transformer in repeat 1: 850/1100, in repeat 2: 600/880; never 725/990 across repeats
    assert man["train_ratio"]["min"] == pytest.approx(600 / 880) and man["train_ratio"]["max"] == pytest.approx(850 / 1100)
    assert man["train_ratio"]["median"] == pytest.approx((600 / 880 + 850 / 1100) / 2)
    assert man["memory"] == {"median": 575.0, "min": 550, "max": 600, "n": 2}
    assert man["memory_ratio"]["min"] == pytest.approx(1.1) and man["memory_ratio"]["max"] == pytest.approx(1.2)
    assert man["decode_ratio"]["min"] == pytest.approx(0.8) and man["decode_ratio"]["max"] == pytest.approx(0.9)
    assert man["out_len"]["median"] == 5.0 and man["same_batches"] and man["trained"]
    md = speed_table.to_markdown("gigaword-cpu", [two_repeats()], FAMILY_LABELS)
    assert ("| 1 | MAN (small, DMAN enc.) | 725 (600–850) | 0.73× (0.68–0.77) | 575 MiB (550–600) | 1.15× (1.10–1.20) "
            "| 7.6 (7.2–8.0) | 0.85× (0.80–0.90) |") in md
    assert "| 1 | Transformer (small) | 990 (880–1,100) | 1 | 500 MiB (500–500) | 1 |" in md
    assert "untrained" not in md and "‡" not in md and "`scripts/speed.sh gigaword-cpu` — commit abc1234" in md


def test_a_familys_floor_is_compared_repeat_by_repeat(tmp_path):
    """MAN and SMAN2 against MAN without its bias (their floor, issue 80) in each repeat; localness's floor is the
    Transformer (the main table's ratio): no floor row of its own; without man-nobias in the record no floor table."""
    runs = [run_of(1, "transformer", [5, 1000, 1200], 500, 10.0), run_of(1, "man", [1, 800, 900], 600, 8.0),
            run_of(1, "man-nobias", [1, 900, 1000], 550, 9.0), run_of(1, "sman2", [1, 1000, 1100], 520, 9.5),
            run_of(2, "transformer", [5, 800, 960], 500, 8.0), run_of(2, "man", [1, 560, 640], 550, 7.2),
            run_of(2, "man-nobias", [1, 800, 800], 500, 7.5), run_of(2, "sman2", [1, 700, 900], 510, 7.0)]
    rec = record(runs, families=("transformer", "man", "man-nobias", "sman2"))
    man = speed_table.summarize(rec)[1]
    assert man["floor"] == "man-nobias"
    assert man["train_floor_ratio"]["max"] == pytest.approx(850 / 950)
    assert man["train_floor_ratio"]["min"] == pytest.approx(600 / 800)
    assert man["memory_floor_ratio"]["median"] == pytest.approx((600 / 550 + 550 / 500) / 2)
    assert [row["family"] for row in speed_table.summarize(rec) if "floor" in row] == ["man", "sman2"]
    sman2 = speed_table.summarize(rec)[3]
    assert sman2["train_floor_ratio"]["median"] == pytest.approx((1050 / 950 + 800 / 800) / 2)
    md = speed_table.to_markdown("gigaword-cpu", [rec], FAMILY_LABELS)
    assert speed_table.FLOOR_NOTE in md
    assert "| 1 | MAN (small, DMAN enc.) | MAN, its first sublayer a plain self-attention (floor) | 0.82× (0.75–0.89) | 1.10× (1.09–1.10) |" in md
    (tmp_path / "gigaword-cpu-threads1.json").write_text(json.dumps(rec))
    block = speed_table.page_block(tmp_path, FAMILY_LABELS)
    assert "| gigaword-cpu | 1 | MAN (small, DMAN enc.) | MAN, its first sublayer a plain self-attention (floor) | 0.82× (0.75–0.89) |" in block
    assert speed_table.FLOOR_NOTE not in speed_table.to_markdown("gigaword-cpu", [two_repeats()], FAMILY_LABELS)


def test_an_untrained_model_and_other_batches_are_marked():
    one = record([run_of(1, "transformer", [5, 1000], 500, 10.0), run_of(1, "man", [1, 800], 600, 8.0, wpb=[90, 100])],
                 trained=False)
    man = speed_table.summarize(one)[1]
    assert not man["same_batches"] and not man["trained"] and man["train_ratio"]["n"] == 1
    md = speed_table.to_markdown("gigaword-cpu", [one], FAMILY_LABELS)
    assert "| 1 | MAN (small, DMAN enc.) | 800 | 0.80× ‡ | 600 MiB | 1.20× | 8.0 | 0.80× † |" in md
    assert "† decoded an **untrained** model" in md and "‡ its batches differed" in md


def test_a_trained_model_is_never_compared_with_an_untrained_ones_decoding():
    mixed = record([run_of(1, "transformer", [5, 1000], 500, 20.0, tokens=8),
                    run_of(1, "man", [1, 800], 600, 5.0, tokens=31)])
    mixed["checkpoints"]["man"]["trained"] = False
    man = speed_table.summarize(mixed)[1]
    assert not man["decode_comparable"] and man["decode_ratio"] is None and man["train_ratio"] is not None
    md = speed_table.to_markdown("gigaword-cpu", [mixed], FAMILY_LABELS)
    assert "| 1 | MAN (small, DMAN enc.) | 800 | 0.80× | 600 MiB | 1.20× | 5.0 | — § |" in md
    assert "§ one of this family's and the Transformer's decoded models was trained" in md and "†" not in md
    assert "(the study's trained seed-1 checkpoints of transformer)" in md


def test_readme_block_lists_every_record_and_is_replaced_in_place(tmp_path):
    records = tmp_path / "speed"
    records.mkdir()
    (records / "gigaword-cpu-threads2.json").write_text(json.dumps(dict(two_repeats(), threads=2)))
    (records / "gigaword-cpu-threads1.json").write_text(json.dumps(two_repeats()))
    (records / "cnndm-cpu-threads1.json").write_text(json.dumps(dict(two_repeats(), experiment="cnndm-cpu")))
    block = speed_table.page_block(records, FAMILY_LABELS)
    rows = [line for line in block.splitlines() if line.startswith("| ") and "MAN" in line]
    assert [r.split(" | ")[:2] for r in rows] == [["| cnndm-cpu", "1"], ["| gigaword-cpu", "1"], ["| gigaword-cpu", "2"]]
    text = f"intro\n{speed_table.BLOCK_BEGIN}\nold table\n{speed_table.BLOCK_END}\nafter\n"
    new = speed_table.replace_page_block(text, block)
    assert new == f"intro\n{block}\nafter\n" and speed_table.page_section(new) == block
    with pytest.raises(speed_table.SpeedRecordError, match="docs/speed.md: no speed-table block"):
        speed_table.replace_page_block("no markers\n", block)


def test_readme_speed_table_is_what_the_committed_records_give():
    readme = (REPO / speed_table.PAGE).read_text(encoding="utf-8")
    assert speed_table.page_section(readme) == speed_table.page_block(REPO / "results" / "speed", FAMILY_LABELS), (
        "docs/speed.md's real-batch speed table differs from results/speed/: run "
        "scripts/speed.sh EXPERIMENT --table-only --update-docs")
    speed_section = readme[readme.index("# Speed"):readme.index("**Synthetic batches**")]
    assert speed_table.BLOCK_BEGIN in speed_section  # the real-batch table comes first, the synthetic one after


def test_train_intervals_reads_fairseq_progress_lines(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026-11-25 10:00:01 | INFO | train_inner | epoch 001:      2 / 7 loss=9.1, nll_loss=9, ppl=512, wps=1234.5, "
        "ups=0.5, wpb=2469, bsz=80, num_updates=2, lr=1e-05, gnorm=3.1, train_wall=4, wall=9\n"
        "2026-11-25 10:00:05 | INFO | train | epoch 001 | loss 9 | wps 1100 | wpb 2400 | num_updates 7\n"
        "2026-11-25 10:00:09 | INFO | train_inner | epoch 002:      1 / 7 loss=8.9, nll_loss=8.8, ppl=450, wps=1300, "
        "ups=0.52, wpb=2500.5, bsz=81, num_updates=8, lr=2e-05, gnorm=2.9, train_wall=4, wall=17\n")
    assert train_intervals(log) == [{"num_updates": 2, "wps": 1234.5, "wpb": 2469.0},
                                    {"num_updates": 8, "wps": 1300.0, "wpb": 2500.5}]
    log.write_text("2026-11-25 10:00:01 | INFO | train_inner | epoch 001:  2 / 7 loss=9.1, num_updates=2, wall=9\n")
    with pytest.raises(LogError, match="without num_updates, wps and wpb"):
        train_intervals(log)


def test_every_repeat_runs_every_family_the_transformer_first(monkeypatch, tmp_path):
    calls = []

    def train(cfg, args, setting, work, tag):
        calls.append(("train", setting["threads"], tag))
        return {"wps": [1.0, 2.0], "wpb": [1.0, 1.0], "peak_rss_mib": 1.0}

    def decode(cfg, data, subset, checkpoint, n, args, setting, work, tag):
        calls.append(("decode", setting["threads"], tag))
        return {"sentences_per_s": 1.0}

    monkeypatch.setattr(speed, "measure_training", train)
    monkeypatch.setattr(speed, "measure_decoding", decode)
    monkeypatch.setattr(speed, "log", lambda msg: None)
    args = speed.parser().parse_args(["gigaword-cpu", "--repeats", "2"])
    args.fairseq_args, args.command, args.data = [], "scripts/speed.sh gigaword-cpu", tmp_path
    cfgs = {f: {"_path": str(REPO / "configs" / f"{f}.yaml")} for f in ("transformer", "localness")}
    ckpts = {f: {"path": "x.pt", "trained": True} for f in cfgs}
    rec = speed.measure("gigaword-cpu", ["transformer", "localness"], cfgs, args, dict(speed.CPU_FP32, threads=2),
                        ("test", tmp_path, [0, 1]), ckpts, tmp_path)
    assert [(r["repeat"], r["family"]) for r in rec["runs"]] == [
        (1, "transformer"), (1, "localness"), (2, "transformer"), (2, "localness")]
    assert calls[:4] == [("train", 2, "threads2-repeat1-transformer"), ("decode", 2, "threads2-repeat1-transformer"),
                         ("train", 2, "threads2-repeat1-localness"), ("decode", 2, "threads2-repeat1-localness")]
    assert rec["threads"] == 2 and rec["settings"]["decode_sentences"] == 2 and len(rec["loadavg_after"]) == 3
    assert speed.thread_env(2)["OMP_NUM_THREADS"] == "2" == speed.thread_env(2)["MKL_NUM_THREADS"]


def test_the_studys_trained_checkpoint_is_decoded(tmp_path):
    args = speed.parser().parse_args(["gigaword-cpu"])
    args.runs_dir, args.fairseq_args = tmp_path / "runs", []
    ckpt = args.runs_dir / "transformer-seed1" / "checkpoints" / "checkpoint_last.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"weights")
    found = speed.checkpoints(["transformer"], {}, args, tmp_path / "work", 1)
    assert found["transformer"]["path"] == str(ckpt) and found["transformer"]["trained"]
    assert found["transformer"]["bytes"] == 7 and not found["transformer"]["finished"]
    assert not (tmp_path / "work").exists()  # nothing trained
    args.checkpoint_seed = 2  # another seed's run is another folder
    seed2 = args.runs_dir / "transformer-seed2" / "checkpoints" / "checkpoint_last.pt"
    seed2.parent.mkdir(parents=True)
    seed2.write_bytes(b"other weights")
    found = speed.checkpoints(["transformer"], {}, args, tmp_path / "work", 1)
    assert found["transformer"]["path"] == str(seed2) and found["transformer"]["seed"] == 2


@pytest.mark.parametrize("argv, message", [
    (["--families", "man,sman3"], "unknown families ['sman3'] for gigaword-cpu; choose from ['transformer', 'man', "
                                  "'sman2', 'localness', 'diffwin', 'calibration', 'calibration-alpha0.01', 'man-zeros', 'man-nobias']"),
    (["--families", " , "], "--families ' , ' names no family; choose from ['transformer', 'man', 'sman2', "
                            "'localness', 'diffwin', 'calibration', 'calibration-alpha0.01', 'man-zeros', 'man-nobias']"),
    (["--threads", "0"], "argument --threads: invalid value '0': distinct thread counts, each >= 1"),
    (["--threads", "1,1"], "argument --threads: invalid value '1,1': distinct thread counts, each >= 1"),
    (["--threads", "one"], "argument --threads: invalid value 'one': a comma-separated list of thread counts"),
    # an empty item is a typo, refused as reproduce's --seeds 1,,2 is (was read as 1,2)
    (["--threads", "1,,2"], "argument --threads: invalid value '1,,2': an empty item in '1,,2' (a comma too many?)"),
    (["--threads", "1,100000"], "argument --threads: invalid value '1,100000': each <= 2 "
                                "(the 2 CPU core(s) this process may use)"),
    (["--repeats", "0"], "argument --repeats: invalid value '0': must be >= 1 and <= 100 (20 x a measurement's usual "
                         "5 repeats)"),
    (["--decode-sentences", "0"], "argument --decode-sentences: invalid value '0': must be >= 1 and <= 1000000 (more "
                                  "than any test set holds)"),
    (["--updates", "15"], "--updates 15 with --log-interval 10: need at least 20 updates (the first interval is warm-up)"),
])
def test_bad_input_is_one_argparse_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(options, "cpu_cores", lambda: 2, raising=False)
    with pytest.raises(SystemExit) as e:
        speed.main(["gigaword-cpu", "--data", str(tmp_path / "nothing"), "--results-dir", str(tmp_path / "r"), *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"scripts/speed.sh: error: {message}"
    assert not (tmp_path / "r").exists()


def test_a_record_is_replaced_only_with_force_and_never_another_file(tmp_path, capsys):
    records = tmp_path / "r" / "speed"
    records.mkdir(parents=True)
    (records / "gigaword-cpu-threads1.json").write_text(json.dumps(two_repeats()))
    (records / "gigaword-cpu-threads2.json").write_text('{"my": "notes"}\n')
    argv = ["gigaword-cpu", "--data", str(tmp_path / "nothing"), "--results-dir", str(tmp_path / "r")]
    assert speed.main(argv + ["--threads", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ERROR: {records / 'gigaword-cpu-threads1.json'} exists (measured 2026-11-25T10:00:00+00:00 on Test CPU); "
        "pass --force to replace it")
    assert speed.main(argv + ["--threads", "2", "--force"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ERROR: {records / 'gigaword-cpu-threads2.json'}: not a speed record of scripts/speed.sh "
        "(no kind 'man-fairseq real-batch speed'); not replaced")
    assert (records / "gigaword-cpu-threads2.json").read_text() == '{"my": "notes"}\n'
    # with --force and a record of ours, the work goes on as far as the missing data
    assert speed.main(argv + ["--threads", "1", "--force"]) == 2
    err = capsys.readouterr().err
    assert "no gigaword.json; prepare the data first: data-prep/prepare-gigaword.sh" in err
    assert err.count("--dest") == 1
    assert json.loads((records / "gigaword-cpu-threads1.json").read_text()) == two_repeats()


def test_update_readme_rebuilds_only_its_block(tmp_path, monkeypatch):
    records = tmp_path / "results" / "speed"
    records.mkdir(parents=True)
    (records / "gigaword-cpu-threads1.json").write_text(json.dumps(two_repeats()))
    readme = tmp_path / speed_table.PAGE
    readme.parent.mkdir()
    readme.write_text(f"# Title\n\n{speed_table.BLOCK_BEGIN}\nold\n{speed_table.BLOCK_END}\n\nthe rest\n")
    monkeypatch.setattr(speed, "REPO", tmp_path)
    md = speed.write_table(speed.experiment_study("gigaword-cpu"), records, update_docs=True)
    block = speed_table.page_block(records, FAMILY_LABELS)
    assert readme.read_text() == f"# Title\n\n{block}\n\nthe rest\n" and "| gigaword-cpu | 1 | MAN" in block
    assert md == records / "gigaword-cpu.md" and "| 1 | MAN (small, DMAN enc.) |" in md.read_text()


def test_update_docs_keeps_its_old_spelling():
    assert speed.parser().parse_args(["gigaword-cpu", "--update-readme"]).update_docs
    assert speed.parser().parse_args(["gigaword-cpu", "--update-docs"]).update_docs
    assert not speed.parser().parse_args(["gigaword-cpu"]).update_docs


def test_a_file_as_results_dir_is_refused(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.write_text("my notes\n")
    with pytest.raises(SystemExit) as e:
        speed.main(["gigaword-cpu", "--results-dir", str(mine)])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"scripts/speed.sh: error: --results-dir: {mine} is a file, not a folder"
    assert mine.read_text() == "my notes\n"


def test_table_only_without_records_is_a_clear_error(tmp_path, capsys):
    assert speed.main(["cnndm-cpu", "--table-only", "--results-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ERROR: no speed record of cnndm-cpu in {tmp_path / 'speed'}: measure first (scripts/speed.sh cnndm-cpu)")


def test_a_real_short_measurement_end_to_end(gigaword_like_bin, tmp_path):
    results, temp = tmp_path / "results", tmp_path / "tmp"
    temp.mkdir()
    cmd = [sys.executable, "-m", "lab.speed.study", "gigaword-cpu", "--families", "man",
           "--threads", "1", "--repeats", "1", "--updates", "4", "--log-interval", "2", "--decode-sentences", "6",
           "--data", gigaword_like_bin, "--runs-dir", tmp_path / "runs", "--results-dir", results, "--",
           *TINY_MODEL, "--max-tokens", "500"]
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    proc = subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:]
    rec = speed_table.read_record(results / "speed" / "gigaword-cpu-threads1.json")
    assert rec["families"] == ["transformer", "man"] and rec["threads"] == 1 and rec["cpu_count"] == os.cpu_count()
    assert rec["command"].startswith("scripts/speed.sh gigaword-cpu --families man --threads 1")
    assert rec["commit"] and rec["cpu"] and len(rec["loadavg_before"]) == len(rec["loadavg_after"]) == 3
    assert [(r["repeat"], r["family"]) for r in rec["runs"]] == [(1, "transformer"), (1, "man")]
    transformer, man = rec["runs"]
    for r in rec["runs"]:
        train = r["train"]
        assert train["num_updates"] == [2, 4] and len(train["wps"]) == 2 and train["peak_rss_mib"] > 50
        assert "--no-save" in train["command"] and train["command"][train["command"].index("--save-dir") + 1].startswith(str(temp))
        assert train["command"][train["command"].index("--arch") + 1] == {
            "transformer": "transformer_iwslt_de_en", "man": "transformer_man_small"}[r["family"]]
        decode = r["decode"]
        assert decode["sentences"] == 6 and decode["sentences_per_s"] > 0 and decode["tokens"] >= 6
        assert decode["command"][decode["command"].index("--beam") + 1] == "5"  # the config's generation settings
        assert decode["command"][decode["command"].index("--no-repeat-ngram-size") + 1] == "3"
    assert man["train"]["wpb"] == transformer["train"]["wpb"]  # the same batches
    assert all(not c["trained"] for c in rec["checkpoints"].values())
    assert not list(temp.glob("man-fairseq-speed-*"))  # its checkpoints and logs lived there, removed
    md = (results / "speed" / "gigaword-cpu.md").read_text()
    assert md == speed_table.to_markdown("gigaword-cpu", [rec], FAMILY_LABELS,
                                         speed.EXPERIMENTS["gigaword-cpu"]["title"])
    assert "| 1 | MAN (small, DMAN enc.) |" in md and "† decoded an **untrained** model" in md
    again = subprocess.run([str(c) for c in cmd[:cmd.index("--")] + ["--table-only"]], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert again.returncode == 0 and (results / "speed" / "gigaword-cpu.md").read_text() == md


def gpu_record(precision, memory=(800.0, 900.0), decode=False):
    rec = two_repeats()
    rec.update(device="cuda", precision=precision, gpu="NVIDIA H200", threads=1)
    rec["settings"]["skip_decoding"] = not decode
    for run, mib in zip(rec["runs"], memory * 2):
        run["train"]["peak_cuda_mib"] = mib
        if not decode:
            run["decode"] = None
    return rec


def test_gpu_records_sit_beside_the_cpu_ones_with_cuda_memory_and_no_decoding(tmp_path):
    assert speed_table.record_path(tmp_path, "multi30k-cpu", 1, "cuda", "bf16") == tmp_path / "multi30k-cpu-cuda-bf16.json"
    assert speed_table.record_path(tmp_path, "multi30k-cpu", 2) == tmp_path / "multi30k-cpu-threads2.json"
    records = tmp_path / "speed"
    records.mkdir()
    (records / "gigaword-cpu-cuda-fp16.json").write_text(json.dumps(gpu_record("fp16")))
    (records / "gigaword-cpu-cuda-bf16.json").write_text(json.dumps(gpu_record("bf16")))
    (records / "gigaword-cpu-threads1.json").write_text(json.dumps(two_repeats()))
    (records / "gigaword-cpu-calibration-passes.json").write_text('{"kind": "calibration-passes"}')
    recs = speed_table.read_records(records, "gigaword-cpu")
    assert [speed_table.setting_name(r) for r in recs] == ["1", "H200 bf16", "H200 fp16"]
    man = speed_table.summarize(recs[1])[1]
    # the GPU's memory is torch's peak CUDA allocation, not the process's resident set
    assert man["memory"]["median"] == 900.0 and man["memory_ratio"]["median"] == pytest.approx(900 / 800)
    assert man["decode"] is None and man["out_len"] is None and man["trained"]
    md = speed_table.to_markdown("gigaword-cpu", recs, FAMILY_LABELS)
    assert "| threads / GPU | family |" in md
    assert "| H200 bf16 | MAN (small, DMAN enc.) | 725 (600–850) | 0.73× (0.68–0.77) | 900 MiB (900–900) | 1.12× (1.12–1.12) | — | — |" in md
    assert "- H200 bf16: `scripts/speed.sh gigaword-cpu` — commit abc1234, NVIDIA H200, --bf16, 1 thread on Test CPU" in md
    assert "no decoding" in md and "(H200 fp16)" not in md  # no output lengths without decoding
    assert "compare implementations as well as methods" in md
    assert "implementations" not in speed_table.to_markdown("gigaword-cpu", recs[:1], FAMILY_LABELS)
    block = speed_table.page_block(records, FAMILY_LABELS)
    assert "gigaword-cpu H200 fp16: NVIDIA H200, Test CPU, 2026-11-25" in block


@pytest.mark.parametrize("argv, message", [
    (["--device", "cuda", "--threads", "1,2"], "--threads: one thread count on a GPU"),
    (["--precision", "bf16"], "--precision: the CPU measures fp32 only"),
    (["--device", "cuda", "--precision", "bf16,int8"], "argument --precision: invalid value 'bf16,int8'"),
    (["--skip-decoding", "--decode-sentences", "50", "--checkpoint-seed", "2"],
     "--decode-sentences 50, --checkpoint-seed 2: nothing is decoded with --skip-decoding"),
])
def test_gpu_settings_are_checked_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        speed.main(["gigaword-cpu"] + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cuda_without_a_cuda_device_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        speed.main(["gigaword-cpu", "--device", "cuda", "--results-dir", str(tmp_path)])
    assert e.value.code == 2 and "--device cuda: torch sees no CUDA device here" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_gpu_settings_and_commands(tmp_path, monkeypatch):
    monkeypatch.setattr(speed, "gpu_name", lambda: "NVIDIA H200")
    p = speed.parser()
    args = p.parse_args(["gigaword-cpu", "--device", "cuda"])
    assert speed.settings(args, p) == [{"device": "cuda", "precision": "bf16", "threads": 1},
                                       {"device": "cuda", "precision": "fp16", "threads": 1}]
    assert speed.settings(p.parse_args(["gigaword-cpu"]), p) == [dict(speed.CPU_FP32, threads=t) for t in (1, 2)]
    from man_recipes.config import CONFIG_DIR, load_config

    cfg = load_config(CONFIG_DIR / "gigaword-cpu" / "man.yaml")
    cmd = speed.train_command(cfg, tmp_path, tmp_path / "ck", [], {"device": "cuda", "precision": "bf16", "threads": 1})
    assert cmd[:3] == [sys.executable, "-m", "lab.speed.cuda_peak"]
    assert "--bf16" in cmd and "--cpu" not in cmd
    cpu = speed.train_command(cfg, tmp_path, tmp_path / "ck", [])
    assert cpu[0] == "fairseq-train" and "--cpu" in cpu and "--bf16" not in cpu
    text = "x\n" + speed.PEAK_LINE + "1234.5 MiB\n"
    assert speed.cuda_peak_mib(text, "log") == 1234.5
    with pytest.raises(speed.SpeedError, match="no peak CUDA memory line"):
        speed.cuda_peak_mib(speed.PEAK_LINE + "n/a (no CUDA)\n", "log")


def test_cuda_peak_is_fairseq_train_with_its_log_format(gigaword_like_bin, tmp_path):
    """The wrapper is fairseq-train itself, progress lines in the format speed.sh reads, then the peak
    line (n/a without CUDA)."""
    cmd = speed.train_command(speed.load_config(REPO / "configs" / "gigaword-cpu" / "man.yaml"), gigaword_like_bin,
                              tmp_path / "ck", ["--max-update", 4, "--log-interval", 2, "--no-save",
                                                "--disable-validation", "--log-format", "simple", *TINY_MODEL])
    cmd = [sys.executable, "-m", "lab.speed.cuda_peak"] + cmd[1:]
    out = subprocess.run([str(c) for c in cmd], cwd=REPO, capture_output=True, text=True, env=speed.thread_env(1))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (tmp_path / "train.log").write_text(out.stdout)
    assert [r["num_updates"] for r in train_intervals(tmp_path / "train.log")] == [2, 4]
    assert out.stdout.strip().splitlines()[-1] == speed.PEAK_LINE + "n/a (no CUDA)"
