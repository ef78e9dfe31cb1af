"""Every recipe config against the papers: the training and decoding commands it builds carry the
paper's values (or the documented source of a value the paper does not give), and every results
row of the papers' tables (as the maintainers transcribed them in ``../shared/paper-tables.md``,
checked where that file is present) has a config, an analysis or a docs/reproducing.md "not reproduced" line."""

import math

import pytest

from man_recipes.training import launch
from man_recipes.config import REPO, all_configs
from man_recipes.evaluation.decode import generate_args
from man_recipes.evaluation.paper_rows import ROWS, numbers_in, parse_paper_rows, readme_rows_section

PAPER_TABLES = REPO.parent / "shared" / "paper-tables.md"
CONFIGS = [c for c in all_configs() if c.get("paper") not in (None, "none")]
BY_NAME = {c["name"]: c for c in CONFIGS}


def _family(name):
    """The expected training/decoding values of a config, from the papers' hyper-parameter sections
    (each config's notes name the section); values the paper does not state are the documented
    choices of the config notes."""
    if name.startswith("man-t2-"):
        cnndm = "cnndm" in name
        return dict(lr=1e-3 if cnndm else 8e-4, warmup=8000, updates=50000,
                    tokens=(8192 if cnndm else 12288) * 4, dropout=0.1, beam=5, lenpen=2.0 if cnndm else 1.0,
                    max_len_b=50 if cnndm else 30, pre_norm=False, clip=0.1, trigram=3)
    if name.startswith("man-"):
        if "iwslt14" in name:  # small: 2 GPUs x 8192
            return dict(lr=7e-3, warmup=8000, updates=80000, tokens=8192 * 2, dropout=0.3, beam=5, lenpen=1.0,
                        pre_norm=True, attention_dropout=0.1, activation_dropout=0.1)
        if "base" in name:  # 8 GPUs x 12288
            return dict(lr=1e-2, warmup=8000, updates=80000, tokens=12288 * 8, dropout=0.1, beam=4, lenpen=0.6,
                        pre_norm=True, attention_dropout=0.1, activation_dropout=0.1)
        return dict(lr=1.5e-2, warmup=8000, updates=50000, tokens=4096 * 8, dropout=0.3, beam=4, lenpen=0.6,
                    pre_norm=True, attention_dropout=0.1, activation_dropout=0.1)
    if name.startswith("localness-"):  # 8 P40 x 4096 (paper); the rest Vaswani et al.'s base / big
        big = "-big-" in name
        return dict(lr=4.94e-4 if big else 7e-4, warmup=4000, updates=300000 if big else 100000,
                    tokens=4096 * 8, dropout=0.3 if big else 0.1, beam=4, lenpen=0.6, pre_norm=False,
                    avg_last=20 if big else 5)
    if name.startswith("diffwin-"):  # 1 GPU x update-freq 8, 200k updates, last 5 averaged (paper)
        return dict(lr=7e-4, warmup=4000, updates=200000, tokens=4096 * 8, dropout=0.1, beam=4, lenpen=0.6,
                    pre_norm=False, avg_last=5)
    if name.startswith("calibration-"):  # 150k steps, Adam (0.9, 0.998), last 10 averaged (paper)
        return dict(lr=7e-4, warmup=4000, updates=150000, tokens=4096 * 8, dropout=0.1, beam=4, lenpen=0.6,
                    pre_norm=False, avg_last=10, betas="(0.9, 0.998)")
    raise AssertionError(f"no paper values for {name}")


def _flag(argv, flag, default=None):
    """The value of the last ``flag`` in argv (fairseq/argparse: the last one wins); True for a bare flag."""
    if flag not in argv:
        return default
    i = len(argv) - 1 - argv[::-1].index(flag)
    nxt = argv[i + 1] if i + 1 < len(argv) else None
    return True if nxt is None or nxt.startswith("--") else nxt


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c["name"] for c in CONFIGS])
def test_training_command_carries_the_paper_values(cfg, tmp_path):
    want = _family(cfg["name"])
    gpus, freq = cfg["batch"]["paper_gpus"], cfg["batch"]["paper_update_freq"]
    for world in (gpus, 1):
        argv = launch.train_args(cfg, tmp_path, world_size=world, device="gpu")
        uf = int(_flag(argv, "--update-freq"))
        assert int(_flag(argv, "--max-tokens")) * world * uf == want["tokens"], (cfg["name"], world)
    argv = launch.train_args(cfg, tmp_path, world_size=gpus, device="gpu")
    assert float(_flag(argv, "--lr")) == pytest.approx(want["lr"])
    assert int(_flag(argv, "--warmup-updates")) == want["warmup"]
    assert int(_flag(argv, "--max-update")) == want["updates"]
    assert float(_flag(argv, "--dropout")) == want["dropout"]
    assert _flag(argv, "--lr-scheduler") == "inverse_sqrt" and _flag(argv, "--optimizer") == "adam"
    assert float(_flag(argv, "--label-smoothing")) == 0.1
    assert _flag(argv, "--adam-betas") == want.get("betas", "(0.9, 0.98)")
    for side in ("encoder", "decoder"):
        assert bool(_flag(argv, f"--{side}-normalize-before", False)) == want["pre_norm"], side
    for key in ("attention_dropout", "activation_dropout"):
        if key in want:
            assert float(_flag(argv, "--" + key.replace("_", "-"))) == want[key]
    if "clip" in want:
        assert float(_flag(argv, "--clip-norm")) == want["clip"]
    gen = generate_args(cfg, "DATA", "ck.pt", "test", "gpu", "fp16", 64)
    assert float(_flag(gen, "--beam")) == want["beam"] and float(_flag(gen, "--lenpen")) == want["lenpen"]
    # decoding cuts the sources as training did
    assert bool(_flag(gen, "--truncate-source", False)) == bool(cfg["train"].get("truncate-source"))
    if cfg["train"].get("truncate-source"):
        assert int(_flag(gen, "--max-source-positions")) == cfg["train"]["max-source-positions"]
    if "max_len_b" in want:
        assert int(_flag(gen, "--max-len-b")) == want["max_len_b"]
        assert int(_flag(gen, "--no-repeat-ngram-size")) == want["trigram"]
    if "avg_last" in want:
        assert cfg["eval"]["avg_last"] == want["avg_last"]
    assert cfg.get("notes"), "every config says which values are not from the paper"


