"""``scripts/speed.sh profile`` (lab/speed/profile.py): one update per family under torch.profiler. The
``core`` baseline must be fairseq's Transformer with the plugin's attention core and no bias; a short
CPU run writes every family's row and table; bad input gets one line and replaces nothing."""

import subprocess
import sys

from conftest import REPO
from fairseq.modules import MultiheadAttention
from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from lab.speed import profile as pu
from lab.speed.model import build, config_argv


def attentions(model):
    return [m for m in model.modules() if isinstance(m, (MultiheadAttention, BiasedMultiheadAttention))]


def test_core_is_the_transformer_with_the_plugins_core_and_no_bias(gigaword_like_bin):
    models = {}
    for fam in ("transformer", pu.CORE, "localness"):
        cfg, extra = pu.family_config("gigaword-cpu", fam)
        models[fam] = build(config_argv(cfg, str(gigaword_like_bin), extra))[1]
    core, transformer, localness = models[pu.CORE], models["transformer"], models["localness"]
    assert all(type(m) is BiasedMultiheadAttention and m.bias_module is None and m.post_softmax is None
               for m in attentions(core))
    assert all(type(m) is MultiheadAttention for m in attentions(transformer))
    assert len(attentions(core)) == len(attentions(transformer))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(core) == count(transformer) < count(localness)  # the study's localness has a bias


def test_man_nobias_is_man_with_its_dman_sublayer_a_plain_self_attention(gigaword_like_bin):
    from man_fairseq.modules.mask_bias import DynamicMaskBias

    models = {}
    for fam in ("man", "man-nobias"):
        cfg, extra = pu.family_config("gigaword-cpu", fam)
        models[fam] = build(config_argv(cfg, str(gigaword_like_bin), extra))[1]
    man, nobias = models["man"], models["man-nobias"]
    dman = [m for m in man.modules() if isinstance(m, DynamicMaskBias)]
    assert dman and not any(isinstance(m, DynamicMaskBias) for m in nobias.modules())
    assert len(attentions(nobias)) == len(attentions(man))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(man) - count(nobias) == sum(count(m) for m in dman)


def run(*args):
    return subprocess.run([sys.executable, "-m", "lab.speed", "profile", *map(str, args)],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)


def test_a_short_cpu_run_writes_every_family_and_keeps_its_file(gigaword_like_bin, tmp_path):
    out = tmp_path / "profile.md"
    args = ["gigaword-cpu", "--families", "transformer,core,man", "--batches", "1", "--warmup", "0",
            "--data", gigaword_like_bin, "--output", out]
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text()
    for fam in ("transformer", "core", "man"):
        assert f"\n| {fam} | " in text and f"\n## {fam}\n" in text
    assert "aten::" in text and "| transformer | " in text and "1.00×" in text

    again = run(*args)
    assert again.returncode == 2 and "exists; it is not replaced" in again.stderr.strip().splitlines()[-1]
    assert out.read_text() == text


def test_bad_options_get_one_line(gigaword_like_bin, tmp_path):
    out = tmp_path / "p.md"
    for args, message in (
        (["--families", "transformer,nosuch"], "has no config nosuch.yaml"),
        (["--precision", "bf16"], "the CPU profiles fp32 only"),
        (["--cudnn-attention", "off"], "--cudnn-attention: a CUDA option"),
        (["--data", tmp_path], "holds no binarized data"),
        # more updates than an epoch's batches: StopIteration's traceback before
        (["--families", "transformer", "--batches", "1000000"], "--warmup 2 + --batches 1000000 updates: "),
        (["--families", "transformer", "--warmup", "1000000"], "--warmup 1000000 + --batches 3 updates: "),
    ):
        full = ["gigaword-cpu", "--data", gigaword_like_bin, "--output", out, *args]
        proc = run(*full)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
        assert not out.exists()
