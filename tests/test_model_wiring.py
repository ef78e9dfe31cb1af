"""The model wiring stays what it was: every registered arch resolves to the same arguments, and a
tiny model of every family has the same parameters and the same attention modules (bias module,
post-softmax transform, kernel backend) in the same places.

``tests/model_wiring.json`` was written by the code before the family template
(``python tests/test_model_wiring.py --write``); regenerate it only for a change that is meant to
change the models, and say so in the commit.
"""

import argparse
import hashlib
import json
import sys
from enum import Enum
from pathlib import Path

import pytest
from conftest import TINY_MODEL, USER_DIR, build_fairseq_model

import man_fairseq  # noqa: F401  (registers the archs)
from man_recipes.cli import options as man_options
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention

SNAPSHOT = Path(__file__).resolve().parent / "model_wiring.json"

# extra options per family, parsed with every arch of the family (presets, per-arch defaults)
ARCH_EXTRAS = {
    "transformer_man": [[], ["--decoder-sublayers", "dman,san,cross,ffn", "--dropout", "0.2"]],
    "transformer_localness": [[], ["--localness-layers", "all", "--relative-positions"]],
    "transformer_diffwin": [[], ["--diffwin-preset", "cr_aw_seg", "--diffwin-cross", "mw"],
                            ["--diffwin-preset", "none", "--diffwin-encoder", "aw", "--diffwin-layers", "6"]],
    "transformer_calibrated": [[], ["--calibration-fusion", "gate"]],
    "transformer_masked": [[], ["--encoder-sublayers", "dman,san,ffn", "--localness-attention-types", "encoder_self",
                                "--diffwin-preset", "cr_aw_seg", "--calibration-layers", "all"]],
}

# tiny models: (arch, options); TINY_MODEL has 2 encoder and 2 decoder layers
TINY_BUILDS = {
    "man_default": ("transformer_man_base", []),
    "man_small_default": ("transformer_man_small", []),
    "man_sman": ("transformer_man_base", ["--encoder-sublayers", "sman1,sman2,ffn",
                                          "--decoder-sublayers", "sman1,sman2,cross,ffn",
                                          "--attention-head-activation", "relu"]),
    "localness_default": ("transformer_localness_base", []),
    "localness_types": ("transformer_localness_base", [
        "--localness-layers", "1", "--localness-attention-types", "encoder_self,decoder_self,cross",
        "--localness-window", "head"]),
    "localness_relpos_only": ("transformer_localness_base", ["--localness-layers", "", "--relative-positions"]),
    "localness_relpos": ("transformer_localness_base", [
        "--localness-layers", "all", "--localness-attention-types", "encoder_self,decoder_self",
        "--relative-positions", "--relative-position-attention-types", "decoder_self"]),
    "diffwin_default": ("transformer_diffwin_base", []),
    "diffwin_one_layer": ("transformer_diffwin_base", ["--diffwin-preset", "enc_aw-dec_mw", "--diffwin-layers", "1"]),
    "diffwin_segment": ("transformer_diffwin_base", [
        "--diffwin-preset", "none", "--diffwin-encoder", "mw", "--diffwin-encoder-mask", "segment",
        "--diffwin-cross", "aw", "--diffwin-layers", "2"]),
    "diffwin_none": ("transformer_diffwin_base", ["--diffwin-preset", "none"]),
    "calibrated_default": ("transformer_calibrated_base", []),
    "calibrated_gate": ("transformer_calibrated_base", ["--calibration-fusion", "gate"]),
    "backend_flex": ("transformer_localness_base", ["--attention-backend", "flex"]),
    "backend_sdpa_man": ("transformer_man_base", ["--attention-backend", "sdpa"]),
    # the composed arch (issue 78; added after the family template, the entries above unchanged)
    "masked_default": ("transformer_masked_base", []),
    "masked_man_calibration": ("transformer_masked_base", [
        "--encoder-sublayers", "dman,san,ffn", "--calibration-layers", "all",
        "--criterion", "calibrated_label_smoothed_cross_entropy"]),
    "masked_every_mechanism": ("transformer_masked_base", [
        "--encoder-sublayers", "dman,san,ffn", "--decoder-sublayers", "sman2,cross,ffn",
        "--localness-attention-types", "encoder_self,decoder_self,cross", "--relative-positions",
        "--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw", "--mechanism-sublayers", "san,sman2",
        "--calibration-layers", "1", "--calibration-fusion", "gate",
        "--criterion", "calibrated_label_smoothed_cross_entropy"]),
}


