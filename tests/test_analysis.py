"""The analysis commands (man-analyze calibration / diffwin / localness) on tiny trained
checkpoints through the real CLI, each number checked against a naive recomputation here."""

import json
import math
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, run_cli
from man_recipes.analysis.utils import kendall_tau_b
from man_recipes.analysis.diffwin_windows import expected_abs_difference

ANALYZE = [sys.executable, "-m", "man_recipes.cli.analyze"]
NOISE = re.compile(r"DEBUG|matplotlib|PIL\.|fontTools")

MODELS = {
    "calibrated": ["--arch", "transformer_calibrated_small", "--criterion",
                   "calibrated_label_smoothed_cross_entropy", "--perturbation-weight", "0.5"],
    "diffwin": ["--arch", "transformer_diffwin_small", "--diffwin-layers", "2", "--diffwin-segment-size", "3"],
    "localness": ["--arch", "transformer_localness_small", "--localness-window", "head",
                  "--localness-layers", "0,1", "--localness-head-window-max", "20"],
    "transformer": ["--arch", "transformer"],  # fairseq's own attention: the baseline of the comparison
}


def run_parallel(commands):
    with ThreadPoolExecutor(len(commands)) as pool:
        return [f.result() for f in [pool.submit(run_cli, c, env={"OMP_NUM_THREADS": "1"}) for c in commands]]


@pytest.fixture(scope="session")
def trained(tmp_path_factory, toy_data_bin):
    root = tmp_path_factory.mktemp("analysis_ckpt")
    # TINY_TRAIN's criterion comes first: the calibrated one given later wins (argparse)
    run_parallel([["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, *TINY_MODEL, *TINY_TRAIN, *extra,
                   "--max-update", "16", "--disable-validation", "--save-dir", root / name]
                  for name, extra in MODELS.items()])
    return {name: root / name / "checkpoint_last.pt" for name in MODELS}


def load(path, data):
    from man_recipes.analysis.utils import load_checkpoint

    return load_checkpoint(str(path), str(data))


def single_sentences(task, split):
    """Every sentence of ``split`` as its own batch of one (no padding)."""
    task.load_dataset(split)
    dataset = task.dataset(split)
    for i in range(len(dataset)):
        yield dataset.collater([dataset[i]])


def assert_quiet(proc):
    noisy = [line for line in proc.stdout.splitlines() if NOISE.search(line)]
    assert not noisy, noisy[:5]


# ------------------------------------------------------------------------------ unit checks

def test_kendall_tau_b_matches_scipy_with_ties_and_padding():
    from scipy.stats import kendalltau

    gen = torch.Generator().manual_seed(0)
    n, width = 30, 9
    x = torch.randint(0, 4, (n, width), generator=gen).double()  # many ties
    y = torch.randn(n, width, generator=gen, dtype=torch.float64)
    y[::3, :4] = 0.5  # ties in y too
    lengths = torch.randint(0, width + 1, (n,), generator=gen)
    valid = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # left padding
    tau = kendall_tau_b(x, y, valid)
    for i in range(n):
        keep = valid[i]
        if keep.sum() < 2 or x[i, keep].unique().numel() < 2 or y[i, keep].unique().numel() < 2:
            assert math.isnan(tau[i])
            continue
        assert float(tau[i]) == pytest.approx(kendalltau(x[i, keep], y[i, keep]).statistic, abs=1e-12)
    # a hand-computed case: (1,2,3) vs (1,3,2): pairs 12 C, 13 C, 23 D -> (2-1)/3
    assert float(kendall_tau_b(torch.tensor([[1.0, 2, 3]]), torch.tensor([[1.0, 3, 2]]),
                               torch.ones(1, 3, dtype=torch.bool))) == pytest.approx(1 / 3)


def test_expected_width_matches_double_loop():
    gen = torch.Generator().manual_seed(1)
    phi_l = torch.rand(4, 7, generator=gen, dtype=torch.float64).softmax(-1)
    phi_r = torch.rand(4, 7, generator=gen, dtype=torch.float64).softmax(-1)
    got = expected_abs_difference(phi_l, phi_r)
    for q in range(4):
        naive = sum(phi_l[q, i] * phi_r[q, j] * abs(i - j) for i in range(7) for j in range(7))
        assert float(got[q]) == pytest.approx(float(naive), abs=1e-12)


def test_man_analyze_lists_and_rejects_subcommands(capsys):
    from man_recipes.cli.analyze import cli_main

    cli_main([])
    out = capsys.readouterr().out
    assert all(name in out for name in ("locality", "localness", "calibration", "diffwin"))
    with pytest.raises(SystemExit, match="unknown subcommand 'attention'"):
        cli_main(["attention"])


