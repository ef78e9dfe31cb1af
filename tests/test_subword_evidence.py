"""A data folder's subword model is read from what the folder holds, never guessed (issue #72, item 1).

``cp DATA/* COPY/`` leaves the hidden ``.man-fairseq-prep`` record behind: the copy's subword model
is then read from its data record ``<dataset>.json`` and its model file (``spm.model`` or ``code``).
A folder whose files disagree (a record saying BPE beside ``spm.model`` and no ``code``...) is one
line naming them, in decoding, ``scripts/evaluate.sh``, ``scripts/reproduce.sh`` and Python use.
"""

import json
import random
import shutil

import pytest

from conftest import REPO
from test_data_prep import WORDS_DE, WORDS_EN, sentence
from test_score_inputs import _evaluate, _generate_output, _with_metric, toy_run  # noqa: F401  (a fixture)
from man_recipes.data import subword
from man_recipes.data.destination import making_record, write_record
from man_recipes.data.subword import SubwordEvidenceError

GIGAWORD = REPO / "data-bin" / "gigaword-30k"
SPM = {"kind": "sentencepiece", "model": "spm.model", "model_type": "unigram", "vocab_size": 60, "seed": 1,
       "trained_on": "train split, both sides"}


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    """A real (tiny) sentencepiece model file."""
    tmp = tmp_path_factory.mktemp("spm")
    rng = random.Random(3)
    (tmp / "train.txt").write_text("\n".join(sentence(rng, WORDS_EN + WORDS_DE, 8) for _ in range(200)) + "\n")
    subword.learn_sentencepiece([tmp / "train.txt"], tmp / "spm.model", "unigram", 60)
    return tmp / "spm.model"


def data_folder(folder, spm_model, record=None, manifest=None, code=False, spm=False):
    """``folder`` holding the evidence asked for: a making record whose ``subword`` is ``record``, a
    data record ``toy.json`` whose ``subword`` is ``manifest``, the files ``code`` and ``spm.model``."""
    folder.mkdir(exist_ok=True)
    if record is not None:
        write_record(folder, {**making_record("toy"), "subword": record})
    if manifest is not None:
        (folder / "toy.json").write_text(json.dumps({"dataset": "toy", "subword": manifest}))
    if code:
        (folder / "code").write_text("a b\n")
    if spm:
        shutil.copy(spm_model, folder / "spm.model")
    return folder


def test_a_copy_without_its_record_is_read_from_its_data_record_and_model(tmp_path, spm_model):
    # was read as BPE: the hypotheses kept their word-start marks and from_pretrained asked for `code`
    data = data_folder(tmp_path / "copy", spm_model, manifest=SPM, spm=True)
    assert subword.read_subword(data) == SPM
    assert subword.post_process_args(subword.read_subword(data)) == ["--post-process", "sentencepiece"]
    options = subword.hub_options(data)
    assert (options["bpe"], options["sentencepiece_model"]) == ("sentencepiece", str(data / "spm.model"))
    # the model file alone says it too
    (data / "toy.json").unlink()
    assert subword.read_subword(data) == {"kind": "sentencepiece", "model": "spm.model"}


BPE = {"kind": "bpe", "codes": "code"}


@pytest.mark.parametrize("evidence, said", [
    (dict(record=BPE, spm=True), ".man-fairseq-prep (its making record) says bpe; spm.model says sentencepiece"),
    (dict(manifest=SPM, code=True), "toy.json says sentencepiece; code says bpe"),
    (dict(record=SPM, manifest=BPE), ".man-fairseq-prep (its making record) says sentencepiece; toy.json says bpe"),
    (dict(code=True, spm=True), "code says bpe; spm.model says sentencepiece"),
])
def test_a_folder_whose_files_disagree_is_refused_naming_them(tmp_path, spm_model, evidence, said):
    data = data_folder(tmp_path / "data", spm_model, **evidence)
    message = (f"data folder {data}: its files disagree on its subword model ({said}); refusing to guess how to "
               "undo it. Keep only the files of the model the data was made with, or prepare it again.")
    for read in (subword.read_subword, subword.hub_options):
        with pytest.raises(SubwordEvidenceError) as e:
            read(data)
        assert str(e.value) == message


def test_python_use_names_a_missing_model_file(tmp_path, spm_model):
    data = data_folder(tmp_path / "data", spm_model, record=SPM)
    with pytest.raises(SubwordEvidenceError, match=r"its sentencepiece model spm.model is not in it; copy it"):
        subword.hub_options(data)


def _toy_copy(toy_run, tmp_path, toy_data_bin):
    run, refs = toy_run
    data = tmp_path / "data"
    shutil.copytree(toy_data_bin, data)
    _with_metric(run, "bleu_ci", data)  # the Multi30k config's own metric
    return run, refs, data


def test_evaluate_joins_the_pieces_of_a_copied_sentencepiece_folder(toy_run, tmp_path, toy_data_bin, spm_model,
                                                                    monkeypatch, capsys):
    run, refs, data = _toy_copy(toy_run, tmp_path, toy_data_bin)
    data_folder(data, spm_model, manifest=SPM, spm=True)
    code, _, err = _evaluate(run, monkeypatch, capsys, _generate_output(refs, refs))
    assert (code, err) == (0, "")
    cmd = json.loads((run / "results.json").read_text())["generate_command"]
    assert cmd[cmd.index("--post-process") + 1] == "sentencepiece" and "--remove-bpe" not in cmd


def test_evaluate_refuses_a_folder_whose_files_disagree_before_decoding(toy_run, tmp_path, toy_data_bin, spm_model,
                                                                        monkeypatch, capsys):
    run, refs, data = _toy_copy(toy_run, tmp_path, toy_data_bin)
    data_folder(data, spm_model, record=BPE, spm=True)
    code, _, err = _evaluate(run, monkeypatch, capsys, None)  # None: decoding must not start
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"ERROR: data folder {data}: its files disagree on its subword model "
                          "(.man-fairseq-prep (its making record) says bpe; spm.model says sentencepiece)")
    assert not list(run.glob("results*"))


@pytest.mark.skipif(not GIGAWORD.is_dir(), reason="data-bin/gigaword-30k is not prepared")
def test_reproduce_refuses_a_folder_whose_files_disagree_before_any_run(tmp_path, spm_model, monkeypatch, capsys):
    from man_recipes.studies import reproduce

    monkeypatch.setattr(reproduce, "train_run", lambda *a: pytest.fail("training started"))  # minutes otherwise
    data = tmp_path / "gigaword"
    shutil.copytree(GIGAWORD, data)  # its record and gigaword.json say BPE, its `code` too
    shutil.copy(spm_model, data / "spm.model")
    code = reproduce.main(["gigaword-cpu", "--seeds", "1", "--data", str(data), "--runs-dir", str(tmp_path / "runs"),
                           "--results-dir", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"ERROR: data folder {data}: its files disagree on its subword model (.man-fairseq-prep "
                          "(its making record) says bpe; gigaword.json says bpe; code says bpe; spm.model says "
                          "sentencepiece)")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