def test_calibration_rows_use_the_papers_fusion_settings():
    assert BY_NAME["calibration-t2-fixed"]["model"]["calibration-lambda"] == 0.1
    assert BY_NAME["calibration-t2-fixed"]["model"]["calibration-fusion"] == "fixed"  # a + lambda a^c
    anneal = BY_NAME["calibration-t2-anneal"]
    assert anneal["model"]["calibration-anneal-steps"] == 100000
    # the paper's 150k steps: gamma(s) = exp(-s/1e5) ends at 0.22 (at 100k it would be 0.37)
    gamma_end = math.exp(-anneal["train"]["max-update"] / anneal["model"]["calibration-anneal-steps"])
    assert gamma_end == pytest.approx(0.223, abs=1e-3)
    assert BY_NAME["calibration-t2-transformer"]["arch"] == "transformer_wmt_en_de"


def test_paper_gpus_as_the_papers_state_them():
    assert {BY_NAME[n]["batch"]["paper_gpus"] for n in BY_NAME if n.startswith("man-t1-iwslt14")} == {2}
    assert {BY_NAME[n]["batch"]["paper_gpus"] for n in BY_NAME if n.startswith("man-t1-wmt14")} == {8}
    assert {BY_NAME[n]["batch"]["paper_gpus"] for n in BY_NAME if n.startswith("man-t2-")} == {4}
    assert {(BY_NAME[n]["batch"]["paper_gpus"], BY_NAME[n]["batch"]["paper_update_freq"])
            for n in BY_NAME if n.startswith("diffwin-")} == {(1, 8)}


def test_no_config_without_its_paper_numbers():
    for cfg in CONFIGS:
        res = cfg.get("paper_results") or {}
        assert res and all(v is not None for v in res.values()), cfg["name"]
        assert "verified" not in res, cfg["name"]  # every number is now checked against paper-tables.md


def test_every_config_row_is_in_the_row_table():
    used = {name for status in ROWS.values() for name in status.get("configs", [])}
    assert used <= set(BY_NAME), sorted(used - set(BY_NAME))
    assert set(BY_NAME) <= used, f"configs that no paper row names: {sorted(set(BY_NAME) - used)}"


@pytest.fixture
def paper_rows(shared_data):
    # ../shared/paper-tables.md lives beside ../shared/data: through the shared-data rule
    # (conftest.py), a skip here fails CI when the shared folder is there
    if not PAPER_TABLES.is_file():
        pytest.skip(f"{PAPER_TABLES} is not present (the paper tables live beside the repository)")
    return parse_paper_rows(PAPER_TABLES)


def test_every_paper_row_has_a_config_an_analysis_or_a_reason(paper_rows):
    missing = sorted(set(paper_rows) - set(ROWS))
    assert not missing, f"paper rows with no config and no reason: {missing}"
    stale = sorted(set(ROWS) - set(paper_rows))
    assert not stale, f"rows that paper-tables.md does not have: {stale}"
    for key, status in ROWS.items():
        dataset, numbers = paper_rows[key]
        if "configs" not in status:
            continue
        printed = numbers_in(numbers)
        for name in status["configs"]:
            res = BY_NAME[name]["paper_results"]
            for metric, value in res.items():
                if metric == "params" and "M" not in numbers:
                    continue  # a row repeating another table's run without its parameter count
                value = float(str(value).rstrip("M"))
                assert value in printed, f"{name}: {metric} {value} is not printed in {key}: {numbers}"


def test_readme_lists_every_row_with_command_and_paper_number(paper_rows):
    readme = (REPO / "docs" / "reproducing.md").read_text()
    section = readme_rows_section(CONFIGS, paper_rows, REPO)
    missing = [line for line in section.splitlines() if line.startswith("|") and line not in readme]
    assert not missing, "docs/reproducing.md '## 4. Every table row' is out of date:\n" + "\n".join(missing[:5])


def test_readme_rows_without_paper_tables_still_match_configs():
    """Without ../shared the config lines of docs/reproducing.md's section are still checked."""
    readme = (REPO / "docs" / "reproducing.md").read_text()
    section = readme_rows_section(CONFIGS, {}, REPO)
    lines = [l for l in section.splitlines() if "scripts/train.sh" in l]
    assert len(lines) >= len(CONFIGS)
    assert all(line in readme for line in lines)
    assert "not reproduced: corpus outside the recipes" in readme
