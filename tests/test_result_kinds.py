"""A result a command wrote is never replaced by a result of another kind (issue #72, item 2).

``scripts/evaluate.sh RUN --subset valid`` writes the dev scores beside the test scores
(``results.valid.json`` / ``.md``), never over them; a result file holding another subset's scores is
replaced only with ``--force``. ``man-attention-locality --output-dir`` replaces its own table only.
``scripts/reproduce.sh`` does not replace the records of another data folder (another subword model or dictionaries) without ``--force``.
"""

import json
import shutil

import pytest

from conftest import REPO
from test_score_inputs import _evaluate, _generate_output, toy_run  # noqa: F401  (a fixture)
from test_subword_evidence import spm_model  # noqa: F401  (a fixture)


def test_dev_scores_are_written_beside_the_test_scores(toy_run, toy_raw, monkeypatch, capsys):
    run, refs = toy_run
    code, _, err = _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs))
    assert (code, err) == (0, "")
    test_result = {name: (run / name).read_bytes() for name in ("results.json", "results.md")}
    dev_refs = (toy_raw / "valid.tgt").read_text().splitlines()
    # was: the dev scores in results.json / .md, the test set's deleted
    code, _, err = _evaluate(run, monkeypatch, capsys, _generate_output(dev_refs, dev_refs), "--subset", "valid")
    assert (code, err) == (0, "")
    assert {name: (run / name).read_bytes() for name in ("results.json", "results.md")} == test_result
    dev = json.loads((run / "results.valid.json").read_text())
    assert dev["subset"] == "valid" and dev["n_sentences"] == len(dev_refs) == 40
    assert "- subset: valid (40 sentences)" in (run / "results.valid.md").read_text()
    assert sorted(p.name for p in run.glob("results*")) == ["results.json", "results.md", "results.valid.json",
                                                             "results.valid.md"]
    # the dev set again replaces its own result only
    code, out, _ = _evaluate(run, monkeypatch, capsys, _generate_output(dev_refs, dev_refs), "--subset", "valid")
    assert code == 0 and "moved aside to results.previous.valid.json, results.previous.valid.md" in out
    assert (run / "results.json").read_bytes() == test_result["results.json"]


def test_a_result_of_another_subset_is_replaced_only_with_force(toy_run, monkeypatch, capsys):
    """A results.json that holds dev scores (written before they went beside the test scores)."""
    run, refs = toy_run
    held = json.dumps({"subset": "valid", "scores": {"bleu": 3.0}}) + "\n"
    (run / "results.json").write_text(held)
    code, _, err = _evaluate(run, monkeypatch, capsys, None)  # None: decoding must not start
    assert code == 2 and err == (f"ERROR: {run / 'results.json'} holds the scores of `valid`, not of `test`; "
                                 "refusing to replace them: move it away first, or pass --force\n")
    assert (run / "results.json").read_text() == held and not (run / "results.previous.json").exists()
    code, _, err = _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs), "--force")
    assert (code, err) == (0, "") and json.loads((run / "results.json").read_text())["subset"] == "test"


# --------------------------------------------------------------- man-attention-locality --output-dir

def _locality(tmp_path, out, *extra):
    """cli_main with a checkpoint that does not exist: the output folder is checked before it is read."""
    from man_recipes.cli import attention_locality

    argv = [str(tmp_path / "data"), "--path", str(tmp_path / "none.pt"), "--output-dir", str(out), "--cpu", *extra]
    with pytest.raises(SystemExit) as stopped:
        attention_locality.cli_main(argv)
    return str(stopped.value)


def test_locality_refuses_files_it_did_not_write_before_loading(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "locality.md").write_text("my notes\n")
    (out / "locality.json").write_text('{"mine": 1}\n')
    # was: both replaced by the analysis, exit status 0
    assert _locality(tmp_path, out) == (f"--output-dir {out}: locality.md, locality.json exist there and were not "
                                        "written by man-attention-locality; pass --overwrite to replace them, or "
                                        "choose another folder")
    assert (out / "locality.md").read_text() == "my notes\n" and (out / "locality.json").read_text() == '{"mine": 1}\n'
    assert "--output-dir" not in _locality(tmp_path, out, "--overwrite")  # on to the missing checkpoint
    (tmp_path / "a-file").write_text("x\n")
    assert _locality(tmp_path, tmp_path / "a-file") == (f"--output-dir {tmp_path / 'a-file'}: "
                                                               f"{tmp_path / 'a-file'} is a file, not a folder")


def test_locality_replaces_its_own_table(tmp_path):
    out = tmp_path / "ours"
    shutil.copytree(REPO / "results" / "cnndm-cpu-locality", out)  # a table it wrote
    assert "--output-dir" not in _locality(tmp_path, out)


# ------------------------------------------- scripts/reproduce.sh --results-dir of another data folder

GIGAWORD = REPO / "data-bin" / "gigaword-30k"


class TrainingStarted(Exception):
    pass


def _study(tmp_path, data, monkeypatch, *extra):
    """reproduce.main on gigaword-cpu (MAN and its Transformer, seed 1) into tmp_path/results, stopped
    where training would start; returns (exit status or TrainingStarted, stderr)."""
    from man_recipes.studies import reproduce

    def train_run(*args):
        raise TrainingStarted
    monkeypatch.setattr(reproduce, "train_run", train_run)
    argv = ["gigaword-cpu", "--seeds", "1", "--families", "man", "--data", str(data),
            "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results"), *extra]
    try:
        return reproduce.main(argv), None
    except TrainingStarted:
        return TrainingStarted, None


def _bpe_study_records(tmp_path):
    """The committed Gigaword study's seed-1 records (BPE) in a --results-dir of our own."""
    records = tmp_path / "results" / "gigaword-cpu"
    records.mkdir(parents=True)
    for path in (REPO / "results" / "gigaword-cpu").glob("*-seed1.*"):
        if path.name.split("-seed")[0] in ("man", "transformer"):
            shutil.copy(path, records / path.name)
    return {p.name: p.read_bytes() for p in records.iterdir()}, records


@pytest.mark.skipif(not GIGAWORD.is_dir(), reason="data-bin/gigaword-30k is not prepared")
def test_reproduce_refuses_to_replace_the_records_of_another_data_folder(tmp_path, spm_model, monkeypatch, capsys):
    from man_recipes.data.destination import read_record, write_record

    before, records = _bpe_study_records(tmp_path)
    assert len(before) == 4
    spm = {"kind": "sentencepiece", "model": "spm.model"}
    data = tmp_path / "gigaword-spm"  # the same dictionaries, a sentencepiece model
    shutil.copytree(GIGAWORD, data)
    (data / "code").unlink()
    shutil.copy(spm_model, data / "spm.model")
    write_record(data, dict(read_record(data), subword=spm))
    manifest = json.loads((data / "gigaword.json").read_text())
    (data / "gigaword.json").write_text(json.dumps(dict(manifest, subword=spm)))
    # was: both runs retrained on it and their four files replaced, no --force, no message
    code, _ = _study(tmp_path, data, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and err == (f"ERROR: {records / 'transformer-seed1.json'} holds the scores of another data "
                                 "folder (subword bpe, this run's sentencepiece); refusing to replace them: choose "
                                 "another --results-dir, or pass --force with --families naming transformer to "
                                 f"retrain it on --data {data}\n")
    assert {p.name: p.read_bytes() for p in records.iterdir()} == before and not (tmp_path / "runs").exists()
    # a record of the same data whose config changed is stale: replaced as before, without --force
    code, _ = _study(tmp_path, GIGAWORD, monkeypatch, "--", "--dropout", "0.25")
    assert code is TrainingStarted
