"""Binarizing a prepared corpus: fairseq-preprocess into a temporary sibling folder, renamed to
``--dest`` only when complete (an interrupted run leaves no half-written destination, and its
leftovers are removed by the next run); :func:`bpe_and_binarize` is the dataset recipes' last
three steps (learn BPE or sentencepiece, apply it, binarize)."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from man_recipes.data.dataprep import PrepError, apply_bpe_lines, learn_bpe, log, read_lines, write_lines
from man_recipes.data.destination import differences, read_record, refuse_replacing, write_record
from man_recipes.data.steps import MARKER, claim_folder, is_ours
from man_recipes.data.subword import learn_and_apply_sentencepiece
from man_recipes.interrupt import run_child
from man_recipes.tools import tool_env


def _die_with_parent():
    """Child side of fairseq-preprocess: get SIGKILL when data-prep dies (Linux), so that a
    killed run leaves no orphan writing into the folder a rerun cleans up."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _preprocess(cmd, what):
    """Run fairseq-preprocess (the venv's, first on PATH); it dies with us (see _die_with_parent)."""
    env = tool_env()
    log("+ " + shlex.join(str(c) for c in cmd))
    proc = run_child(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    if proc.returncode != 0:
        raise PrepError(f"fairseq-preprocess failed{what}:\n{proc.stdout[-3000:]}")


def binarize(prep_dir, dest_dir, src, tgt, workers=1, joined=True, splits=("train", "valid", "test"),
             extra_files=(), extra_test_sets=(), record=None, force=False):
    """fairseq-preprocess on ``prep_dir/{train,valid,test}.{src,tgt}`` into ``dest_dir``, atomically.

    The data is built in a sibling ``.<dest>.partial-<pid>`` folder and renamed to ``dest_dir``
    only when complete, so an interrupted run never leaves a half-written destination (which
    made fairseq-preprocess stop with ``FileExistsError: dict.de.txt`` on the rerun). An
    existing ``dest_dir`` is replaced only if data-prep made it (or it is empty).
    ``extra_files`` are copied in next to the binarized data. Each of ``extra_test_sets`` (split
    names in ``prep_dir``) is binarized with the training dictionaries and stored under its own
    name: fairseq's translation task loads any ``--gen-subset NAME`` from
    ``NAME.src-tgt.lang.{bin,idx}``. ``record`` (:func:`.destination.making_record`) goes into the
    finished folder's marker; a ``dest_dir`` whose record differs is replaced only with ``force``.
    """
    dest = Path(dest_dir).absolute()
    if dest.exists():
        replaceable = dest.is_dir() and (is_ours(dest) or not any(dest.iterdir()))
        if not replaceable:
            raise PrepError(f"--dest {dest} exists, is not empty and was not made by data-prep (no {MARKER}); "
                            "refusing to replace it. Choose another --dest or remove it yourself.")
        old = read_record(dest)
        if record is not None and old is not None and differences(old, record) and not force:
            refuse_replacing(dest, old, record)  # checked before any step too; this is the last line
    dest.parent.mkdir(parents=True, exist_ok=True)
    stale_dirs = [*dest.parent.glob(f".{dest.name}.partial-*"), *dest.parent.glob(f".{dest.name}.old-*")]
    for stale in stale_dirs:
        pid = stale.name.rsplit("-", 1)[-1]
        if is_ours(stale) and pid.isdigit() and not _pid_alive(int(pid)):
            log(f"      removing {stale} (left by an interrupted run)")
            shutil.rmtree(stale)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    if tmp.exists() and is_ours(tmp):
        shutil.rmtree(tmp)  # our own leftover (same pid reused)
    claim_folder(tmp, "temporary folder")
    cmd = ["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
           "--destdir", str(tmp), "--workers", str(workers)]
    for split in splits:
        cmd += [f"--{split}pref", str(Path(prep_dir) / split)]
    if joined:
        cmd += ["--joined-dictionary"]
    try:
        _preprocess(cmd, "")
        for split in extra_test_sets:
            one = tmp / f"_{split}"
            _preprocess(["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt, "--testpref",
                         str(Path(prep_dir) / split), "--destdir", str(one), "--workers", "1",
                         "--srcdict", str(tmp / f"dict.{src}.txt"), "--tgtdict", str(tmp / f"dict.{tgt}.txt")],
                        f" for {split}")
            for f in one.glob(f"test.{src}-{tgt}.*"):
                os.replace(f, tmp / f.name.replace("test.", f"{split}.", 1))
            shutil.rmtree(one)
    except BaseException:  # a failure or Ctrl-C: nothing half-written is left behind
        shutil.rmtree(tmp)
        raise
    for extra in extra_files:
        shutil.copy(extra, tmp / Path(extra).name)
    if record is not None:
        write_record(tmp, record)
    if dest.exists():
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        if not is_ours(dest):  # an empty folder: give it the marker so a leftover is recognised
            (dest / MARKER).write_text("replaced by data-prep\n")
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old)  # ours or empty, checked above
    else:
        os.replace(tmp, dest)
    return dest


def learn_and_apply_bpe(steps, tok_dir, src, tgt, merges, splits, workers):
    """Steps learn_bpe (joint, on the tokenized train split) and apply_bpe (every split) into
    ``<work>/prep``; returns (prep folder, codes file)."""
    tok_dir, prep = Path(tok_dir), steps.work / "prep"
    prep.mkdir(exist_ok=True)
    codes = prep / "code"

    def learn():
        learn_bpe([tok_dir / f"train.{src}", tok_dir / f"train.{tgt}"], codes, merges)
    steps.run("learn_bpe", learn, options={"merges": merges}, outputs=[codes])

    def apply():
        for split in splits:
            for lang in (src, tgt):
                lines = read_lines(tok_dir / f"{split}.{lang}")
                write_lines(prep / f"{split}.{lang}", apply_bpe_lines(lines, codes, workers))
                log(f"      bpe {split}.{lang}: {len(lines):,} lines")
    steps.run("apply_bpe", apply, inputs=[codes], outputs=[prep / f"{s}.{l}" for s in splits for l in (src, tgt)])
    return prep, codes


def bpe_and_binarize(args, steps, prep_src_dir, src, tgt, merges, splits=("train", "valid", "test")):
    """Learn the subword model ``args.subword`` names on the tokenized train split (joint BPE with
    ``merges``, or sentencepiece: :mod:`.subword`), apply it to every split, binarize into ``--dest``."""
    tok_dir = Path(prep_src_dir)
    if getattr(args, "subword", "bpe") == "sentencepiece":
        prep, model = learn_and_apply_sentencepiece(steps, tok_dir, src, tgt, args.spm_model_type,
                                                    args.spm_vocab_size, splits)
    else:
        prep, model = learn_and_apply_bpe(steps, tok_dir, src, tgt, merges, splits, args.workers)
    dest = Path(args.dest).absolute()

    def binarize_step():
        extras = [model] + sorted(tok_dir.glob("*.raw.*"))  # untokenized references for sacreBLEU
        binarize(prep, dest, src, tgt, workers=args.workers, splits=splits, extra_files=extras,
                 record=args.record, force=args.force)
    steps.run("binarize", binarize_step, options={"dest": str(dest)},
              outputs=[dest / f"dict.{src}.txt", dest / f"dict.{tgt}.txt", dest / model.name])
    return prep
