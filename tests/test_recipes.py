"""Recipes: configs parse with fairseq's own parser, launch commands keep the paper's effective
batch, a 2-process CPU (gloo) training run, evaluate.sh end to end, BLEU/ROUGE scoring, tables."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, TINY_MODEL, child_env, run_bounded
from toy_config import toy_config

from man_recipes.training import launch
from man_recipes import scoring
from man_recipes.config import ConfigError, all_configs, load_config, option_args
from man_recipes.evaluation.results_table import build_tables, collect_runs

CONFIGS = all_configs()


def script_env():
    return child_env({"PYTHON": sys.executable, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})


def run_script(args, timeout=400):
    """Run a recipe script; past ``timeout`` it is killed with everything it started (torchrun's
    workers included), so a stuck gloo start-up fails the test instead of blocking CI."""
    proc = run_bounded(args, timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=script_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return proc.stdout


# ------------------------------------------------------------------------------- configs

def test_every_paper_table_has_rows_and_names_are_unique():
    tables = {(c["paper"], str(c["table"])) for c in CONFIGS}
    expected = ({("man", t) for t in "1234"} | {("localness", "4")}
                | {("diffwin", t) for t in "1234"} | {("calibration", "2")})
    assert expected <= tables
    names = [c["name"] for c in CONFIGS]
    assert len(names) == len(set(names))
    for c in CONFIGS:
        assert {"lr", "max-update", "warmup-updates", "max-tokens"} <= set(c["train"]), c["name"]
        metric_keys = {"rouge": {"rouge1", "rouge2", "rougeL"}}.get(c["eval"]["metric"], {"bleu"})
        assert metric_keys <= set(c["paper_results"]), c["name"]
        if c["eval"]["metric"] == "rouge":
            assert c["eval"]["no_repeat_ngram_size"] == 3  # trigram blocking (MAN paper §3.1.2)


def test_headline_paper_numbers_come_from_configs():
    by_name = {c["name"]: c for c in CONFIGS}
    assert by_name["man-t1-iwslt14-man-small"]["paper_results"]["bleu"] == 36.3
    assert {k: by_name["man-t2-cnndm-man"]["paper_results"][k] for k in ("rouge1", "rouge2", "rougeL")} == {
        "rouge1": 40.98, "rouge2": 18.29, "rougeL": 37.88}
    assert by_name["diffwin-t1-enc-aw-cr-aw-seg-dec-mw"]["paper_results"]["bleu"] == 28.25
    text = build_tables(CONFIGS, {})
    assert "| Ours — small | IWSLT14 De-En | 36.30 | – |" in text
    assert "### Attention Calibration for Transformer in NMT — Table 2" in text


def test_config_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"inherit": str(REPO / "configs/_base/iwslt14.yaml"), "name": "x",
                                   "paper": "man", "table": 1, "row": "x", "arch": "a", "trian": {}}))
    with pytest.raises(ConfigError, match="unknown keys.*trian"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config not found"):
        load_config(tmp_path / "missing.yaml")
    # a bare row file name resolves inside configs/
    assert load_config("t1-iwslt14-man-small")["name"] == "man-t1-iwslt14-man-small"


def _registered_archs():
    from fairseq import utils
    from fairseq.models import ARCH_MODEL_REGISTRY

    utils.import_user_module(type("A", (), {"user_dir": launch.USER_DIR})())
    return ARCH_MODEL_REGISTRY


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c["name"] for c in CONFIGS])
def test_config_parses_with_fairseq_train_parser(cfg, tmp_path):
    """The config's argument list is accepted by fairseq-train's own parser, option values included."""
    archs = _registered_archs()
    assert cfg["arch"] in archs, f"{cfg['name']}: arch {cfg['arch']!r} is not registered"
    from fairseq import options

    argv = launch.train_args(cfg, tmp_path / "ckpt", world_size=2, device="gpu", precision="fp16",
                             data=tmp_path)
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv)
    assert args.arch == cfg["arch"] and args.update_freq == [launch.update_freq_for(cfg, 2)[0]]
    for key, value in {**(cfg.get("model") or {}), **cfg["train"]}.items():
        got = getattr(args, key.replace("-", "_"))
        if isinstance(value, bool):
            assert bool(got) == value, key
        elif isinstance(value, (int, float)) and not isinstance(got, (list, str)):
            assert float(got) == float(value), key
        elif isinstance(got, list):
            assert float(got[0]) == float(value), key  # --lr parses to a list
        else:
            assert str(got) == str(value), key

    # and the model builds with these options (start-up validation of the family), at toy width
    from fairseq import tasks

    for lang in (cfg["source_lang"], cfg["target_lang"]):
        (tmp_path / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(20)))
    small = options.parse_args_and_arch(options.get_training_parser(), input_args=argv + TINY_MODEL + [
        "--encoder-layers", "6", "--decoder-layers", "6", "--max-source-positions", "64",
        "--max-target-positions", "64"])
    model = tasks.setup_task(small).build_model(small)
    from fairseq.models import ARCH_MODEL_REGISTRY

    # the config's arch picks its family's model class, and the toy overrides reached it
    assert type(model) is ARCH_MODEL_REGISTRY[cfg["arch"]], (cfg["arch"], type(model))
    assert len(model.encoder.layers) == len(model.decoder.layers) == 6  # the Full rows window all 6
    assert model.encoder.embed_tokens.embedding_dim == 32


# ------------------------------------------------------------------------ launch / batch

def test_update_freq_keeps_effective_batch():
    wmt = load_config("configs/man/t1-wmt14-man-base.yaml")  # 8 GPUs x 12288 tokens in the paper
    assert [launch.update_freq_for(wmt, n)[:2] for n in (1, 2, 4, 8)] == [(8, 8), (4, 8), (2, 8), (1, 8)]
    uf, got, warning = launch.update_freq_for(wmt, 3)
    assert (uf, got) == (3, 9) and "differs from the paper" in warning
    dw = load_config("configs/diffwin/t1-transformer.yaml")  # P4: 1 GPU x update-freq 8
    assert launch.update_freq_for(dw, 4)[:2] == (2, 8)


def test_launch_commands(monkeypatch):
    cfg = load_config("configs/man/t1-wmt14-man-base.yaml")
    single = launch.launch_command(cfg, "ck", nproc=1, device="gpu")
    assert single[0] == "fairseq-train" and "--fp16" in single
    assert single[single.index("--update-freq") + 1] == "8"
    tr = launch.launch_command(cfg, "ck", nproc=4, launcher="torchrun", device="gpu", precision="bf16")
    assert tr[:4] == ["torchrun", "--nproc_per_node=4", "--standalone", "-m"] and tr[4] == "fairseq_cli.train"
    assert "--bf16" in tr and tr[tr.index("--update-freq") + 1] == "2"
    assert tr[tr.index("--distributed-world-size") + 1] == "4"
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        launch.launch_command(cfg, "ck", nproc=1, nnodes=2, launcher="torchrun", device="gpu")
    monkeypatch.setenv("MASTER_ADDR", "node0")
    multi = launch.launch_command(cfg, "ck", nproc=1, nnodes=2, launcher="torchrun", device="gpu",
                                  master_port=1234)
    assert "--nnodes=2" in multi and "--rdzv_endpoint=node0:1234" in multi
    assert multi[multi.index("--distributed-world-size") + 1] == "2"
    slurm = launch.launch_command(cfg, "ck", nproc=8, nnodes=2, launcher="slurm", device="gpu")
    assert slurm[0] == "srun" and slurm[slurm.index("--distributed-world-size") + 1] == "16"
    assert "--distributed-port" in slurm and slurm[slurm.index("--update-freq") + 1] == "1"
    cpu = launch.launch_command(cfg, "ck", nproc=2, device="cpu")
    assert "man_recipes.training.torchrun_cpu" in cpu and "gloo" in cpu and "--cpu" in cpu
    assert "--fp16" not in cpu
    assert option_args({"a-b": True, "c": False, "d": [1, 2], "e": 0.5}) == ["--a-b", "--d", "1", "2", "--e", "0.5"]


def test_train_sh_dry_run(tmp_path):
    out = run_script(["bash", "scripts/train.sh", "configs/man/t1-iwslt14-man-small.yaml", "--gpus", "4",
                      "--dry-run", "--run-dir", tmp_path / "run"])
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    assert rec["world_size"] == 4 and rec["update_freq"] == 1  # paper: 2 GPUs; 4 GPUs cannot do less
    assert "WARNING: effective batch differs" in out
    assert rec["command"][:2] == ["torchrun", "--nproc_per_node=4"]


# ---------------------------------------------------- distributed CPU training + evaluation

@pytest.fixture(scope="module")
def toy_run(toy_data_bin, tmp_path_factory):
    """scripts/train.sh on the toy corpus with 2 CPU processes (torchrun + gloo), epoch checkpoints kept."""
    tmp = tmp_path_factory.mktemp("toy_run")
    cfg = toy_config(toy_data_bin, "toy-man-small",
                     {"warmup-updates": 10, "max-tokens": 1000, "max-epoch": 3, "log-interval": 5},
                     {"paper_gpus": 2, "paper_update_freq": 2},
                     {"lenpen": 1.0, "avg_last": 2, "remove_bpe": "@@ "}, paper_results={"bleu": None})
    cfg_path = tmp / "toy.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    run = tmp / "run"
    log = run_script(["bash", "scripts/train.sh", cfg_path, "--cpu", "--gpus", "2", "--run-dir", run])
    return run, log


def test_two_process_cpu_training(toy_run):
    run, log = toy_run
    assert "distributed init (rank 0)" in log and "distributed init (rank 1)" in log
    rec = json.loads((run / "run.json").read_text())
    assert rec["world_size"] == 2 and rec["update_freq"] == 2
    assert rec["command"][rec["command"].index("--update-freq") + 1] == "2"
    assert rec["effective_batch_tokens"] == rec["paper_effective_batch_tokens"] == 4000
    for f in ("checkpoint1.pt", "checkpoint2.pt", "checkpoint3.pt"):
        assert (run / "checkpoints" / f).is_file()


def _evaluate_as(run, metric, tmp_path, name=None, extra=()):
    """Copy the toy run with another metric in its config, run evaluate.sh, return results.json."""
    import shutil

    dst = tmp_path / f"run-{name or metric}"
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("eval", "results.*"))
    cfg = yaml.safe_load((dst / "config.yaml").read_text())
    cfg["eval"]["metric"] = metric
    (dst / "config.yaml").write_text(yaml.safe_dump(cfg))
    run_script(["bash", "scripts/evaluate.sh", dst, "--cpu", *extra])
    return dst, json.loads((dst / "results.json").read_text())


def _multi_bleu(hyps, refs, compound):
    """Tokenized BLEU straight from sacrebleu's API (the recipes' scoring module not involved);
    the compound split is the Perl one-liner's regex."""
    import sacrebleu

    split = (lambda s: re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", s.strip())) if compound else str.strip
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    return round(bleu.corpus_score([split(h) for h in hyps], [[split(r) for r in refs]]).score, 2)


def test_evaluate_bleu_and_rouge(toy_run, tmp_path):
    import shutil

    import sacrebleu

    run, _ = toy_run
    # WMT metric: tokenized BLEU with compound splitting + detokenized sacreBLEU with signature;
    # without raw references sacreBLEU falls back to detokenized tokenized references
    dst, res = _evaluate_as(run, "bleu_wmt", tmp_path)
    assert [Path(p).name for p in res["averaged"]] == ["checkpoint3.pt", "checkpoint2.pt"]
    hyps = (dst / "eval/test.hyp").read_text().splitlines()
    refs = (dst / "eval/test.ref").read_text().splitlines()
    assert len(hyps) == len(refs) == res["n_sentences"] > 0
    # the reported scores are sacrebleu's own on the files evaluate.sh wrote
    assert res["scores"]["bleu"] == _multi_bleu(hyps, refs, compound=True)
    assert res["details"]["bleu_tokenized_no_compound_split"]["bleu"] == _multi_bleu(hyps, refs, compound=False)
    assert res["details"]["bleu"]["compound_split"] is True
    assert res["details"]["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert res["details"]["sacrebleu_references"].startswith("Moses-detokenized")
    detok = (dst / "eval/test.detok.hyp").read_text().splitlines()
    assert len(detok) == len(hyps)
    assert res["scores"]["sacrebleu"] == round(sacrebleu.corpus_bleu(detok, [refs]).score, 2)

    # the real WMT14 path: untokenized references next to the binarized data (data-prep writes
    # test.raw.<tgt>, line i = sentence id i). Here the raw references are the detokenized
    # hypotheses of the run above (same checkpoints, same decoding): sacreBLEU must read them
    # (100) and not fall back to the tokenized references (what the run above scored)
    data = tmp_path / "data-raw"
    shutil.copytree(yaml.safe_load((run / "config.yaml").read_text())["data"], data)
    (data / "test.raw.tgt").write_text("\n".join(detok) + "\n")
    dst_raw, res_raw = _evaluate_as(run, "bleu_wmt", tmp_path, name="raw", extra=["--data", data])
    assert res_raw["details"]["sacrebleu_references"] == f"raw references {data / 'test.raw.tgt'}"
    assert (dst_raw / "eval/test.detok.hyp").read_text().splitlines() == detok
    assert res_raw["scores"]["sacrebleu"] == 100.0 != res["scores"]["sacrebleu"]
    md = (dst / "results.md").read_text()
    assert "| bleu |" in md and "| sacrebleu |" in md
    gen = " ".join(res["generate_command"])
    assert "--beam 2" in gen and "--max-len-b 5" in gen and "--max-len-a 1" in gen

    # results_table reads evaluate.sh's output next to the config's paper number
    table_runs = tmp_path / "table_runs" / "r"
    table_runs.mkdir(parents=True)
    (table_runs / "results.json").write_text((dst / "results.json").read_text())
    cfg = yaml.safe_load((dst / "config.yaml").read_text())
    cfg["_path"] = str(dst / "config.yaml")
    cfg["paper_results"] = {"bleu": 12.5}
    table = build_tables([cfg], collect_runs(table_runs.parent))
    assert f"| toy | toy | 12.50 | {res['scores']['bleu']:.2f} | {res['scores']['sacrebleu']:.2f} |" in table

def test_evaluate_scores_rouge_with_rouge155(toy_run, tmp_path, rouge155_perl):
    """The summarization metric: ROUGE-1.5.5 as files2rouge runs it, hypotheses in the first slot."""
    import shutil

    from man_recipes import rouge155

    run, _ = toy_run
    dst, res = _evaluate_as(run, "rouge", tmp_path)
    hyps = (dst / "eval/test.hyp").read_text().splitlines()
    refs = (dst / "eval/test.ref").read_text().splitlines()
    assert res["details"]["rouge_order"] == "hyp-ref"
    assert res["details"]["rouge_implementation"].startswith("ROUGE-1.5.5 as files2rouge runs it")
    assert "files2rouge HYPOTHESES REFERENCES" in res["details"]["rouge_implementation"]
    direct = rouge155.average_f(rouge155.run(hyps, refs, empty_scores_zero=True)[0])
    assert {k: res["scores"][k] for k in direct} == direct
    assert "| rougeL |" in (dst / "results.md").read_text()
    assert res["details"]["rouge_references"].startswith("fairseq-generate's target lines")

    # with the references data-prep writes beside the data (test.raw.<tgt>), ROUGE reads those, as the
    # papers scored, not fairseq's target lines: here they are the hypotheses themselves (100)
    data = tmp_path / "data-raw"
    shutil.copytree(yaml.safe_load((run / "config.yaml").read_text())["data"], data)
    (data / "test.raw.tgt").write_text("\n".join(hyps) + "\n")
    dst_raw, res_raw = _evaluate_as(run, "rouge", tmp_path, name="raw", extra=["--data", data])
    assert res_raw["details"]["rouge_references"] == f"raw references {data / 'test.raw.tgt'}"
    assert (dst_raw / "eval/test.ref").read_text().splitlines() == hyps != refs
    assert res_raw["scores"] == {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0} != res["scores"]


# --------------------------------------------------------------------------------- scoring

def test_compound_split_bleu_hand_computed():
    hyp = ["a state-of-the-art model works"]
    ref = ["a state-of-the-art model runs well"]
    # split: hyp 10 tokens, ref 11; matched n-grams 9/10, 8/9, 7/8, 6/7; BP = exp(1 - 11/10)
    expected = 100 * math.exp(1 - 11 / 10) * (9 / 10 * 8 / 9 * 7 / 8 * 6 / 7) ** 0.25
    got = scoring.tokenized_bleu(hyp, ref, compound=True)
    assert got["sys_len"] == 10 and got["ref_len"] == 11
    assert got["bleu"] == round(expected, 2) == 79.64
    # without splitting no 4-gram matches: unsmoothed BLEU is 0
    assert scoring.tokenized_bleu(hyp, ref)["bleu"] == 0.0
    assert scoring.compound_split("x @-@ y") == "x @ ##AT##-##AT## @ y"  # same as the Perl one-liner
    assert scoring.tokenized_bleu(["The Cat sat Down"], ["the cat sat down"], lowercase=True)["bleu"] == 100.0
    assert scoring.tokenized_bleu(["The Cat sat Down"], ["the cat sat down"])["bleu"] == 0.0


def test_sacrebleu_detok_matches_sacrebleu_and_hand_computed():
    import sacrebleu

    # 13a splits the punctuation: hyp "The cat sat , on the mat ." (8 tokens), ref 7 tokens;
    # matches 7/8, 5/7, 3/6, 1/5, BP = 1 -> 100 * (1/16) ** (1/4) = 50
    got = scoring.sacrebleu_detok(["The cat sat, on the mat."], ["The cat sat on the mat."])
    assert got["bleu"] == 50.0
    assert got["signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    hyps = ["Hello, world!", "the Cat is here.", "No match at all"]
    refs = ["Hello world!", "The cat is here.", "Something else entirely"]
    assert scoring.sacrebleu_detok(hyps, refs)["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def test_moses_detokenize_hand_written():
    assert scoring.moses_detokenize(["Hello , world !", 'He said " yes " .', "Das ist ( ein ) Test , oder ?"],
                                    "en") == ["Hello, world!", 'He said "yes".', "Das ist (ein) Test, oder?"]


def test_read_generate_output_orders_by_id():
    from man_recipes.evaluation.decode import EvaluateError, read_generate_output

    text = "S-1\tb\nT-1\tref b\nH-1\t-0.1\thyp b\nD-1\t-0.1\thyp b\nS-0\ta\nT-0\tref a\nH-0\t-0.2\thyp a\n"
    assert read_generate_output(text) == ([0, 1], ["hyp a", "hyp b"], ["ref a", "ref b"])
    sources_only = "S-1\tb\nH-1\t-0.1\thyp b\nS-0\ta\nH-0\t-0.2\thyp a\n"
    assert read_generate_output(sources_only, with_targets=False) == ([0, 1], ["hyp a", "hyp b"], None)
    with pytest.raises(EvaluateError, match="2 hypotheses and 0 targets"):
        read_generate_output(sources_only)


def test_decode_cuts_sources_as_training_did(toy_data_bin, tmp_path):
    """A model trained with --truncate-source at 8 source positions decodes a test set with
    longer sources (fairseq-generate alone refuses them): every sentence comes back."""
    from conftest import TINY_TRAIN, USER_DIR, run_cli

    from man_recipes.evaluation.decode import decode

    positions = ["--truncate-source", "--max-source-positions", "8"]
    run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_iwslt_de_en",
             *TINY_MODEL, *TINY_TRAIN, *positions, "--max-update", "2", "--save-dir", tmp_path / "ckpt"])
    cfg = {"source_lang": "src", "target_lang": "tgt", "train": {"truncate-source": True, "max-source-positions": 8},
           "eval": {"beam": 2, "max_len_b": 5, "remove_bpe": ""}}
    _cmd, ids, hyps, _refs = decode(cfg, toy_data_bin, tmp_path / "ckpt" / "checkpoint_last.pt", "test", "cpu",
                                    "fp32", 8, tmp_path / "generate.txt")
    assert ids == list(range(20)) and len(hyps) == 20


def test_decode_from_sources_alone_ignores_targets_longer_than_the_model(toy_data_bin, tmp_path):
    """ROUGE reads the release's references, so evaluation decodes the sources alone: a reference
    longer than the model's target positions (two CNN/DM validation summaries at 512) stops
    fairseq-generate when it reads the targets, and not when it decodes the sources alone."""
    from conftest import TINY_TRAIN, USER_DIR, run_cli

    from man_recipes.evaluation.decode import EvaluateError, decode

    run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_iwslt_de_en",
             *TINY_MODEL, *TINY_TRAIN, "--max-target-positions", "6", "--skip-invalid-size-inputs-valid-test",
             "--max-update", "2", "--save-dir", tmp_path / "ckpt"])
    cfg = {"source_lang": "src", "target_lang": "tgt", "eval": {"beam": 2, "max_len_b": 4, "remove_bpe": ""}}
    args = (cfg, toy_data_bin, tmp_path / "ckpt" / "checkpoint_last.pt", "test", "cpu", "fp32", 8)
    with pytest.raises(EvaluateError, match="fairseq-generate failed"):
        decode(*args, tmp_path / "with-targets.txt")
    _cmd, ids, hyps, refs = decode(*args, tmp_path / "generate.txt", sources_only=True)
    assert ids == list(range(20)) and len(hyps) == 20 and refs is None
    assert sorted(p.name for p in (tmp_path / "test-sources").iterdir()) == [
        "dict.src.txt", "dict.tgt.txt", "test.src-tgt.src.bin", "test.src-tgt.src.idx"]


def test_docs_list_every_row_with_its_command_and_paper_number():
    docs = (REPO / "docs" / "reproducing.md").read_text()
    for cfg in CONFIGS:
        rel = Path(cfg["_path"]).relative_to(REPO)
        line = next((l for l in docs.splitlines() if l.startswith("|") and f"scripts/train.sh {rel} " in l), None)
        assert line is not None, f"docs/reproducing.md lacks the command for {rel}"
        assert f"scripts/evaluate.sh runs/{cfg['name']}`" in line
        bleu = (cfg.get("paper_results") or {}).get("bleu")
        if bleu is not None:
            assert f"{bleu:.2f}" in line, rel
