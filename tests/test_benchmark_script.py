"""``scripts/speed.sh synthetic`` (lab/speed/synthetic.py): the study mode on random sentences at a paper
width, each family's paper config against the Transformer's.

No timing assertions (the numbers depend on the machine): one real short run at the tiny width checks the
data folder, that each backend is a record of its own with its Transformer, that the option reaches the
families and not the Transformer, and that the table is the study's, rebuilt from the records; the rest
are the refusals and the family table.
"""

import json
import subprocess
import sys
from pathlib import Path

from conftest import call_entry_point
from lab.speed import records
from lab.speed.__main__ import main as speed_main
from man_recipes.config import CONFIG_DIR, load_config

REPO = Path(__file__).resolve().parent.parent


def test_tiny_width_backends_are_records_with_their_own_transformer(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lab.speed", "synthetic", "--width", "tiny", "--families", "man", "--backend",
         "explicit,flex", "--threads", "1", "--repeats", "1", "--updates", "4", "--log-interval", "2",
         "--decode-sentences", "2", "--sentences", "100", "--results-dir", tmp_path], cwd=REPO, timeout=900,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    folder = tmp_path / "speed" / "synthetic"
    for backend in ("explicit", "flex"):
        rec = records.read_record(folder / f"synthetic-tiny-{backend}-threads1.json")
        assert rec["families"] == ["transformer", "man"] and rec["synthetic"]["backend"] == backend
        assert rec["configs"] == {"transformer": "configs/man/t1-wmt14-transformer-base.yaml",
                                  "man": "configs/man/t1-wmt14-man-base.yaml"}
        runs = {run["family"]: run for run in rec["runs"]}
        # the option reached the family, not fairseq's Transformer (which has none)
        assert " ".join(runs["man"]["train"]["command"]).count(f"--attention-backend {backend}") == 1
        assert "--attention-backend" not in runs["transformer"]["train"]["command"]
        transformer, man = records.summarize(rec)
        assert man["same_batches"] and man["train_ratio"]["median"] == man["train"]["median"] / transformer["train"]["median"]
        assert runs["man"]["train"]["peak_rss_mib"] > 0 and runs["man"]["decode"]["sentences"] == 2
        table = (folder / f"synthetic-tiny-{backend}.md").read_text()
        assert table in proc.stdout and "| 1 | man (t1-wmt14-man-base) |" in table
        assert table.startswith(f"# Speed on random batches: synthetic-tiny-{backend}\n")
        # the tiny width's options after '--' reach every fairseq-train run
        assert all("--encoder-embed-dim 32" in " ".join(run["train"]["command"]) for run in rec["runs"])
        assert table == records.to_markdown(rec["experiment"], [rec], {"transformer": "transformer (t1-wmt14-transformer-base)",
                                                                      "man": "man (t1-wmt14-man-base)"}, table.split("\n")[2])


def test_the_random_data_folder(tmp_path):
    from fairseq.data import Dictionary, data_utils

    from lab.speed.synthetic import LENGTH, write_data

    write_data(tmp_path, "en", "de", 1000, 50)
    assert len(Dictionary.load(str(tmp_path / "dict.de.txt"))) == 1000  # the specials included
    manifest = json.loads((tmp_path / "synthetic.json").read_text())
    assert manifest["counts"] == {"train": 50, "valid": 5, "test": 5} and manifest["source_lang"] == "en"
    src = data_utils.load_indexed_dataset(str(tmp_path / "train.en-de.en"), None)
    tgt = data_utils.load_indexed_dataset(str(tmp_path / "train.en-de.de"), None)
    assert len(src) == 50 and all(2 <= len(s) <= LENGTH["max"] and s[-1] == 2 and s[:-1].min() >= 4 for s in src)
    assert all(abs(len(t) - len(s)) <= 0.25 * len(s) + 1 for s, t in zip(src, tgt))


def test_every_widths_families_are_paper_configs_the_transformer_first():
    from lab.speed.synthetic import WIDTHS

    for width, (_, configs) in WIDTHS.items():
        assert next(iter(configs)) == "transformer"
        cfgs = {f: load_config(CONFIG_DIR / f"{c}.yaml") for f, c in configs.items()}
        assert {c["paper"] for c in cfgs.values()} == set(configs) - {"transformer"} | {"man"}
        assert len({(c["source_lang"], c["target_lang"]) for c in cfgs.values()}) == 1  # one data folder
        suffix = {"tiny": "base"}.get(width, width)
        assert all(c["arch"].endswith(suffix) for f, c in cfgs.items() if f != "transformer"), width


def test_bad_width_backend_and_family_are_clear_errors():
    # the command itself, run in this process: argument errors need no process of their own, and each
    # new interpreter would pay the torch/fairseq import
    for args, msg in ((["--width", "huge"], "--width: unknown"), (["--backend", "fast"], "--backend: unknown"),
                      (["--width", "tiny,base"], "run it alone"), (["--width", "small", "--families", "diffwin"],
                                                                   "--families: unknown ['diffwin']"),
                      (["--width", "small,base", "--families", "localness"], "no paper config at width small")):
        proc = call_entry_point(lambda: speed_main(["synthetic", *args]), args, prog="scripts/speed.sh")
        assert proc.returncode == 2 and msg in proc.stderr, proc.stderr[-2000:]


def test_backend_names_are_the_cores():
    from lab.speed import synthetic
    from man_fairseq.modules import attention_backend

    assert synthetic.ATTENTION_BACKENDS is attention_backend.ATTENTION_BACKENDS  # one list, not a copy
