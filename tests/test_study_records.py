"""Run records of a study and the table built from them (study_records.py, bleu_table.py on study_table.py)."""

import json

import pytest

from man_recipes.studies import study_records as sr
from man_recipes.config import CONFIG_DIR, load_config
from man_recipes.options import parse_seeds
from man_recipes.studies.reproduce import FAMILIES


def record(family, seed, fp="f" * 16, bleu=30.0, n=3):
    return {"family": family, "seed": seed, "fingerprint": fp, "arch": "a", "params": 1000, "train_seconds": 60.0,
            "updates": 10, "valid_curve": [[5, 7.0], [10, 6.0]],
            "test_sets": {"test": {"name": "test_2016_flickr", "n_sentences": n, "sacrebleu": bleu,
                                   "bleu_tok_ci": bleu + 1, "sacrebleu_signature": "nrefs:1|case:mixed"}}}


def test_fingerprint_follows_what_decides_a_run(tmp_path):
    cfg = load_config(CONFIG_DIR / "multi30k-cpu" / "man.yaml")
    fp = sr.config_fingerprint(cfg, [], 1)
    assert fp == sr.config_fingerprint(dict(cfg, notes="other words", name="renamed", _path="/x.yaml"), [], 1)
    assert fp != sr.config_fingerprint(cfg, [], 2)
    assert fp != sr.config_fingerprint(cfg, ["--dropout", "0.1"], 1)
    changed = dict(cfg, train=dict(cfg["train"], lr=cfg["train"]["lr"] * 2))
    assert fp != sr.config_fingerprint(changed, [], 1)
    changed = dict(cfg, model=dict(cfg["model"], **{"encoder-ffn-embed-dim": 1024}))
    assert fp != sr.config_fingerprint(changed, [], 1)
    (tmp_path / "dict.de.txt").write_text("a 1\n")
    with_data = sr.config_fingerprint(cfg, [], 1, tmp_path)
    (tmp_path / "dict.de.txt").write_text("b 1\n")
    assert with_data != sr.config_fingerprint(cfg, [], 1, tmp_path) != fp


def test_records_of_blocking_configs_name_how_ngrams_were_blocked(monkeypatch):
    """Records decoded while fairseq's CPU path blocked no n-gram are stale; their runs are rescored,
    not retrained, and studies without blocking keep their fingerprints."""
    giga = load_config(CONFIG_DIR / "gigaword-cpu" / "transformer.yaml")
    m30k = load_config(CONFIG_DIR / "multi30k-cpu" / "man.yaml")
    assert giga["eval"]["no_repeat_ngram_size"] == 3 and not m30k["eval"].get("no_repeat_ngram_size")
    before = [sr.config_fingerprint(giga, [], 1), sr.config_fingerprint(giga, [], 1, keys=sr.TRAINING_KEYS),
              sr.config_fingerprint(m30k, [], 1)]
    monkeypatch.setattr(sr, "NGRAM_BLOCKING", "none (fairseq's CPU fallback)")
    after = [sr.config_fingerprint(giga, [], 1), sr.config_fingerprint(giga, [], 1, keys=sr.TRAINING_KEYS),
             sr.config_fingerprint(m30k, [], 1)]
    assert before[0] != after[0] and before[1:] == after[1:]


def test_records_round_trip_and_refuse_incomplete_writes(tmp_path):
    r = record("man", 2)
    path = sr.write_record(tmp_path, r, {"test": ["a", "b", "c"]})
    assert path.name == "man-seed2.json" and (tmp_path / "man-seed2.test.hyp").read_text() == "a\nb\nc\n"
    (back,) = sr.read_records(tmp_path)
    assert back["version"] == sr.RECORD_VERSION and back["test_sets"] == r["test_sets"]
    assert sr.read_hypotheses(tmp_path, back, "test") == ["a", "b", "c"]
    assert sr.matching_record(tmp_path, "man", 2, "f" * 16) is not None
    assert sr.matching_record(tmp_path, "man", 2, "0" * 16) is None
    assert sr.matching_record(tmp_path, "man", 3, "f" * 16) is None
    with pytest.raises(sr.RecordError, match="2 hypotheses for 3 sentences"):
        sr.write_record(tmp_path, record("sman2", 1), {"test": ["a", "b"]})
    with pytest.raises(sr.RecordError, match="hypotheses for"):
        sr.write_record(tmp_path, record("sman2", 1), {})
    assert not (tmp_path / "sman2-seed1.json").exists()
    (tmp_path / "junk-seed1.json").write_text("{not json")
    with pytest.raises(sr.RecordError, match="not a readable record"):
        sr.read_records(tmp_path)
    (tmp_path / "junk-seed1.json").write_text(json.dumps({"family": "junk"}))
    with pytest.raises(sr.RecordError, match="not a version-1 run record"):
        sr.read_records(tmp_path)


def test_stale_and_unexpected_records_are_kept_out():
    records = [record("transformer", 1, "a" * 16), record("man", 1, "b" * 16), record("man", 2, "c" * 16)]
    expected = {("transformer", 1): "a" * 16, ("man", 1): "x" * 16}
    current, stale = sr.partition(records, expected)
    assert [(r["family"], r["seed"]) for r in current] == [("transformer", 1)]
    assert [(r["family"], r["seed"]) for r in stale] == [("man", 1), ("man", 2)]


