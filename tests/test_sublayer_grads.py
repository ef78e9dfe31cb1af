"""The per-sublayer gradient recorder (lab/sublayer_grads.py)."""

import importlib.util
import json
import math
import re
import sys

import pytest
from conftest import REPO, TINY_MODEL, TINY_TRAIN, USER_DIR, build_fairseq_model, run_cli

from lab.sublayer_grads import sublayer_groups


def test_groups_name_every_sublayer_of_man_and_transformer():
    man, _, _ = build_fairseq_model("transformer_man_small", TINY_MODEL)
    groups = sublayer_groups(man)
    assert set(groups) == {n for n, p in man.named_parameters() if p.requires_grad}
    names = set(groups.values())
    for layer in ("enc0", "enc1"):
        assert {f"{layer}.dman", f"{layer}.dman.mask", f"{layer}.san", f"{layer}.ffn"} <= names
    assert {"dec0.san", "dec0.cross", "dec0.ffn", "embeddings"} <= names
    assert groups["encoder.layers.1.blocks.0.bias_module.distance_bias"] == "enc1.dman.mask"
    assert groups["encoder.layers.1.sublayer_norms.2.weight"] == "enc1.ffn"

    transformer, _, _ = build_fairseq_model("transformer_iwslt_de_en", TINY_MODEL)
    groups = sublayer_groups(transformer)
    assert groups["encoder.layers.0.self_attn_layer_norm.weight"] == "enc0.san"
    assert groups["decoder.layers.1.encoder_attn.k_proj.weight"] == "dec1.cross"
    assert groups["decoder.layers.1.fc2.bias"] == "dec1.ffn"
    assert not [g for g in groups.values() if g == "other"]


def test_records_real_updates_of_fairseq_train(toy_data_bin, tmp_path):
    out, cwd = tmp_path / "grads", tmp_path / "cwd"
    cwd.mkdir()
    log = run_cli([sys.executable, "-m", "lab.sublayer_grads", "--out", out, "--",
                   toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_man_small", *TINY_MODEL, *TINY_TRAIN,
                   "--max-update", "4", "--no-save", "--disable-validation", "--log-interval", "1",
                   # fairseq makes --save-dir (default ./checkpoints) even with --no-save: keep it in tmp_path
                   "--save-dir", tmp_path / "checkpoints"], cwd=cwd, env={"PYTHONPATH": str(REPO)}).stdout
    assert list(cwd.iterdir()) == []  # nothing written where the command was started
    rows = json.loads((out / "sublayer_grads.json").read_text())["updates"]
    assert [r["update"] for r in rows] == [1, 2, 3, 4]
    # the groups partition the gradient fairseq stepped with: together they are its logged gnorm
    gnorms = [float(g) for g in re.findall(r"num_updates=\d+.*?gnorm=([0-9.]+)", log)]
    assert len(gnorms) == 4
    for row, gnorm in zip(rows, gnorms):
        assert math.sqrt(sum(v * v for v in row["norms"].values())) == pytest.approx(gnorm, abs=6e-4)
    for row in rows:
        assert row["norms"]["enc0.dman.mask"] > 0 and row["norms"]["dec1.cross"] > 0
        assert all(math.isfinite(v) for v in row["norms"].values())
    assert rows[0]["norms"] != rows[1]["norms"]  # a fresh gradient per update, not one kept
    assert (out / "sublayer_grads.png").stat().st_size > 10_000


def _study_script(monkeypatch, repo):
    spec = importlib.util.spec_from_file_location("man_training_study", REPO / "lab" / "man_training_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "REPO", repo)
    return module


def _record(name, valid):
    return {"name": name, "state": "finished", "train_inner": [{"updates": 250, "loss": valid + 1}],
            "valid": [{"updates": 127 * (i + 1), "loss": v, "nll_loss": v - 1} for i, v in enumerate([valid + 2, valid])],
            "sublayer_grads": [{"update": 101, "lr": 1e-3, "norms": {"enc0.san": 0.1, "enc0.ffn": 0.05}}]}


def test_study_table_shows_an_included_baseline_first_and_refuses_a_missing_or_clashing_one(monkeypatch, tmp_path,
                                                                                          capsys):
    """--include puts another study's record (a probe's baseline) beside the study's own runs, read, not copied."""
    for study, name, valid in [("probe", "P1", 5.2), ("probe", "P0", 5.3), ("base", "T", 5.1)]:
        (tmp_path / "results" / study).mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / study / f"{name}.json").write_text(json.dumps(_record(name, valid)))
    (tmp_path / "docs").mkdir()
    script = _study_script(monkeypatch, tmp_path)
    script.main(["--study", "probe", "--include", "base/T", "--notes", '{"T": "the baseline"}'])
    rows = [l for l in (tmp_path / "results" / "probe.md").read_text().splitlines() if l.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| T", "| P0", "| P1"]
    assert "the baseline" in rows[0] and "5.100" in rows[0]
    assert sorted(p.name for p in (tmp_path / "results" / "probe").iterdir()) == ["P0.json", "P1.json"]
    assert (tmp_path / "docs" / "probe.png").stat().st_size > 10_000
    capsys.readouterr()
    for bad, why in [("base/nothing", f"no record {tmp_path / 'results' / 'base' / 'nothing.json'}"),
                     ("probe/P0", "probe has a run of that name too")]:
        with pytest.raises(SystemExit) as e:
            script.main(["--study", "probe", "--include", bad])
        assert e.value.code == 2 and f"error: --include {bad}: {why}" in capsys.readouterr().err
