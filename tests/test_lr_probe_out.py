"""python -m lab.lr_probe --out / --png: a user's files are never replaced without --overwrite, checked
before anything is binarized or trained; a probe's own folder can be probed again."""

import json

import pytest
from conftest import TINY_MODEL

from lab import lr_probe
from man_recipes.workdir import MARKER

SMALL = "configs/man/t1-iwslt14-man-small.yaml"


def _probe(out, data, *extra):
    """A tiny real probe; its verdict (trains or stalls after a few updates) is not the point here."""
    rc = lr_probe.main(_tiny(out, data, *extra))
    assert rc in (0, 1) and json.loads((out / "probe.json").read_text())["verdict"] != "error"


def _tiny(out, data, *extra):
    return [SMALL, "--norm", "post", "--updates", "4", "--warmup", "2", "--max-tokens", "500",
            "--log-interval", "2", "--data", str(data), "--out", str(out), *extra,
            "--", *TINY_MODEL, "--source-lang", "src", "--target-lang", "tgt", "--seed", "3"]


def _error_line(rc, capsys):
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("ERROR: "), captured.err
    return lines[0]


@pytest.fixture
def no_training(monkeypatch):
    """Any fairseq command started fails the test: the refusals come before the work."""
    def started(*args, **kwargs):
        raise AssertionError(f"started {args[0][:1]} before the output was checked")

    monkeypatch.setattr(lr_probe.subprocess, "Popen", started)
    monkeypatch.setattr(lr_probe.subprocess, "run", started)


def test_a_users_folder_is_refused_before_the_work(tmp_path, capsys, no_training):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.log").write_text("my log\n")
    (out / "probe.json").write_text('{"mine": 1}\n')
    rc = lr_probe.main([SMALL, "--out", str(out), "--text", str(tmp_path / "text")])
    line = _error_line(rc, capsys)
    assert f"--out {out} holds train.log, probe.json, not written there by an lr probe" in line
    assert "--overwrite" in line
    assert (out / "train.log").read_text() == "my log\n" and (out / "probe.json").read_text() == '{"mine": 1}\n'
    assert sorted(p.name for p in out.iterdir()) == ["probe.json", "train.log"]
    # --analyse rewrites probe.json: refused as well (train.log is only read)
    rc = lr_probe.main([SMALL, "--out", str(out), "--analyse"])
    assert "holds probe.json, not written there" in _error_line(rc, capsys)
    assert (out / "probe.json").read_text() == '{"mine": 1}\n'
    (out / "train.log").unlink()
    (out / "probe.json").unlink()
    rc = lr_probe.main([SMALL, "--out", str(out), "--analyse"])
    assert f"--analyse: no {out / 'train.log'} to analyse" in _error_line(rc, capsys)

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    rc = lr_probe.main([SMALL, "--out", str(not_a_folder)])
    assert f"--out {not_a_folder} exists and is not a folder" in _error_line(rc, capsys)


