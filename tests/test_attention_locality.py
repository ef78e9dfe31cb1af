"""man-attention-locality (man_recipes.cli.attention_locality over man_recipes.analysis): the Table 5
locality measure of the MAN paper."""

import json
import re
import sys

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, build_fairseq_model, run_cli
from man_recipes.analysis.attention_locality import parse_windows
from man_recipes.analysis.locality import AttentionRecorder, LocalityStats, locality_shares, uniform_shares

WINDOWS = [0, 1, 2, 4]


def left_padding_mask(lengths, width):
    """(B, width) True at pads, real tokens at the right end (fairseq's source padding)."""
    return torch.stack([torch.arange(width) < width - n for n in lengths])


def naive_shares(probs, pad, windows):
    """Direct loops: share[b][h][t][wi] for real queries, counting positions from the first real token."""
    B, H, T, S = probs.shape
    out = {}
    for b in range(B):
        real = [s for s in range(S) if not pad[b, s]]
        first = real[0]
        for h in range(H):
            for t in real:
                total = sum(float(probs[b, h, t, s]) for s in real)
                for wi, w in enumerate(windows):
                    inside = sum(float(probs[b, h, t, s]) for s in real if abs((t - first) - (s - first)) <= w)
                    out[(b, h, t, wi)] = inside / total
    return out


def test_shares_match_naive_loops_with_left_padding():
    torch.manual_seed(0)
    lengths, width, heads = [7, 4, 1, 5], 7, 3
    pad = left_padding_mask(lengths, width)
    # random rows, with junk mass on pad keys that the measure must ignore, and rows not summing to 1
    probs = torch.rand(len(lengths), heads, width, width, dtype=torch.float64)
    shares = locality_shares(probs, pad, WINDOWS)
    naive = naive_shares(probs, pad, WINDOWS)
    for (b, h, t, wi), value in naive.items():
        assert shares[b, h, t, wi].item() == pytest.approx(value, abs=1e-12)
    assert shares[pad[:, None, :, None].expand_as(shares)].abs().max() == 0  # pad queries count 0

    stats = LocalityStats(len(WINDOWS))
    stats.add(shares[:2], pad[:2])
    stats.add(shares[2:], pad[2:])  # two batches accumulate
    sentence_mean, token_mean = stats.means()
    for wi in range(len(WINDOWS)):
        per_sentence = []
        tokens = []
        for b, n in enumerate(lengths):
            rows = [sum(naive[(b, h, t, wi)] for h in range(heads)) / heads for t in range(width - n, width)]
            per_sentence.append(sum(rows) / n)
            tokens += rows
        assert sentence_mean[wi] == pytest.approx(sum(per_sentence) / len(lengths), abs=1e-12)
        assert token_mean[wi] == pytest.approx(sum(tokens) / len(tokens), abs=1e-12)
    assert stats.sentences == 4 and stats.tokens == sum(lengths)


def test_left_and_right_padding_give_the_same_shares():
    torch.manual_seed(1)
    lengths, width = [5, 3], 5
    left = left_padding_mask(lengths, width)
    right = left.flip(-1)
    probs_left = torch.rand(2, 2, width, width, dtype=torch.float64)
    probs_right = torch.zeros_like(probs_left)
    for b, n in enumerate(lengths):  # move the real block from the right end to the left end
        probs_right[b, :, :n, :n] = probs_left[b, :, width - n:, width - n:]
    s_left = locality_shares(probs_left, left, WINDOWS)
    s_right = locality_shares(probs_right, right, WINDOWS)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(s_left[b, :, width - n:], s_right[b, :, :n])


def test_uniform_attention_has_exact_shares():
    lengths, width = [9, 6, 2, 1], 9
    pad = left_padding_mask(lengths, width)
    shares = uniform_shares(pad, WINDOWS)
    for b, n in enumerate(lengths):
        for t in range(n):
            for wi, w in enumerate(WINDOWS):
                keys_within = min(t + w, n - 1) - max(t - w, 0) + 1
                assert shares[b, 0, width - n + t, wi].item() == pytest.approx(keys_within / n, abs=1e-12)