def test_cpu_preset_has_every_family_at_one_width_and_budget():
    cfgs = {f: load_config(CONFIG_DIR / "multi30k-cpu" / f"{f}.yaml") for f in FAMILIES}
    for cfg in cfgs.values():
        m, t = cfg["model"], cfg["train"]
        assert (m["encoder-embed-dim"], m["encoder-layers"], m["decoder-layers"], m["encoder-attention-heads"]) == (256, 3, 3, 4)
        assert (t["max-epoch"], t["lr"], t["warmup-updates"], t["max-tokens"]) == (10, 0.003, 300, 4096)
        assert m["encoder-normalize-before"] is True and m["decoder-normalize-before"] is True
        assert cfg["paper"] == "none" and cfg["notes"]
    assert len({json.dumps(c["train"], sort_keys=True) for c in cfgs.values() if c is not cfgs["calibration"]}) == 1


def test_parse_seeds():
    assert parse_seeds("3") == [1, 2, 3] and parse_seeds("2,3") == [2, 3] and parse_seeds("3,") == [3]
    assert parse_seeds("2,3,") == [2, 3]
    for bad in ("0", "2,2", ","):
        with pytest.raises(ValueError):
            parse_seeds(bad)
    for typo in ("1,,2", ",1", "1,,"):  # "1,,2" was read as 1,2
        with pytest.raises(ValueError, match="an empty item"):
            parse_seeds(typo)


def test_cpu_preset_builds_every_family_and_man_matches_the_transformer_parameters():
    from conftest import build_fairseq_model, num_params
    from man_recipes.config import option_args

    counts = {}
    for fam in FAMILIES:
        cfg = load_config(CONFIG_DIR / "multi30k-cpu" / f"{fam}.yaml")
        model, _, _ = build_fairseq_model(cfg["arch"], option_args(cfg["model"]), dict_size=9804)
        counts[fam] = num_params(model)
    for fam in ("man", "sman2"):
        assert abs(counts[fam] / counts["transformer"] - 1) < 0.02, counts
    for fam in ("localness", "diffwin", "calibration"):  # they keep their extra parameters
        assert counts[fam] > counts["transformer"], counts


def test_delta_to_the_transformer_is_over_matched_seeds():
    from man_recipes.studies import bleu_table

    records = [record("transformer", 1, bleu=30.0), record("transformer", 2, bleu=33.0),
               record("transformer", 3, bleu=36.0), record("man", 1, bleu=31.0), record("man", 2, bleu=33.5),
               record("man", 3, bleu=36.5), record("localness", 1, bleu=31.0), record("sman2", 4, bleu=40.0)]
    summary = bleu_table.summarize(records, ["transformer", "man", "localness", "sman2"], {}, {})
    delta = {fam: e["test_sets"]["test"]["delta_sacrebleu_vs_transformer"] for fam, e in summary.items()}
    # localness has seed 1 only: +1.0 against seed 1 (its 31.0 against the 3-seed mean 33.0 would be -2.0)
    assert delta == {"transformer": 0.0, "man": pytest.approx(0.67, abs=0.005), "localness": 1.0, "sman2": None}


def test_table_says_which_way_each_significant_seed_went_under_randomization():
    from man_recipes.studies import bleu_table

    records = [record("transformer", s, bleu=30.0) for s in (1, 2)] + [record("man", 1, bleu=31.0),
                                                                          record("man", 2, bleu=29.0)]
    def tests(bootstrap_p, randomization_p, bleu):
        return {"paired_bootstrap": {"p_value": bootstrap_p, "system_bleu": bleu, "baseline_bleu": 30.0},
                "paired_randomization": {"p_value": randomization_p, "system_bleu": bleu, "baseline_bleu": 30.0}}

    boot = {("man", 1, "test"): tests(0.01, 0.03, 31.0), ("man", 2, "test"): tests(0.02, 0.0001, 29.0)}
    summary = bleu_table.summarize(records, ["transformer", "man"], {}, boot)
    meta = {k: "x" for k in ("title", "date", "records", "configs", "command", "png", "sacrebleu_signature",
                             "bootstrap_signature", "randomization_signature")}
    meta.update(devices=["cpu"], commits=["c"], fairseq_args=[], test_sets={"test": "test_2016_flickr"})
    (row,) = [l for l in bleu_table.to_markdown(summary, meta, []).splitlines() if l.startswith("| man ")]
    # the bootstrap's p beside the randomization's, on which the count of significant seeds rests
    assert "| 0.010 (+), 0.020 (−) | 0.030 (+), 0.0001 (−) | 1 better, 1 worse of 2 |" in row
    boot[("man", 1, "test")]["paired_randomization"]["p_value"] = 0.07
    summary = bleu_table.summarize(records, ["transformer", "man"], {}, boot)
    (row,) = [l for l in bleu_table.to_markdown(summary, meta, []).splitlines() if l.startswith("| man ")]
    assert "| 0.010 (+), 0.020 (−) | 0.070 (+), 0.0001 (−) | 0 better, 1 worse of 2 |" in row


def test_each_study_names_the_preparation_that_writes_the_data_it_reads(tmp_path):
    """The line a study prints for a missing data-bin must write that data-bin, naming it once:
    without its --dest, prepare-gigaword.sh wrote data-bin/gigaword while the study read
    data-bin/gigaword-30k; then the line named --dest twice (the default folder and the one read)."""
    import shlex

    from man_recipes.config import REPO
    from man_recipes.studies.experiments import EXPERIMENTS, prepare_line

    for name, exp in EXPERIMENTS.items():
        for data, expected in ((None, exp["data"]), (tmp_path / "my data", tmp_path / "my data")):
            words = shlex.split(prepare_line(name, data).replace("[--from FOLDER]", ""))
            assert words.count("--dest") == 1, (name, words)
            assert REPO / words[words.index("--dest") + 1] == expected, (name, words)
            assert words[0] == f"data-prep/prepare-{exp['dataset']}.sh", (name, words)