def test_an_existing_png_is_replaced_only_with_overwrite(tmp_path, capsys):
    records = [{"num_updates": float(i), "loss": 10.0 - i, "gnorm": 1.0, "lr": 1e-3} for i in range(1, 6)]
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"config": "c", "norm": "pre", "verdict": "trains", "records": records}))
    png = tmp_path / "figure.png"
    png.write_bytes(b"my figure")
    rc = lr_probe.main(["--plot", str(probe), "--png", str(png)])
    assert f"--png {png} exists; pass --overwrite" in _error_line(rc, capsys)
    assert png.read_bytes() == b"my figure"
    assert lr_probe.main(["--plot", str(probe), "--png", str(png), "--overwrite"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_probe_folder_is_probed_again_and_a_users_other_files_are_kept(toy_data_bin, tmp_path):
    out = tmp_path / "probe"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    _probe(out, toy_data_bin)
    first = json.loads((out / "probe.json").read_text())
    assert set((out / MARKER).read_text().split()) == set(lr_probe.OUTPUTS)
    # the same probe again: its own files are replaced without a flag, the user's kept
    _probe(out, toy_data_bin, "--updates", "6")
    again = json.loads((out / "probe.json").read_text())
    assert (first["updates"], again["updates"]) == (4, 6)
    assert [r["num_updates"] for r in again["records"]] == [2, 4, 6]
    assert (out / "train.log").read_text().count("train_inner") == 3  # replaced, not appended to
    assert (out / "notes.txt").read_text() == "mine\n"


def test_overwrite_replaces_a_users_files(toy_data_bin, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.log").write_text("my log\n")
    _probe(out, toy_data_bin, "--overwrite")
    assert "my log" not in (out / "train.log").read_text()


def test_text_is_binarized_inside_out_and_again_when_it_changes(toy_raw, tmp_path, capsys):
    text = tmp_path / "text"
    for side, lang in (("src", "de"), ("tgt", "en")):
        (tmp_path / f"text.{lang}").write_text((toy_raw / f"train.{side}").read_text())
    out = tmp_path / "probe"
    argv = [SMALL, "--norm", "post", "--updates", "2", "--warmup", "1", "--max-tokens", "500", "--log-interval", "1",
            "--text", str(text), "--out", str(out), "--", *TINY_MODEL, "--seed", "3"]

    def probe():
        assert lr_probe.main(argv) in (0, 1)
        return capsys.readouterr().out

    assert "+ fairseq-preprocess" in probe()
    # nothing is written beside --out (a folder of the user's may be there)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probe", "text.de", "text.en"]
    assert (out / "data-bin" / "train.de-en.de.bin").is_file()
    assert "+ fairseq-preprocess" not in probe()  # the same text: binarized once
    words = (out / "data-bin" / "dict.de.txt").read_text()
    (tmp_path / "text.de").write_text((tmp_path / "text.de").read_text() + "neuwort " * 5 + "\n")
    (tmp_path / "text.en").write_text((tmp_path / "text.en").read_text() + "newword " * 5 + "\n")
    assert "+ fairseq-preprocess" in probe()  # another text: binarized again, not the old binaries
    assert "neuwort" in (out / "data-bin" / "dict.de.txt").read_text() and "neuwort" not in words


@pytest.mark.parametrize("option, value, why", [
    ("--updates", "0", "must be >= 1 and <= 1000000 (the ceiling of a measurement's training run)"),
    ("--warmup", "-1", "must be >= 0 and <= 1000000 (the ceiling of a measurement's training run)"),
    ("--lr", "-0.1", "must be > 0"), ("--time-limit", "0", "must be > 0 and <= 1440 (a day)"),
    ("--max-tokens", "0", "must be >= 1 and <= 1000000 (80 x the Gigaword config's 12,288 tokens a batch)"),
    ("--lr", "nan", "must be a finite number"),
])
def test_numbers_out_of_range_are_refused_when_read(tmp_path, capsys, no_training, option, value, why):
    with pytest.raises(SystemExit) as e:
        lr_probe.main([SMALL, "--out", str(tmp_path / "out"), "--text", str(tmp_path / "text"), f"{option}={value}"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m lab.lr_probe: error: argument {option}: invalid value '{value}': {why}")
    assert not (tmp_path / "out").exists()


def test_a_missing_config_or_data_folder_is_one_line(tmp_path, capsys, no_training):
    rc = lr_probe.main(["configs/nope.yaml", "--out", str(tmp_path / "out"), "--data", str(tmp_path)])
    assert _error_line(rc, capsys) == "ERROR: config not found: configs/nope.yaml"  # was a ConfigError traceback
    rc = lr_probe.main([SMALL, "--out", str(tmp_path / "out"), "--data", str(tmp_path / "nothing")])
    assert _error_line(rc, capsys) == f"ERROR: --data {tmp_path / 'nothing'}: no such folder (a binarized data-bin)"
    assert not (tmp_path / "out").exists()
