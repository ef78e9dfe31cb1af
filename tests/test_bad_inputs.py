"""Bad inputs, faults and interruptions of data-prep and the scorers (issue 48): each is one clear
line before any long step, loses no file and never gives a wrong number with exit status 0.

The data-prep cases run on the small fixture releases of test_data_prep.py / test_cnndm_layouts.py;
the scorer cases on the toy run of test_score_inputs.py."""

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import default_ctrl_c, run_cli, run_files2rouge
from pausing import pause_env, wait_for
from test_cnndm_layouts import example, record, write_bin, write_see_text
from test_data_prep import MERGES, PREP, WORDS_EN, make_iwslt_archive, make_sumdata, prep_in_process, sentence
from test_score_inputs import _evaluate, _with_metric, toy_run  # noqa: F401  (toy_run: a fixture)
from man_recipes import textfile
from man_recipes.data import destination, see_bin
from man_recipes.data.dataprep import PrepError, read_lines
from man_recipes.data.steps import MARKER


def listing(folder):
    """Every file under ``folder`` with its bytes' digest, to show that nothing changed."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def sumdata_release(tmp_path, n=600, seed=4):
    rng = random.Random(seed)
    art = [sentence(rng, WORDS_EN, 8).lower() for _ in range(n)]
    ttl = [sentence(rng, WORDS_EN, 3).lower() for _ in range(n)]
    make_sumdata(tmp_path, art, ttl)
    return tmp_path / "sumdata", art, ttl


# ------------------------------------------------------------ 1. a finished data folder is kept

def test_a_finished_data_folder_is_replaced_only_by_the_same_dataset_and_options(tmp_path, capsys):
    release, _, _ = sumdata_release(tmp_path)
    dest, giga_work = tmp_path / "data", tmp_path / "w-giga"
    giga = ["gigaword", "--from", release, "--work", giga_work, "--dest", dest, "--bpe-merges", MERGES]
    prep_in_process(*giga)
    made = json.loads((dest / MARKER).read_text())
    assert made["dataset"] == "gigaword" and made["options"]["bpe_merges"] == int(MERGES)
    before = listing(dest)
    see = tmp_path / "see"
    write_see_text(see, ("train", "val", "test"))
    cnndm = ["cnndm", "--from", see, "--work", tmp_path / "w-cnndm", "--dest", dest, "--bpe-merges", MERGES]
    # another dataset: refused before any step (its --work is not even made), nothing of --dest lost
    with pytest.raises(PrepError, match=rf"--dest {dest} is a finished data folder and it holds gigaword data, this "
                                        r"run prepares cnndm; refusing to replace it\. .*--force"):
        prep_in_process(*cnndm)
    assert not (tmp_path / "w-cnndm").exists() and listing(dest) == before
    # the same dataset with other options: refused too, before any step
    with pytest.raises(PrepError, match=r"it holds gigaword data made with other options \(bpe_merges 60 -> 50\)"):
        prep_in_process(*giga[:-1], "50")
    assert listing(dest) == before
    # the same command again: every step skipped, nothing rewritten
    capsys.readouterr()
    prep_in_process(*giga)
    assert "start " not in capsys.readouterr().out and listing(dest) == before
    # --force replaces it, and the folder then records the new dataset
    prep_in_process(*cnndm, "--force")
    assert json.loads((dest / MARKER).read_text())["dataset"] == "cnndm"
    assert (dest / "cnndm.json").is_file() and not (dest / "gigaword.json").exists()


def test_older_data_folders_without_a_record(tmp_path):
    """A folder an older data-prep made (its marker is a line of text) is replaced only when the
    --work folder's binarize step wrote it and it holds no other dataset's record, or with --force."""
    dest, work = tmp_path / "data", tmp_path / "work"
    dest.mkdir()
    (dest / MARKER).write_text("made by man-fairseq data-prep (pid 1)\n")
    (dest / "dict.article.txt").write_text("a 1\n")
    new = destination.making_record("gigaword", bpe_merges=60)
    with pytest.raises(PrepError, match=r"made by an older data-prep, which did not record its dataset and options"):
        destination.check_dest(dest, new, work=work)
    work.mkdir()
    (work / ".binarize.done").write_text(json.dumps({"options": {"dest": str(dest.absolute())}}))
    destination.check_dest(dest, new, work=work)  # this --work made it: a rerun of the same recipe
    (dest / "cnndm.json").write_text(json.dumps({"dataset": "cnndm"}))
    with pytest.raises(PrepError, match=r"it holds cnndm data, this run prepares gigaword"):
        destination.check_dest(dest, new, work=work)
    destination.check_dest(dest, new, force=True, work=work)
    # a folder data-prep did not make is refused even with --force; a file is not a folder
    (dest / MARKER).unlink()
    with pytest.raises(PrepError, match=r"not made by data-prep .* refusing to replace it"):
        destination.check_dest(dest, new, force=True)
    with pytest.raises(PrepError, match=r"is a file, not a folder"):
        destination.check_dest(dest / "cnndm.json", new)


def test_a_foreign_dest_is_refused_before_any_step(tmp_path):
    release, _, _ = sumdata_release(tmp_path)
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep\n")
    with pytest.raises(PrepError, match=r"--dest .* not made by data-prep .* refusing to replace it"):
        prep_in_process("gigaword", "--from", release, "--work", tmp_path / "w", "--dest", dest)
    assert not (tmp_path / "w").exists()  # refused before staging, tokenizing and BPE
    assert listing(dest) == {"notes.txt": listing(dest)["notes.txt"]}


# ----------------------------------------------- 2. and 8. one text reader, nothing replaced

def test_see_bin_text_that_is_not_utf8_is_an_error_naming_the_chunk_and_record(tmp_path):
    chunk = tmp_path / "test_000.bin"
    good = record(example({"article": [b"a fine article ."], "abstract": [b"<s> fine . </s>"]}))
    latin1 = record(example({"article": ["un caf\u00e9 .".encode("latin-1")], "abstract": [b"<s> x . </s>"]}))
    chunk.write_bytes(good + latin1)
    with pytest.raises(PrepError, match=rf"{chunk}: record 2 \(byte {len(good):,}\): its article text is not UTF-8 "
                                        r"\(0xe9 at byte 7 of the text\)"):
        list(see_bin.read_pairs(chunk))


def damaged_gzips(tmp_path, n=12):
    """Copies of one .gz file of text, each with two bytes of its deflate stream flipped."""
    rng = random.Random(48)
    text = "".join(" ".join(rng.choice(WORDS_EN) for _ in range(12)) + " caf\u00e9 .\n" for _ in range(3000))
    data = gzip.compress(text.encode("utf-8"), mtime=0)
    for k in range(n):
        damaged = bytearray(data)
        at = 20 + (len(data) - 40) * k // n
        damaged[at] ^= 0x55
        damaged[at + 1] ^= 0xAA
        path = tmp_path / f"train.title.{k}.txt.gz"
        path.write_bytes(bytes(damaged))
        yield path


def test_a_damaged_gz_file_is_named_as_corrupt_not_as_text_that_is_not_utf8(tmp_path):
    for path in damaged_gzips(tmp_path):
        for read in (textfile.read_lines, textfile.read_text):
            with pytest.raises(textfile.CorruptFileError, match=rf"^{path}: corrupt or truncated gzip data"):
                read(path)
        with pytest.raises(PrepError, match=rf"^{path}: corrupt or truncated gzip data .*gzip -t"):
            read_lines(path)
    not_gzip = tmp_path / "plain.txt.gz"
    not_gzip.write_text("plain text\n")
    with pytest.raises(textfile.CorruptFileError, match="BadGzipFile"):
        textfile.read_lines(not_gzip)


def test_a_damaged_gigaword_training_file_is_one_line_naming_it(tmp_path):
    release, _, _ = sumdata_release(tmp_path)
    data = bytearray((release / "train/train.title.txt.gz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    data[len(data) // 2 + 1] ^= 0xFF
    (release / "train/train.title.txt.gz").write_bytes(bytes(data))
    with pytest.raises(PrepError, match=r"train\.title\.txt\.gz: corrupt or truncated gzip data"):
        prep_in_process("gigaword", "--from", release, "--work", tmp_path / "w", "--dest", tmp_path / "b")
    assert not (tmp_path / "b").exists()


# --------------------------------------------------------------- 3. blank test references

def test_blank_test_references_are_refused_at_prep_time(tmp_path):
    release, _, ttl = sumdata_release(tmp_path)
    refs = ttl[500:600]
    refs[2] = refs[40] = "  "
    (release / "Giga/task1_ref0.txt").write_text("\n".join(refs) + "\n")
    with pytest.raises(PrepError, match=r"test: 2 of 100 references are blank \(first: .*Giga/task1_ref0\.txt "
                                        r"line 3\); ROUGE cannot score a blank reference"):
        prep_in_process("gigaword", "--from", release, "--work", tmp_path / "w", "--dest", tmp_path / "b")
    assert not (tmp_path / "w" / ".learn_bpe.done").exists() and not (tmp_path / "b").exists()
    # See et al.'s layouts: an abstract with no words between its tags
    see = tmp_path / "see"
    blank = ["<s> a summary . </s>", "<s> </s>", "<s> another . </s>"]
    write_see_text(see, ("train", "val", "test"), abstracts={"test": blank})
    with pytest.raises(PrepError, match=rf"test: 1 of 3 references are blank \(first: {see}/test\.abstract\.tagged"
                                        r"\.txt line 2\)"):
        prep_in_process("cnndm", "--from", see, "--work", tmp_path / "w2", "--dest", tmp_path / "b2")
    chunked = tmp_path / "finished_files" / "chunked"
    chunked.mkdir(parents=True)
    for split in ("train", "val"):
        write_bin(chunked / f"{split}_000.bin", [(f"article {i} .", f"<s> summary {i} . </s>") for i in range(5)])
    write_bin(chunked / "test_000.bin", [("article .", "<s> summary . </s>"), ("article .", "<s> </s>")])
    with pytest.raises(PrepError, match=rf"test: 1 of 2 references are blank \(first: {chunked}/test_000\.bin "
                                        r"record 2\)"):
        prep_in_process("cnndm", "--from", tmp_path / "finished_files", "--work", tmp_path / "w3",
                        "--dest", tmp_path / "b3")


def test_rouge_refuses_a_blank_reference_line_at_every_entry_point(tmp_path):
    from man_recipes import scoring

    refs = [f"reference number {i} ." for i in range(20)]
    refs[6] = ""
    hyps = [r or "a hypothesis ." for r in refs]
    for implementation in ("rouge155", "rouge-score"):
        with pytest.raises(scoring.ScoreInputError, match=r"^references R\.txt: line 7 is blank \(1 of 20 lines "
                                                          r"are\); ROUGE cannot score a blank reference"):
            scoring.rouge(hyps, refs, implementation=implementation, names=("hypotheses H.txt", "references R.txt"))
    # BLEU is a corpus score: a blank reference line is scored as such, as multi-bleu.perl does
    assert scoring.tokenized_bleu(hyps, refs)["bleu"] > 0


def test_evaluate_refuses_blank_rouge_references_before_decoding(toy_run, tmp_path, toy_data_bin, monkeypatch, capsys):
    run, refs = toy_run
    data = tmp_path / "data"
    shutil.copytree(toy_data_bin, data)
    raw = list(refs)
    raw[3] = " "
    (data / "test.raw.tgt").write_text("".join(line + "\n" for line in raw))
    _with_metric(run, "rouge", data)
    code, _, err = _evaluate(run, monkeypatch, capsys, None)  # None: decoding must not start
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"ERROR: references {data / 'test.raw.tgt'}: line 4 is blank (1 of 20 lines are)"), err


# ------------------------------------------------------ 11. an empty chunk, before any step

def test_a_zero_byte_bin_chunk_is_refused_before_any_step(tmp_path):
    chunked = tmp_path / "finished_files" / "chunked"
    chunked.mkdir(parents=True)
    for split in ("train", "val"):
        write_bin(chunked / f"{split}_000.bin", [(f"article {i} .", f"<s> summary {i} . </s>") for i in range(5)])
    (chunked / "test_000.bin").write_bytes(b"")
    work, dest = tmp_path / "w", tmp_path / "b"
    with pytest.raises(PrepError, match=rf"^{chunked}/test_000\.bin: empty \(0 bytes\)"):
        prep_in_process("cnndm", "--from", tmp_path / "finished_files", "--work", work, "--dest", dest)
    assert not dest.exists() and not list(work.glob(".read_see.done"))


# ------------------------------------------------------------------------ 4. and 5. files2rouge

@pytest.mark.parametrize("eos", ["", " ", ". ."])
def test_files2rouge_refuses_an_eos_that_is_not_one_token(eos, tmp_path, capsys, monkeypatch):
    from man_recipes import rouge155

    ref = tmp_path / "ref.txt"
    ref.write_text("a b . c d .\n")
    monkeypatch.setattr(rouge155, "run", lambda *a, **k: pytest.fail("ROUGE ran"))
    code, out, err = run_files2rouge([ref, ref, "-e", eos], capsys)
    assert (code, out) == (2, "") and err.startswith("usage: man-files2rouge")  # argparse: usage, then the error
    assert err.splitlines()[-1] == (f"man-files2rouge: error: -e/--eos {eos!r}: the end-of-sentence token must be "
                                    "one token without spaces, such as '.' (the default)")


def test_files2rouge_replaces_an_existing_scores_file_only_with_overwrite(tmp_path, capsys):
    ref, saved = tmp_path / "ref.txt", tmp_path / "scores.txt"
    ref.write_text("the cat sat on the mat .\n")
    saved.write_text("my notes\n")
    code, out, err = run_files2rouge([ref, ref, "-s", saved], capsys)
    assert (code, out) == (2, "")
    assert err == f"ERROR: -s {saved}: exists; pass --overwrite to replace it, or choose a new file\n"
    assert saved.read_text() == "my notes\n"
    code, out, err = run_files2rouge([ref, ref, "-s", saved, "--overwrite"], capsys)
    assert (code, err) == (0, "") and "ROUGE-1 Average_F: 1.00000" in saved.read_text()


# ---------------------------------------------------------------------- 9. Ctrl-C in data-prep

def test_ctrl_c_during_binarize_is_one_line_and_the_rerun_resumes(tmp_path):
    archive = tmp_path / "de-en.tgz"
    make_iwslt_archive(archive)
    work, dest = tmp_path / "work", tmp_path / "bin"
    args = ["--from", archive, "--work", work, "--dest", dest, "--bpe-merges", MERGES, "--allow-nonstandard-splits"]
    hook, reached, _ = pause_env(tmp_path, "fairseq-preprocess", "] Dictionary: ", pythonpath="")
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(["bash", str(PREP / "prepare-iwslt14.sh"), *map(str, args)], env={**env, **hook},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_ctrl_c)
    try:
        wait_for(reached, proc)  # fairseq-preprocess has written the dictionaries
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert err.endswith("\ninterrupted during step binarize; the finished steps are kept (an unfinished one leaves "
                        "no stamp and is redone): run the same command again to resume\n"), err  # after BPE's progress
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err and "start binarize" in out
    assert not dest.exists() and not list(tmp_path.glob(".bin.*"))  # nothing half-written left behind
    rerun = subprocess.run(["bash", str(PREP / "prepare-iwslt14.sh"), *map(str, args)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout
    assert "skip  apply_bpe" in rerun.stdout and "start binarize" in rerun.stdout
    assert (dest / "test.de-en.en.bin").is_file()


# ----------------------------------------------- 10. a file that is not a checkpoint, named so

def test_a_file_that_is_not_a_checkpoint_is_named_so_by_our_commands(tmp_path, capsys):
    from man_recipes.analysis.utils import checkpoint_load_errors
    from man_recipes.cli import average_checkpoints

    text = tmp_path / "notes.pt"
    text.write_text("hello world\n")  # torch.load says `KeyError: 101`
    with pytest.raises(SystemExit) as stopped:
        average_checkpoints.cli_main(["--inputs", str(text), "--output", str(tmp_path / "avg.pt")])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"ERROR: cannot read checkpoint {text}: not a PyTorch checkpoint (neither the "
                                       "zip archive torch.save writes nor a pickle); give a checkpoint*.pt written "
                                       "by fairseq-train\n")
    with pytest.raises(SystemExit, match=rf"^--path {text}: {text} is not a PyTorch checkpoint"):
        with checkpoint_load_errors(str(text), str(tmp_path)):
            pytest.fail("the checkpoint was read")
    assert not (tmp_path / "avg.pt").exists()


# ----------------------------------------- 7. a --model-overrides key the checkpoint never reads

@pytest.fixture(scope="module")
def man_checkpoint(tmp_path_factory):
    """A transformer_man_small checkpoint as fairseq-train saves one (untrained), with its dictionaries."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from conftest import build_fairseq_model

    folder = tmp_path_factory.mktemp("man_ckpt")
    model, _, args = build_fairseq_model("transformer_man_small", ["--encoder-layers", "1", "--decoder-layers", "1"],
                                         dict_size=20, tmp_dir=folder)
    cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    state = {"cfg": cfg, "args": None, "model": model.state_dict(), "optimizer_history": [
        {"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {},
         "num_updates": 0}], "extra_state": {}, "last_optimizer_state": None}
    checkpoint_utils.torch_persistent_save(state, str(folder / "checkpoint_last.pt"))
    assert torch.load(folder / "checkpoint_last.pt", weights_only=False)["cfg"]["model"].arch == "transformer_man_small"
    return folder


