"""The per-sublayer gradient recorder (man_fairseq/recipes/sublayer_grads.py)."""

import json
import math
import re
import sys

import pytest
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, build_fairseq_model, run_cli

from man_fairseq.recipes.sublayer_grads import sublayer_groups


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
    out = tmp_path / "grads"
    log = run_cli([sys.executable, "-m", "man_fairseq.recipes.sublayer_grads", "--out", out, "--",
                   toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_man_small", *TINY_MODEL, *TINY_TRAIN,
                   "--max-update", "4", "--no-save", "--disable-validation", "--log-interval", "1"]).stdout
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