# ------------------------------------------------------------------------------ real CLIs

def naive_jsd_entropy(a, c):
    """JSD (bits) and entropies of two distributions given as python lists."""
    def h(p):
        return -sum(x * math.log2(x) for x in p if x > 0)

    def kl(p, q):
        return sum(x * math.log2(x / y) for x, y in zip(p, q) if x > 0)

    mid = [(x + y) / 2 for x, y in zip(a, c)]
    return 0.5 * kl(a, mid) + 0.5 * kl(c, mid), h(a), h(c)


def test_calibration_cli_against_naive_recomputation(trained, toy_data_bin, tmp_path):
    from scipy.stats import kendalltau

    from man_fairseq.modules.calibration import CALIBRATED, calibration_mode

    out = tmp_path / "calib"
    proc = run_cli([*ANALYZE, "calibration", toy_data_bin, "--path", f"{trained['calibrated']},{trained['transformer']}",
                    "--labels", "ACN,Transformer", "--gen-subset", "test", "--batch-size", "6", "--num-heatmaps", "2",
                    "--kendall-sentences", "8", "--log-interval", "1", "--cpu", "--output-dir", out])
    assert_quiet(proc)
    assert "4/4 batches, 20 sentences" in proc.stdout  # progress
    for name in ("calibration_stats.md", "calibration_stats.json", "calibration_stats.png", "jsd_by_entropy.png",
                 "kendall_tau.png", "ACN/masks.pt"):
        assert (out / name).stat().st_size > 0, name
    assert len(list((out / "ACN" / "heatmaps").glob("*.png"))) == 2
    assert not list((out / "Transformer").glob("*.pt"))  # masks only for calibrated models
    result = json.loads((out / "calibration_stats.json").read_text())
    acn, loc = result["models"]
    assert (acn["label"], acn["calibrated"], loc["label"], loc["calibrated"]) == ("ACN", True, "Transformer", False)
    md = (out / "calibration_stats.md").read_text()
    assert md.strip() in proc.stdout

    # naive: one sentence at a time, float64 python loops
    sums = [dict(jsd=0.0, h_a=0.0, h_c=0.0, m=0.0) for _ in range(2)]
    bins = [[[0.0, 0] for _ in range(40)] for _ in range(2)]
    taus = {(m, s): [[0.0, 0] for _ in range(2)] for m, s in
            [("ACN", "attention"), ("ACN", "calibrated"), ("ACN", "mask"), ("Transformer", "attention")]}
    rows = 0
    for label, path in (("ACN", trained["calibrated"]), ("Transformer", trained["transformer"])):
        model, _, task = load(path, toy_data_bin)
        for i, sample in enumerate(single_sentences(task, "test")):
            src = sample["net_input"]["src_tokens"]
            prev = sample["net_input"]["prev_output_tokens"]
            target = sample["target"][0].tolist()
            emb = model.encoder.embed_tokens(src).detach().requires_grad_()
            with calibration_mode(model, CALIBRATED) as cm:
                enc = model.encoder(src, src_lengths=sample["net_input"]["src_lengths"], token_embeddings=emb)
                dec = model.decoder(prev, encoder_out=enc)
            lprobs = model.get_normalized_probs(dec, log_probs=True)[0]
            if label == "ACN":
                for layer, c in enumerate(cm.captured):
                    a, fused, m = c["attn"][0].double(), c["calibrated"][0].double(), c["m"][0].double()
                    for h in range(a.size(0)):
                        for t in range(a.size(1)):
                            fused_row = (fused[h, t] / fused[h, t].sum()).tolist()
                            jsd, h_a, h_c = naive_jsd_entropy(a[h, t].tolist(), fused_row)
                            sums[layer]["jsd"] += jsd
                            sums[layer]["h_a"] += h_a
                            sums[layer]["h_c"] += h_c
                            sums[layer]["m"] += float(m[h, t].mean())
                            b = min(int(h_a / 0.4), 39)
                            bins[layer][b][0] += jsd
                            bins[layer][b][1] += 1
                            rows += layer == 0
            if i >= 8:
                continue
            weights = {}
            for layer in range(2):
                if label == "ACN":
                    c = cm.captured[layer]
                    weights[("attention", layer)] = c["attn"][0].mean(0)
                    weights[("mask", layer)] = c["m"][0].mean(0)
                # fairseq's own head-averaged weights of one layer: the fused ones for ACN
                with torch.no_grad():
                    _, extra = model.decoder(prev, encoder_out=enc, alignment_layer=layer)
                weights[("calibrated" if label == "ACN" else "attention", layer)] = extra["attn"][0][0]
            for t, y in enumerate(target):
                (grad,) = torch.autograd.grad(lprobs[t, y], emb, retain_graph=True)
                importance = (grad[0].double() * emb[0].detach().double()).sum(-1).abs()
                for (series, layer), w in weights.items():
                    tau = kendalltau(w[t].detach().double().numpy(), importance.numpy()).statistic
                    if not math.isnan(tau):
                        taus[(label, series)][layer][0] += tau
                        taus[(label, series)][layer][1] += 1

    assert acn["rows_per_layer"] == rows
    for layer, s in enumerate(sums):
        got = acn["layers"][layer]
        assert got["layer"] == layer + 1
        assert got["jsd"] == pytest.approx(s["jsd"] / rows, rel=1e-5)
        assert got["entropy_original"] == pytest.approx(s["h_a"] / rows, rel=1e-5)
        assert got["entropy_calibrated"] == pytest.approx(s["h_c"] / rows, rel=1e-5)
        assert got["entropy_change"] == pytest.approx((s["h_c"] - s["h_a"]) / rows, rel=1e-4, abs=1e-7)
        assert got["mask_mean"] == pytest.approx(s["m"] / rows, rel=1e-5)
        binned = acn["jsd_bins"]["by_entropy"]
        for b, (total, count) in enumerate(bins[layer][:len(binned["bin_low"])]):
            assert binned["rows"][layer][b] == count
            if count:
                assert binned["mean_jsd"][layer][b] == pytest.approx(total / count, rel=1e-5)
    mean_change = sum(x["entropy_change"] for x in acn["layers"]) / 2
    assert acn["entropy_change_all"] == pytest.approx(mean_change)
    sign = "+" if mean_change >= 0 else "-"
    assert f"| All | {sign} {abs(mean_change):.4f} |" in md  # the Table 5 layout

    for (label, series), per_layer in taus.items():
        got = (acn if label == "ACN" else loc)["kendall"][series]
        for layer, (total, count) in enumerate(per_layer):
            assert got["target_tokens"][layer] == count
            # batches of 6 (padded) vs single sentences: float32 rounding may flip a near-tie
            assert got["tau"][layer] == pytest.approx(total / count, abs=2e-3), (label, series, layer)