@pytest.mark.parametrize("key, said", [
    ("localness_window", "has no option of that name, so it would be ignored; `man-options ARCH` lists"),
    ("dropuot", "has no option of that name, so it would be ignored; did you mean 'dropout'?")])
def test_a_model_override_the_checkpoint_has_no_option_of_is_refused(key, said, man_checkpoint, monkeypatch):
    from fairseq import checkpoint_utils

    from man_fairseq.plugin_options import PluginOptionError

    path = str(man_checkpoint / "checkpoint_last.pt")
    overrides = {"data": str(man_checkpoint), key: "gaussian"}
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", "--model-overrides", repr({key: "gaussian"})])
    with pytest.raises(PluginOptionError, match=rf"^--model-overrides '{key}': {path} \(arch transformer_man_small\) "
                                                rf"{said}"):
        checkpoint_utils.load_model_ensemble([path], arg_overrides=overrides)
    # a key it has is applied, as fairseq applies it
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", "--model-overrides", "{'dropout': 0.25}"])
    models, cfg = checkpoint_utils.load_model_ensemble([path], arg_overrides={"data": str(man_checkpoint),
                                                                              "dropout": 0.25})
    assert cfg.model.dropout == 0.25 and cfg.task.data == str(man_checkpoint)


@pytest.mark.parametrize("command", ["fairseq-generate", "fairseq-validate"])
@pytest.mark.parametrize("text", ["[1, 2]", "{'beam': 5"])
def test_model_overrides_that_are_no_dict_are_one_line(command, text, man_checkpoint):
    """A list was an AttributeError traceback, an unclosed brace a SyntaxError one (issue 81)."""
    proc = run_cli([command, man_checkpoint, "--user-dir", "man_fairseq", "--path", man_checkpoint / "checkpoint_last.pt",
                    "--model-overrides", text], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout
    assert proc.stdout.splitlines()[-1] == (f"{command}: error: argument --model-overrides: must be a literal dict of "
                                            f"option names to values, e.g. \"{{'attention_backend': 'flex'}}\"; "
                                            f"got {text!r}")


def test_a_model_override_that_changes_the_model_is_refused(man_checkpoint, monkeypatch):
    """{'encoder_embed_dim': 64} built another model than the checkpoint's parameters (issue 81)."""
    import torch
    from fairseq import checkpoint_utils

    from man_fairseq.plugin_options import PluginOptionError

    path = str(man_checkpoint / "checkpoint_last.pt")
    saved = torch.load(path, weights_only=False)["cfg"]["model"].encoder_embed_dim
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", "--model-overrides", "{'encoder_embed_dim': 64}"])
    with pytest.raises(PluginOptionError, match=rf"^--model-overrides 'encoder_embed_dim': 64 would change the model "
                                                rf"{path} was trained as \(encoder_embed_dim {saved}\); an option that "
                                                r"defines the model cannot be overridden"):
        checkpoint_utils.load_model_ensemble([path], arg_overrides={"data": str(man_checkpoint), "encoder_embed_dim": 64})
    # the value it was trained with changes nothing, and an option that does not define the model may change
    overrides = {"encoder_embed_dim": saved, "attention_backend": "explicit"}
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", "--model-overrides", repr(overrides)])
    _, cfg = checkpoint_utils.load_model_ensemble([path], arg_overrides={"data": str(man_checkpoint), **overrides})
    assert cfg.model.attention_backend == "explicit"


def test_an_option_the_arch_declares_is_accepted_though_the_checkpoint_predates_it(man_checkpoint):
    import torch

    from man_fairseq.plugin_options import check_model_overrides

    state = torch.load(man_checkpoint / "checkpoint_last.pt", weights_only=False)
    assert hasattr(state["cfg"]["model"], "attention_backend")
    delattr(state["cfg"]["model"], "attention_backend")  # as in a checkpoint saved before the option existed
    check_model_overrides({"attention_backend": "flex"}, state, "old.pt")


def test_multi30k_refuses_another_datasets_folder_before_any_step(tmp_path, capsys):
    from man_recipes.data import multi30k

    dest = tmp_path / "data"
    dest.mkdir()
    destination.write_record(dest, destination.making_record("gigaword", bpe_merges=60))
    (dest / "dict.article.txt").write_text("a 1\n")
    argv = ["--from", str(tmp_path / "raw"), "--work", str(tmp_path / "w"), "--dest", str(dest)]
    assert multi30k.main(argv) == 2
    assert capsys.readouterr().err == (f"ERROR: --dest {dest} is a finished data folder and it holds gigaword data, "
                                       "this run prepares multi30k; refusing to replace it. Choose another --dest, or "
                                       "pass --force to replace it.\n")
    assert not (tmp_path / "w").exists() and (dest / "dict.article.txt").is_file()
    assert multi30k.main([*argv, "--force"]) == 2  # goes on, to the next check: --from is not there
    assert "--from" in capsys.readouterr().err and (dest / "dict.article.txt").is_file()


def test_iwslt14_reads_max_len(tmp_path):
    """--max-len was read by the WMT14 and Gigaword recipes only: IWSLT14 cleaned at 175 tokens
    whatever it said, with exit status 0."""
    archive = tmp_path / "de-en.tgz"
    make_iwslt_archive(archive)
    work = tmp_path / "work"
    prep_in_process("iwslt14", "--from", archive, "--work", work, "--dest", tmp_path / "bin", "--bpe-merges", MERGES,
                    "--max-len", "6")
    kept = [line.split() for split in ("train", "valid") for lang in ("de", "en")
            for line in (work / "tok" / f"{split}.{lang}").read_text().splitlines()]
    assert kept and max(map(len, kept)) == 6
    assert json.loads((tmp_path / "bin" / MARKER).read_text())["options"]["max_len"] == 6


def test_fairseqs_loader_names_a_file_that_is_not_a_checkpoint(tmp_path):
    from fairseq import checkpoint_utils

    from man_fairseq.plugin_options import PluginOptionError

    text = tmp_path / "notes.pt"
    text.write_text("hello world\n")
    with pytest.raises(PluginOptionError, match=rf"^cannot read checkpoint {text}: not a PyTorch checkpoint"):
        checkpoint_utils.load_model_ensemble([str(text)])