def test_windows_option_is_validated():
    assert parse_windows("1,2,4") == [1, 2, 4]
    for bad in ("1,-2", "a", ""):
        with pytest.raises(ValueError, match="--windows"):
            parse_windows(bad)


def toy_source_batch(model, lengths, seed=0):
    """Left-padded source tokens (eos last) and their lengths."""
    g = torch.Generator().manual_seed(seed)
    d = model.encoder.dictionary
    width = max(lengths)
    tokens = torch.full((len(lengths), width), d.pad())
    for b, n in enumerate(lengths):
        tokens[b, width - n:-1] = torch.randint(d.nspecial, len(d), (n - 1,), generator=g)
        tokens[b, -1] = d.eos()
    return tokens, torch.tensor(lengths)


def run_recorded(model, tokens, lengths, windows):
    model.eval()
    recorder = AttentionRecorder(model, windows)
    recorder.keep_probs = True
    recorder.padding_mask = tokens.eq(model.encoder.dictionary.pad())
    with torch.no_grad():
        out = model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]
    recorder.remove()
    return recorder, out


def test_diagonal_dman_is_local_and_san_is_not(tmp_path):
    """A DMAN whose distance bias keeps only |t-s| <= 1 puts ~all attention there; SAN does not."""
    torch.manual_seed(0)
    model, _, _ = build_fairseq_model("transformer_man_small", TINY_MODEL + ["--dropout", "0.0"], tmp_dir=str(tmp_path))
    K = model.encoder.layers[0].blocks[0].bias_module.max_relative_distance
    for layer in model.encoder.layers:
        dman, san = layer.blocks[0], layer.blocks[1]
        bias = dman.bias_module
        with torch.no_grad():
            bias.query_weight.zero_()
            bias.head_bias.zero_()
            bias.distance_bias.fill_(-40.0)  # logsigmoid(-40) = -40: those keys get ~0 mass
            bias.distance_bias[K - 1:K + 2] = 40.0  # delta in {-1, 0, 1}: logsigmoid ~ 0
            san.q_proj.weight.copy_(dman.q_proj.weight)  # identical q/k weights: only the mask differs
            san.k_proj.weight.copy_(dman.k_proj.weight)
    tokens, lengths = toy_source_batch(model, [12, 9, 5])
    recorder, out = run_recorded(model, tokens, lengths, [1, 2, 4])
    assert sorted(recorder.stats) == [(0, "dman"), (0, "san"), (1, "dman"), (1, "san")]
    for layer in (0, 1):
        dman_share, _ = recorder.stats[(layer, "dman")].means()
        san_share, _ = recorder.stats[(layer, "san")].means()
        assert dman_share[0] > 0.999
        assert san_share[0] < 0.8 and san_share[0] < san_share[1] < san_share[2]
        assert recorder.stats[(layer, "dman")].sentences == 3

    # the hooks leave the model's output untouched
    with torch.no_grad():
        plain = model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]
    torch.testing.assert_close(out, plain)


def test_fairseq_transformer_gets_true_per_head_probabilities(tmp_path):
    """fairseq's MultiheadAttention: the recorded per-head weights equal softmax(q k^T / sqrt(d))."""
    torch.manual_seed(0)
    model, _, _ = build_fairseq_model("transformer", TINY_MODEL + ["--dropout", "0.0"], tmp_dir=str(tmp_path))
    model.eval()
    inputs = {}
    attn0 = model.encoder.layers[0].self_attn
    handle = attn0.register_forward_pre_hook(
        lambda m, a, kw: inputs.update(x=kw["query"], pad=kw["key_padding_mask"]), with_kwargs=True)
    tokens, lengths = toy_source_batch(model, [8, 6, 3], seed=2)
    recorder, _ = run_recorded(model, tokens, lengths, [1])
    handle.remove()
    assert [k for k in recorder.stats] == [(0, "san"), (1, "san")]
    probs = recorder.last_probs[(0, "san")]  # (B, H, T, S)
    H, D = attn0.num_heads, attn0.head_dim
    x = inputs["x"].double()  # (T, B, C)

    def heads(t, proj):
        w, b = proj.weight.double(), proj.bias.double()
        return (t @ w.t() + b).view(t.size(0), t.size(1), H, D).permute(1, 2, 0, 3)

    scores = heads(x, attn0.q_proj) @ heads(x, attn0.k_proj).transpose(-1, -2) / D ** 0.5
    scores = scores.masked_fill(inputs["pad"][:, None, None, :], float("-inf"))
    torch.testing.assert_close(probs.double(), scores.softmax(-1), rtol=1e-4, atol=1e-5)
    assert probs.size(1) == H