def test_diffwin_cli_windows_equal_the_model_tensors(trained, toy_data_bin, toy_raw, tmp_path):
    out = tmp_path / "diffwin"
    proc = run_cli([*ANALYZE, "diffwin", toy_data_bin, "--path", trained["diffwin"], "--gen-subset", "test",
                    "--num-heatmaps", "1", "--cpu", "--output-dir", out])
    assert_quiet(proc)
    for kind in ("encoder_self", "decoder_self", "cross"):
        assert (out / "heatmaps" / f"0_{kind}.png").stat().st_size > 0
    assert (out / "widths.png").stat().st_size > 0
    lines = [line.split("\t") for line in (out / "windows.tsv").read_text().splitlines()]
    assert lines[0] == ["sample_id", "attention", "layer", "query_position", "expected_left", "expected_right",
                        "expected_width", "mask_sum", "mask_at_query"]
    tsv = {(int(r[0]), r[1], int(r[2]), int(r[3])): [float(x) for x in r[4:]] for r in lines[1:]}
    summary = {(x["attention"], x["layer"]): x for x in json.loads((out / "windows.json").read_text())["layers"]}

    from man_recipes.analysis.diffwin_windows import window_modules

    model, _, task = load(trained["diffwin"], toy_data_bin)
    modules = window_modules(model)
    assert [(k, layer) for k, layer, _ in modules] == [(k, layer) for k in ("encoder_self", "decoder_self", "cross")
                                                         for layer in (0, 1)]
    for _, _, module in modules:
        module.record = True
    widths = {key: [] for key in summary}
    for sample in single_sentences(task, "test"):
        sid = int(sample["id"][0])
        with torch.no_grad():
            model(**sample["net_input"])
        for kind, layer, module in modules:
            rec = module.last_window
            phi_l, phi_r, mask = (rec[k][0].double() for k in ("phi_left", "phi_right", "mask"))
            for t in range(phi_l.size(0)):
                keys = range(phi_l.size(1))
                naive = [sum(j * phi_l[t, j] for j in keys), sum(j * phi_r[t, j] for j in keys),
                         1 + sum(phi_l[t, i] * phi_r[t, j] * abs(i - j) for i in keys for j in keys),
                         sum(mask[t, j] for j in keys), mask[t, t] if kind != "cross" else float("nan")]
                assert tsv[(sid, kind, layer, t)] == pytest.approx([float(x) for x in naive], abs=2e-4, nan_ok=True)
                widths[(kind, layer)].append(float(naive[2]))
    assert len(tsv) == sum(len(v) for v in widths.values())
    for key, values in widths.items():
        assert summary[key]["queries"] == len(values)
        assert summary[key]["mean_width"] == pytest.approx(sum(values) / len(values), abs=1e-4)

    # raw sentence pairs instead of a split: the first two test pairs give the same rows
    pairs = tmp_path / "pairs.txt"
    src = (toy_raw / "test.src").read_text().splitlines()[:2]
    tgt = (toy_raw / "test.tgt").read_text().splitlines()[:2]
    pairs.write_text("".join(f"{s} ||| {t}\n" for s, t in zip(src, tgt)))
    run_cli([*ANALYZE, "diffwin", toy_data_bin, "--path", trained["diffwin"], "--input-pairs", pairs,
             "--num-heatmaps", "0", "--cpu", "--output-dir", tmp_path / "pairs"])
    rows = [line.split("\t") for line in (tmp_path / "pairs" / "windows.tsv").read_text().splitlines()[1:]]
    assert {int(r[0]) for r in rows} == {0, 1}
    for r in rows:
        assert [float(x) for x in r[4:]] == pytest.approx(tsv[(int(r[0]), r[1], int(r[2]), int(r[3]))], abs=2e-4,
                                                         nan_ok=True)


