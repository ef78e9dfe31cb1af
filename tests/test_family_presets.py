"""The four family archs are presets of the composed model (issue 78): one encoder/decoder wiring
(``models/biased_transformer.py``) builds every family's model, and each arch builds the model it
built before the change.

* ``tests/family_presets.json`` holds, for every registered arch of the four families at a tiny
  width and for a few options of each family (MAN's sublayer orders and SMAN, localness windows and
  relative positions, the diffwin presets, the calibration fusions), the sha256 of every tensor of
  the state dict (name -> digest, in order) after ``torch.manual_seed(1)`` and the build
  fairseq-train does. The code before the change wrote it (``python tests/test_family_presets.py
  --write``); regenerate it only for a change meant to change the models, and say so in the commit.
  Initialisation is the RNG and elementwise arithmetic, so the digests are the same on any CPU.
* Each family arch and the composed arch given that family's options build the same state dict
  (names, order, values) and give the same outputs (in this process: no float golden across machines).
"""

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, build_fairseq_model
from model_families import tokens

import man_fairseq  # noqa: F401  (registers the archs)
from man_recipes.cli import options as man_options

FIXTURE = Path(__file__).resolve().parent / "family_presets.json"
FAMILIES = ("transformer_man", "transformer_localness", "transformer_diffwin", "transformer_calibrated")
CRITERION = ["--criterion", "calibrated_label_smoothed_cross_entropy"]

# options beyond the archs' defaults, per family (each built at the family's base size)
VARIANTS = {
    "man_orders": ("transformer_man_base", ["--encoder-sublayers", "san,dman,ffn", "--decoder-sublayers",
                                            "dman,cross,ffn", "--dman-init", "zeros", "--man-norm", "post"]),
    "man_sman": ("transformer_man_base", ["--encoder-sublayers", "sman1,sman2,ffn", "--decoder-sublayers",
                                          "sman2,cross,ffn", "--static-mask-window", "2",
                                          "--attention-head-activation", "relu"]),
    # MAN's archs keep MAN's layer form on the Transformer's order
    "man_transformer_orders": ("transformer_man_base", ["--encoder-sublayers", "san,ffn",
                                                        "--decoder-sublayers", "san,cross,ffn"]),
    "localness_head_everywhere": ("transformer_localness_base", [
        "--localness-window", "head", "--localness-layers", "all",
        "--localness-attention-types", "encoder_self,decoder_self,cross"]),
    "localness_fixed_relative": ("transformer_localness_base", [
        "--localness-window", "fixed", "--localness-fixed-window", "3", "--relative-positions",
        "--max-relative-position", "4"]),
    "localness_relative_only": ("transformer_localness_base", [
        "--localness-layers", "", "--relative-positions", "--relative-position-attention-types", "decoder_self"]),
    **{f"diffwin_{preset}": ("transformer_diffwin_base", ["--diffwin-preset", preset])
       for preset in ("none", "enc_aw-dec_mw", "cr_aw_seg", "enc_aw-cr_aw_seg-dec_mw")},
    "diffwin_segment_mw": ("transformer_diffwin_base", [
        "--diffwin-preset", "none", "--diffwin-encoder", "mw", "--diffwin-encoder-mask", "segment",
        "--diffwin-segment-size", "2", "--diffwin-cross", "aw", "--diffwin-layers", "1",
        "--diffwin-mw-renormalize", "--diffwin-mask-union"]),
    **{f"calibrated_{fusion}": ("transformer_calibrated_base", ["--calibration-fusion", fusion])
       for fusion in ("fixed", "fixed_softmax", "anneal", "gate")},
}


def cases():
    """{case: (arch, options)}: every arch of the four families with its defaults, then VARIANTS."""
    archs = man_options.plugin_models()
    found = {arch: (arch, []) for family in FAMILIES for arch in archs[family]}
    return {**found, **VARIANTS}


def build(arch, options, tmp_dir):
    torch.manual_seed(1)
    criterion = CRITERION if "--calibration-layers" in options else []
    model, task, _ = build_fairseq_model(arch, TINY_MODEL + ["--dropout", "0", *options, *criterion],
                                         dict_size=20, tmp_dir=tmp_dir)
    return model.eval(), task


def digest(tensor) -> str:
    data = tensor.detach().cpu().contiguous()
    return hashlib.sha256(f"{data.dtype} {tuple(data.shape)} ".encode() + data.numpy().tobytes()).hexdigest()[:16]


def parameter_digests(model):
    return {name: digest(t) for name, t in model.state_dict().items()}