def plain(value):
    """A JSON value for an argument (choice enums as their string)."""
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def model_dests(model_cls):
    """Every option the model's argparse knows (fairseq's transformer's and the plugin's)."""
    parser = argparse.ArgumentParser(add_help=False)
    model_cls.add_args(parser)
    return {a.dest for a in parser._actions if a.dest != "help"}


def parse(tmp_dir, arch, extra):
    from fairseq import options
    from fairseq.data import Dictionary

    d = Dictionary()
    d.save(str(Path(tmp_dir) / "dict.src.txt"))
    d.save(str(Path(tmp_dir) / "dict.tgt.txt"))
    argv = [str(tmp_dir), "--user-dir", USER_DIR, "--task", "translation", "-s", "src", "-t", "tgt",
            "--arch", arch, *extra]
    return options.parse_args_and_arch(options.get_training_parser(), argv)


def arch_snapshot(tmp_dir):
    """{arch: {"empty": args of the arch function on an empty Namespace, "parsed <extra>": the model
    options after fairseq-train's parsing that differ from "empty"}} for every arch of the plugin."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, MODEL_REGISTRY

    out = {}
    for family, archs in man_options.plugin_models().items():
        dests = model_dests(MODEL_REGISTRY[family])
        for arch in archs:
            empty = argparse.Namespace()
            ARCH_CONFIG_REGISTRY[arch](empty)
            entry = {"family": family, "empty": json.loads(json.dumps(plain(vars(empty))))}
            for extra in ARCH_EXTRAS[family]:
                args = json.loads(json.dumps(plain(vars(parse(tmp_dir, arch, extra)))))
                # only what differs from the empty command line, to keep the record short
                entry["parsed " + " ".join(extra)] = {
                    k: args.get(k) for k in sorted(dests | set(entry["empty"]))
                    if args.get(k) != entry["empty"].get(k, "<absent>")}
            out[arch] = entry
    return out


def attention_layout(model):
    rows = {}
    for name, module in model.named_modules():
        if isinstance(module, BiasedMultiheadAttention):
            rows[name] = [
                type(module).__name__,
                type(module.bias_module).__name__ if module.bias_module is not None else None,
                type(module.post_softmax).__name__ if module.post_softmax is not None else None,
                module.attention_backend,
                bool(module.causal_attn_mask),
                repr(module.bias_module) if module.bias_module is not None else None,
                repr(module.post_softmax) if module.post_softmax is not None else None,
            ]
    return rows


def parameter_digest(model):
    """Count and sha256 of the state dict's (name, shape) lines, in order (the full list would
    make the record ten times longer; rerun --write on the old code to see the lines)."""
    lines = "\n".join(f"{n} {tuple(p.shape)}" for n, p in model.state_dict().items())
    return [len(model.state_dict()), hashlib.sha256(lines.encode()).hexdigest()]


def build_record(arch, extra, tmp_dir):
    """Parameters (names, shapes, order), attention modules and model options after the build."""
    model, _, args = build_fairseq_model(arch, TINY_MODEL + extra, dict_size=20, tmp_dir=tmp_dir)
    dests = model_dests(type(model))
    return json.loads(json.dumps({
        "parameters": parameter_digest(model),
        "attentions": attention_layout(model),
        "args": {k: plain(getattr(args, k)) for k in sorted(dests) if k in vars(args)},
    }))


def build_snapshot(tmp_dir):
    return {key: build_record(arch, extra, tmp_dir) for key, (arch, extra) in TINY_BUILDS.items()}


def snapshot(tmp_dir):
    return json.loads(json.dumps({"archs": arch_snapshot(tmp_dir), "builds": build_snapshot(tmp_dir)}))


@pytest.fixture(scope="module")
def recorded():
    return json.loads(SNAPSHOT.read_text())


def test_every_arch_resolves_to_the_recorded_arguments(tmp_path, recorded):
    now = arch_snapshot(tmp_path)
    now = json.loads(json.dumps(now))
    assert sorted(now) == sorted(recorded["archs"]), "registered archs changed"
    for arch, entry in recorded["archs"].items():
        for case, args in entry.items():
            if case == "family":
                assert now[arch][case] == args
                continue
            diff = {k: (args.get(k), now[arch][case].get(k)) for k in set(args) | set(now[arch][case])
                    if args.get(k, "<absent>") != now[arch][case].get(k, "<absent>")}
            assert not diff, f"{arch} [{case}]: (recorded, now) {diff}"


@pytest.mark.parametrize("key", list(TINY_BUILDS))
def test_tiny_models_have_the_recorded_parameters_and_attentions(tmp_path, recorded, key):
    arch, extra = TINY_BUILDS[key]
    now, want = build_record(arch, extra, tmp_path), recorded["builds"][key]
    assert now["parameters"] == want["parameters"]
    assert now["attentions"] == want["attentions"]
    assert now["args"] == want["args"]


# Checkpoints store the model options as an argparse Namespace ("args", or cfg.model of a --user-dir
# model). Args saved before the family template: no --attention-backend (older than the option),
# layer options in the one form each has always had (--localness-layers a list, --diffwin-layers a
# count), a layer list cut to the depth when the model was built.
OLD_ARGS = {
    "localness": ("transformer_localness_base", ["--localness-layers", "0,1", "--localness-attention-types",
                                                 "encoder_self,cross", "--relative-positions"]),
    "localness_cut_default": ("transformer_localness_base", []),
    "diffwin": ("transformer_diffwin_base", ["--diffwin-layers", "1"]),
    "diffwin_cut_default": ("transformer_diffwin_base", []),
    "man": ("transformer_man_small", []),
    "calibrated": ("transformer_calibrated_base", ["--calibration-fusion", "gate"]),
}


@pytest.mark.parametrize("key", list(OLD_ARGS))
def test_args_saved_in_the_old_form_load_and_give_the_same_outputs(tmp_path, key):
    import copy

    import torch
    from model_families import tokens

    arch, extra = OLD_ARGS[key]
    model, task, args = build_fairseq_model(arch, TINY_MODEL + ["--dropout", "0"] + extra, dict_size=20,
                                            tmp_dir=tmp_path)
    saved = copy.deepcopy(args)
    del saved.attention_backend
    torch.save({"args": saved, "model": model.state_dict()}, tmp_path / "old.pt")
    state = torch.load(tmp_path / "old.pt", weights_only=True)  # the plugin's safe-loading allow-list
    loaded = task.build_model(state["args"])
    loaded.load_state_dict(state["model"], strict=True)
    assert attention_layout(loaded) == attention_layout(model)
    d = task.source_dictionary
    src, prev = tokens(d, [7, 3, 5], left=True, seed=1), tokens(d, [4, 4, 2], left=False, seed=2)
    model.eval(), loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, torch.tensor([7, 3, 5]), prev)[0],
                                   model(src, torch.tensor([7, 3, 5]), prev)[0], rtol=0, atol=0)


def test_an_empty_decoder_sublayers_is_refused_by_every_man_arch():
    """A size's own value of a plugin option fills it where unset (absent or None), like the
    option's default; transformer_man_small used to replace an empty --decoder-sublayers (what a
    hydra YAML can hold) by its default silently."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from man_fairseq.models.transformer_man import MANConfig
    from man_fairseq.plugin_options import PluginOptionError, check_options

    for arch in ("transformer_man_small", "transformer_man_base"):
        args = argparse.Namespace(decoder_sublayers="")
        ARCH_CONFIG_REGISTRY[arch](args)
        assert args.decoder_sublayers == ""
        with pytest.raises(PluginOptionError, match="--decoder-sublayers '': --decoder-sublayers is empty"):
            check_options(args, MANConfig)
        unset = argparse.Namespace(decoder_sublayers=None)
        ARCH_CONFIG_REGISTRY[arch](unset)
        assert unset.decoder_sublayers == ("san,cross,ffn" if arch.endswith("small") else "dman,san,cross,ffn")


def test_attentions_are_built_with_the_backend_of_the_plan():
    from man_fairseq.models.biased_transformer import ComposedPlan
    from man_fairseq.models.transformer_localness import TransformerLocalnessModel

    with pytest.raises(RuntimeError, match="through build_model"):
        TransformerLocalnessModel.plan_in_build()
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        BiasedMultiheadAttention(8, 2, self_attention=True, attention_backend="fast")
    assert BiasedMultiheadAttention(8, 2, self_attention=True, attention_backend="flex").attention_backend == "flex"
    assert ComposedPlan("sdpa").entries("cross", 0) == ()


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        SNAPSHOT.write_text(json.dumps(snapshot(tmp), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