def test_localness_cli_head_windows_equal_the_learned_scalars(trained, toy_data_bin, tmp_path):
    out = tmp_path / "localness"
    proc = run_cli([*ANALYZE, "localness", toy_data_bin, "--user-dir", USER_DIR, "--path", trained["localness"],
                    "--gen-subset", "valid", "--batch-size", "16", "--cpu", "--windows-output-dir", out])
    assert_quiet(proc)
    assert "3/3 batches, 40 sentences" in proc.stdout
    for name in ("windows.tsv", "windows.md", "heads.md", "windows_encoder_self.png", "heads_encoder_self.png"):
        assert (out / name).stat().st_size > 0
    state = torch.load(trained["localness"], map_location="cpu", weights_only=False)["model"]
    md = (out / "heads.md").read_text()
    rows = [line.split("\t") for line in (out / "windows.tsv").read_text().splitlines()[1:]]
    for layer in (0, 1):
        z = state[f"encoder.layers.{layer}.self_attn.bias_module.head_window_logits"].double()
        learned = (20 * torch.sigmoid(z)).tolist()  # D^m = N sigmoid(z^m), N = 20
        for head, d in enumerate(learned):
            seen = {float(r[7]) for r in rows if (r[1], int(r[2]), int(r[3])) == ("encoder_self", layer, head)}
            assert seen and all(abs(x - d) < 1e-4 for x in seen)
        assert f"| encoder_self | {layer} | " + " | ".join(f"{d:.2f}" for d in learned) + " |" in md


def test_the_one_module_finder_reads_wrapped_names_and_refuses_a_stray_module():
    """Both window commands find their modules with analysis.utils.attention_modules: a checkpoint of an
    FSDP or activation-checkpointed run names them with wrapper parts, which the finder drops."""
    from man_recipes.analysis.utils import attention_modules

    class Marker(torch.nn.Module):
        pass

    model = torch.nn.Module()
    model.add_module("decoder", torch.nn.Module())
    layers = torch.nn.ModuleList()
    model.decoder.add_module("_fsdp_wrapped_module", torch.nn.Module())
    model.decoder._fsdp_wrapped_module.add_module("layers", layers)
    for _ in range(2):
        layer = torch.nn.Module()
        layer.add_module("_checkpoint_wrapped_module", torch.nn.Module())
        for attention in ("self_attn", "encoder_attn"):
            holder = torch.nn.Module()
            holder.add_module("bias_module", Marker())
            layer._checkpoint_wrapped_module.add_module(attention, holder)
        layers.append(layer)
    found = attention_modules(model, Marker, "marker")
    assert [(kind, layer) for kind, layer, _ in found] == [("decoder_self", 0), ("cross", 0), ("decoder_self", 1),
                                                           ("cross", 1)]
    model.add_module("stray", Marker())
    with pytest.raises(RuntimeError, match="unexpected marker module location stray"):
        attention_modules(model, Marker, "marker")