def test_cli_compares_man_and_transformer_checkpoints(toy_data_bin, tmp_path):
    checkpoints = []
    for arch in ("transformer_man_small", "transformer"):
        save = tmp_path / arch
        run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", arch,
                 "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, "--max-update", "5", "--save-dir", save])
        checkpoints.append(save / "checkpoint_last.pt")
    out = tmp_path / "locality"
    proc = run_cli([sys.executable, "-m", "man_recipes.cli.attention_locality", toy_data_bin,
                    "--path", ",".join(map(str, checkpoints)), "--gen-subset", "valid", "--windows", "1,2,4",
                    "--max-sentences", "25", "--batch-size", "8", "--labels", "MAN,Transformer", "--cpu",
                    "--output-dir", out])
    assert "4/4 batches" in proc.stdout  # progress: 25 sentences in batches of 8
    noise = [line for line in proc.stdout.splitlines() if re.search(r"DEBUG|matplotlib|PIL\.|fontTools", line)]
    assert not noise, noise[:5]  # the shared plotting setup keeps the plotting libraries quiet
    for name in ("locality.md", "locality.json", "locality.png"):
        assert (out / name).stat().st_size > 0
    md = (out / "locality.md").read_text()
    assert md in proc.stdout

    result = json.loads((out / "locality.json").read_text())
    assert result["windows"] == [1, 2, 4]
    assert [(m["label"], m["arch"]) for m in result["models"]] == [("MAN", "transformer_man_small"),
                                                                  ("Transformer", "transformer")]
    rows = {(r["model"], r["layer"], r["sublayer"]): r for r in result["rows"]}
    expected = {("MAN", layer, sub) for layer in (0, 1) for sub in ("dman", "san")}
    expected |= {("Transformer", layer, "san") for layer in (0, 1)}
    expected |= {("MAN", None, "uniform"), ("Transformer", None, "uniform")}
    assert set(rows) == expected
    for (model, layer, sublayer), r in rows.items():
        assert r["sentences"] == 25
        for shares in (r["share"], r["share_token_pooled"]):
            assert all(0.0 <= s <= 1.0 for s in shares)
            assert shares[0] < shares[1] < shares[2]
        row_md = f"| {model} | {'all' if layer is None else layer} | {sublayer} | " + \
            " | ".join(f"{s:.3f}" for s in r["share"]) + " | 25 |"
        assert row_md in md
    # both models see the same 25 sentences: identical chance levels
    assert rows[("MAN", None, "uniform")]["share"] == rows[("Transformer", None, "uniform")]["share"]


def test_static_window_keeps_all_mass_inside_its_window(tmp_path):
    """sman2 with b = 2 allows only |t-s| <= 2: share(w=2) = 1 exactly, share(w=1) < 1."""
    model, _, _ = build_fairseq_model(
        "transformer_man_small", TINY_MODEL + ["--encoder-sublayers", "sman2,ffn", "--static-mask-window", "2"],
        tmp_dir=str(tmp_path))
    tokens, lengths = toy_source_batch(model, [11, 8, 4], seed=3)
    recorder, _ = run_recorded(model, tokens, lengths, [1, 2])
    assert sorted(recorder.stats) == [(0, "sman2"), (1, "sman2")]
    for stats in recorder.stats.values():
        share, _ = stats.means()
        assert share[1] == pytest.approx(1.0, abs=1e-6)
        assert share[0] < 0.99