def output(model, task):
    d = task.source_dictionary
    src, prev = tokens(d, [7, 3, 5], left=True, seed=1), tokens(d, [4, 4, 2], left=False, seed=2)
    with torch.no_grad():
        return model(src, torch.tensor([7, 3, 5]), prev)[0]


@pytest.fixture(scope="module")
def recorded():
    return json.loads(FIXTURE.read_text())


def test_every_arch_of_the_families_is_recorded(recorded):
    assert sorted(recorded) == sorted(cases())


@pytest.mark.parametrize("case", sorted(cases()))
def test_the_arch_builds_the_recorded_parameters(tmp_path, recorded, case):
    model, _ = build(*cases()[case], tmp_path)
    now, want = parameter_digests(model), recorded[case]
    assert list(now) == list(want), f"{case}: parameter names or order changed"
    changed = [name for name in want if now[name] != want[name]]
    assert not changed, f"{case}: values changed: {changed}"


# (family arch, its options, the composed arch, what the composed arch needs beside them: its
# defaults differ, every mechanism off and the Transformer's sublayer orders)
SAME_MODEL = {
    "man": ("transformer_man_base", ["--encoder-sublayers", "dman,san,ffn", "--decoder-sublayers", "sman2,cross,ffn",
                                     "--man-norm", "pre"], "transformer_masked_base", []),
    "localness": ("transformer_localness_base", ["--localness-attention-types", "encoder_self,cross",
                                                 "--localness-layers", "0", "--localness-window", "head",
                                                 "--relative-positions"], "transformer_masked_base", []),
    "localness_small": ("transformer_localness_small", ["--localness-attention-types", "encoder_self",
                                                        "--localness-layers", "0,1"], "transformer_masked_small", []),
    "diffwin": ("transformer_diffwin_base", ["--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw"],
                "transformer_masked_base", []),
    "diffwin_mw": ("transformer_diffwin_base", ["--diffwin-preset", "none", "--diffwin-encoder", "mw",
                                                "--diffwin-cross", "mw", "--diffwin-layers", "1"],
                   "transformer_masked_base", []),
    "calibrated": ("transformer_calibrated_small", ["--calibration-fusion", "gate"],
                   "transformer_masked_small", ["--calibration-layers", "all"]),
}


@pytest.mark.parametrize("key", sorted(SAME_MODEL))
def test_a_family_arch_is_the_composed_arch_with_its_options(tmp_path, key):
    family_arch, options, composed_arch, composed_extra = SAME_MODEL[key]
    family, task = build(family_arch, options, tmp_path)
    composed, _ = build(composed_arch, options + composed_extra, tmp_path)
    ours, theirs = family.state_dict(), composed.state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert torch.equal(output(family, task), output(composed, task))


def test_a_composed_checkpoint_of_mans_layer_form_loads_on_the_transformer_order(tmp_path):
    """Before the presets, transformer_masked built the Transformer's sublayer order in MAN's layer
    form (``blocks.i`` / ``sublayer_norms.i``), as transformer_man builds it still: such a state dict
    loads into today's fairseq-form layers with strict=True (its keys renamed on load) and gives the
    same outputs."""
    orders = ["--encoder-sublayers", "san,ffn", "--decoder-sublayers", "san,cross,ffn", "--man-norm", "pre",
              "--attention-head-activation", "relu"]
    man_form, task = build("transformer_man_base", orders, tmp_path)
    assert any(".blocks.2.fc1." in name for name in man_form.state_dict())
    torch.manual_seed(2)  # other values than the MAN-form model's, so that the load has to set them all
    composed, _ = build_fairseq_model("transformer_masked_base", TINY_MODEL + ["--dropout", "0", *orders],
                                      dict_size=20, tmp_dir=tmp_path)[:2]
    composed.eval()
    assert not any(".blocks." in name for name in composed.state_dict())
    composed.load_state_dict(dict(man_form.state_dict()), strict=True)
    assert torch.equal(output(composed, task), output(man_form, task))


def record(tmp_dir, with_outputs=False):
    out = {}
    for case, (arch, options) in cases().items():
        model, task = build(arch, options, tmp_dir)
        out[case] = parameter_digests(model)
        if with_outputs:
            out[case] = {"parameters": out[case], "output": digest(output(model, task))}
    return out


if __name__ == "__main__" and sys.argv[1:2] in (["--write"], ["--outputs"]):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        if sys.argv[1] == "--write":
            FIXTURE.write_text(json.dumps(record(tmp), indent=1) + "\n")
            print(f"wrote {FIXTURE}")
        else:  # parameters and output digests of every case, to compare two versions of the code
            Path(sys.argv[2]).write_text(json.dumps(record(tmp, with_outputs=True), indent=1) + "\n")
            print(f"wrote {sys.argv[2]}")