def test_a_checkpoint_and_data_folder_that_do_not_match_are_one_line(toy_data_bin, gigaword_like_bin, tmp_path):
    """The analyses load a checkpoint with its task reading DATA: no file, a folder without the
    checkpoint's dictionaries, or one with dictionaries of other sizes each say so in one line."""
    import shutil

    save = tmp_path / "t"
    run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer", "--source-lang", "src",
             "--target-lang", "tgt", "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, "--max-update", "1",
             "--save-dir", save])  # languages named, as the recipes name them: then they must be in DATA
    checkpoint = save / "checkpoint_last.pt"
    other = tmp_path / "other-dict"  # the toy data with one more word in each dictionary
    shutil.copytree(toy_data_bin, other)
    for side in ("src", "tgt"):
        with open(other / f"dict.{side}.txt", "a") as f:
            f.write("zzz-not-in-training 1\n")

    def locality(data, path, *extra):
        proc = run_cli([sys.executable, "-m", "man_recipes.cli.attention_locality", data, "--path", path,
                        "--gen-subset", "valid", "--max-sentences", "2", "--cpu", "--output-dir",
                        tmp_path / "out", *extra], check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    none = tmp_path / "none.pt"
    assert locality(toy_data_bin, none) == f"--path {none}: no such checkpoint file: {none}"
    assert locality(gigaword_like_bin, checkpoint) == (
        f"{gigaword_like_bin} has no dict.src.txt, which {checkpoint} needs: give the data folder it was trained on "
        "(or --source-lang / --target-lang)")
    assert locality(other, checkpoint).startswith(f"the dictionaries in {other} are not those {checkpoint} was "
                                                  "trained with (their sizes differ from its embeddings)")
    assert not (tmp_path / "out").exists()
    # man-localness-windows builds its task from its own arguments, then loads: the same lines
    proc = run_cli([sys.executable, "-m", "man_recipes.cli.localness_windows", other, "--path", checkpoint,
                    "--gen-subset", "valid", "--cpu", "--output-dir", tmp_path / "windows"], check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith(f"the dictionaries in {other} are not those")
    proc = run_cli([sys.executable, "-m", "man_recipes.cli.localness_windows", other, "--path",
                    f"{checkpoint}:{none}", "--gen-subset", "valid", "--cpu", "--output-dir", tmp_path / "windows"],
                   check=False)  # fairseq's a.pt:b.pt: each file is checked, the missing one named
    assert proc.returncode == 1 and proc.stdout.strip().splitlines()[-1] == (
        f"--path {checkpoint}:{none}: no such checkpoint file: {none}"), proc.stdout[-3000:]


@pytest.mark.parametrize("module, option, value, minimum", [
    ("attention_locality", "--max-sentences", "0", 1),
    ("attention_locality", "--batch-size", "-3", 1),
    ("attention_locality", "--max-tokens", "0", 1),
    ("attention_locality", "--log-interval", "0", 1),
    ("diffwin_windows", "--max-sentences", "0", 1),
    ("diffwin_windows", "--num-heatmaps", "-1", 0),
    ("export_calibration", "--kendall-sentences", "-1", 0),
    ("export_calibration", "--batch-size", "0", 1),
])
def test_a_count_option_below_its_minimum_is_refused_before_loading(module, option, value, minimum, tmp_path):
    """``--max-sentences 0`` wrote a table of zeros with exit status 0 and ``--log-interval 0`` was a
    traceback after loading: a count below its minimum is one line, before the checkpoint is read
    (the path does not exist: without the check the message would be the missing checkpoint's)."""
    import importlib

    cli = importlib.import_module(f"man_recipes.cli.{module}")
    argv = [str(tmp_path / "data"), "--path", str(tmp_path / "none.pt"), "--output-dir", str(tmp_path / "out"), "--cpu"]
    with pytest.raises(SystemExit) as refused:
        cli.cli_main([*argv, option, value])
    assert str(refused.value) == f"{option} {value}: expected an integer >= {minimum}"
    with pytest.raises(SystemExit) as at_minimum:  # the minimum itself passes the check
        cli.cli_main([*argv, option, str(minimum)])
    assert "expected an integer" not in str(at_minimum.value)
    assert not (tmp_path / "out").exists()
