"""The subword step of every data-prep recipe and what a data folder's record says about it.

``--subword bpe`` (the default, and what every paper row uses): joint subword-nmt BPE, codes stored
as ``code``. ``--subword sentencepiece``: one joint sentencepiece model trained on the training split
only (both sides, after the recipe's tokenization and cleaning, as BPE learns), with a fixed seed,
stored as ``spm.model``. Its model type and vocabulary size default to sentencepiece's own defaults
(``spm_train``: ``--model_type unigram``, ``--vocab_size 8000``).

The finished folder's record (:mod:`.destination`) names the subword model (``subword``) and the
fairseq tokenizer options of the text it was trained on (``tokenizer``); :func:`read_subword`
reads it back for decoding (:func:`post_process_args`) and Python use (:func:`hub_options`).
"""

import json
import os
from pathlib import Path

from man_recipes.atomic import replacing
from man_recipes.options import number
from man_recipes.data.dataprep import PrepError, log, read_lines, write_lines
from man_recipes.data.destination import read_record
from man_recipes.data.steps import MARKER

SUBWORDS = ("bpe", "sentencepiece")
BPE_CODES = "code"
SPM_MODEL = "spm.model"
SPM_MODEL_TYPES = ("unigram", "bpe", "char", "word")
DEFAULT_SPM_MODEL_TYPE = "unigram"  # spm_train's default
DEFAULT_SPM_VOCAB_SIZE = 8000  # spm_train's default
# --spm-vocab-size's ceiling: sentencepiece's --seed_sentencepiece_size default, the pieces unigram training
# starts from; 2147483648 (over sentencepiece's int32) was its traceback after two steps.
MAX_SPM_VOCAB_SIZE = 1_000_000
SPM_SEED = 1  # sentencepiece's random generator (unigram's sampling), fixed so a rerun gives the same model
# sentencepiece's training threads, whatever --workers says: each thread's share of the corpus sums its own
# statistics, so 1 and 2 threads learned other pieces (other dictionaries, other .bin); a fixed count gives
# the same model whatever --workers says (spm_train's default count)
SPM_THREADS = 16


def add_options(parser, bpe_merges_help):
    """The subword options of a data-prep command: ``--bpe-merges`` (``bpe_merges_help``: its default) and
    ``--subword`` with its sentencepiece options."""
    parser.add_argument("--bpe-merges", type=number("--bpe-merges", low=1), default=None, help=bpe_merges_help)
    parser.add_argument("--subword", choices=SUBWORDS, default="bpe",
                        help="subword model: joint subword-nmt BPE (default; the papers' rows) or a joint "
                             f"sentencepiece model trained on the training split, stored as {SPM_MODEL}")
    parser.add_argument("--spm-model-type", choices=SPM_MODEL_TYPES, default=None,
                        help=f"--subword sentencepiece: model type (default {DEFAULT_SPM_MODEL_TYPE}, spm_train's)")
    vocab_size = number("--spm-vocab-size", low=1, high=MAX_SPM_VOCAB_SIZE, ceiling="sentencepiece's seed pieces")
    parser.add_argument("--spm-vocab-size", type=vocab_size, default=None,
                        help="--subword sentencepiece: vocabulary size "
                             f"(default {DEFAULT_SPM_VOCAB_SIZE}, spm_train's)")


def check_options(parser, args):
    """Refuse a sentencepiece option without ``--subword sentencepiece`` (it would change nothing) and a
    ``--bpe-merges`` with it; fill in the defaults."""
    spm_given = [f for f, v in (("--spm-model-type", args.spm_model_type), ("--spm-vocab-size", args.spm_vocab_size))
                 if v is not None]
    if args.subword != "sentencepiece":
        if spm_given:
            parser.error(f"{' and '.join(spm_given)}: read with --subword sentencepiece only")
        return
    if args.bpe_merges is not None:
        parser.error("--bpe-merges: not read with --subword sentencepiece (--spm-vocab-size sets its size)")
    args.spm_model_type = args.spm_model_type or DEFAULT_SPM_MODEL_TYPE
    args.spm_vocab_size = args.spm_vocab_size or DEFAULT_SPM_VOCAB_SIZE


def making_options(args):
    """The subword options of the folder's making record: none for BPE (whose merges each recipe
    records as before, so the records of folders made before this option stay the same)."""
    if args.subword != "sentencepiece":
        return {}
    return {"subword": "sentencepiece", "spm_model_type": args.spm_model_type, "spm_vocab_size": args.spm_vocab_size,
            "spm_threads": SPM_THREADS}  # a folder made before with --workers' threads is other data


def manifest_options(args, merges):
    """The subword options a recipe's ``<dataset>.json`` lists among its options (the model itself is
    its ``subword`` field)."""
    if args.subword != "sentencepiece":
        return {"bpe_merges": merges}
    return {"spm_model_type": args.spm_model_type, "spm_vocab_size": args.spm_vocab_size}


def subword_record(args):
    """The record's ``subword`` field: which file the folder's subword model is and how it was made."""
    if args.subword != "sentencepiece":
        return {"kind": "bpe", "codes": BPE_CODES}
    return {"kind": "sentencepiece", "model": SPM_MODEL, "model_type": args.spm_model_type,
            "vocab_size": args.spm_vocab_size, "seed": SPM_SEED, "threads": SPM_THREADS,
            "trained_on": "train split, both sides"}


def learn_sentencepiece(train_files, model_path, model_type, vocab_size):
    """One joint sentencepiece model on the concatenation of ``train_files``, written to ``model_path``:
    the same bytes whatever ``--workers`` says (trained in :data:`SPM_THREADS` threads) and wherever
    the files are (the lines are handed over in memory, so the model records no training file or
    prefix path, which it does for a file)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.set_random_generator_seed(SPM_SEED)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=(line for f in train_files for line in read_lines(f)),
                                       model_writer=model, model_type=model_type, vocab_size=vocab_size,
                                       num_threads=SPM_THREADS, minloglevel=2)
    except (RuntimeError, OSError) as e:  # e.g. "Vocabulary size too high (8000). Please set it to a value <= N."
        said = str(e).strip().splitlines()[-1].rsplit("] ", 1)[-1]  # without its C++ source location
        raise PrepError(f"sentencepiece training on {', '.join(map(str, train_files))} failed: {said} "
                        "(see --spm-vocab-size, --spm-model-type)") from None
    pieces = spm.SentencePieceProcessor(model_proto=model.getvalue()).get_piece_size()
    if pieces != vocab_size:  # a char model stops at its characters: the record would say vocab_size
        raise PrepError(f"sentencepiece's {model_type} model of {', '.join(map(str, train_files))} has {pieces} pieces "
                        f"(for a char model: the training text's characters), not --spm-vocab-size {vocab_size}: "
                        f"pass --spm-vocab-size {pieces}")
    with replacing(model_path, "wb") as f:
        f.write(model.getvalue())


def apply_sentencepiece_lines(lines, model_path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    return [" ".join(pieces) for pieces in sp.encode(list(lines), out_type=str)]


def learn_and_apply_sentencepiece(steps, tok_dir, src, tgt, model_type, vocab_size, splits):
    """Steps learn_spm (joint, on the tokenized train split) and apply_spm (every split) into
    ``<work>/prep-spm`` (not BPE's ``prep``: a --work folder used with both keeps each one's files
    and stamps current); returns (prep folder, model file)."""
    tok_dir, prep = Path(tok_dir), steps.work / "prep-spm"
    prep.mkdir(exist_ok=True)
    model = prep / SPM_MODEL

    def learn():
        learn_sentencepiece([tok_dir / f"train.{src}", tok_dir / f"train.{tgt}"], model, model_type, vocab_size)
    steps.run("learn_spm", learn, inputs=[tok_dir / f"train.{src}", tok_dir / f"train.{tgt}"],
              options={"model_type": model_type, "vocab_size": vocab_size, "seed": SPM_SEED, "threads": SPM_THREADS},
              outputs=[model])

    def apply():
        for split in splits:
            for lang in (src, tgt):
                lines = read_lines(tok_dir / f"{split}.{lang}")
                write_lines(prep / f"{split}.{lang}", apply_sentencepiece_lines(lines, model))
                log(f"      sentencepiece {split}.{lang}: {len(lines):,} lines")
    steps.run("apply_spm", apply, inputs=[model], outputs=[prep / f"{s}.{l}" for s in splits for l in (src, tgt)])
    return prep, model


# ------------------------------------------------------------------- reading a folder's record

class SubwordEvidenceError(PrepError):
    """A data folder whose files say different things about its subword model (one line naming them)."""


def _manifest_subwords(folder):
    """(file name, ``subword`` field) of each data record ``<dataset>.json`` in ``folder`` (:mod:`.manifest`)."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("dataset") == path.stem and isinstance(
                manifest.get("subword"), dict):
            found.append((path.name, manifest["subword"]))
    return found


def read_subword(data):
    """The subword model of the data folder ``data``, from what the folder holds: its making record
    (in ``.man-fairseq-prep``), its data record ``<dataset>.json``, and which of ``code`` and ``spm.model``
    is in it. A copy without the hidden record (``cp DATA/* COPY/``) is read from the other two. When
    they name different models the folder is refused (:class:`SubwordEvidenceError`), never guessed;
    a folder with none of them (made before records named it, or not by data-prep) is read as BPE
    with codes ``code``."""
    folder = Path(str(data).split(os.pathsep)[0])
    said = []  # (where, subword dict) for every piece of evidence
    subword = (read_record(folder) or {}).get("subword")
    if isinstance(subword, dict):
        said.append((f"{MARKER} (its making record)", subword))
    said += _manifest_subwords(folder)
    for name, kind in ((BPE_CODES, "bpe"), (SPM_MODEL, "sentencepiece")):
        if (folder / name).is_file():
            said.append((name, {"kind": kind}))
    kinds = {s.get("kind") for _, s in said}
    if len(kinds) > 1 or not kinds <= set(SUBWORDS):
        listed = "; ".join(f"{where} says {s.get('kind')}" for where, s in said)
        raise SubwordEvidenceError(
            f"data folder {folder}: its files disagree on its subword model ({listed}); refusing to guess "
            f"how to undo it. Keep only the files of the model the data was made with, or prepare it again.")
    if kinds == {"sentencepiece"}:
        return next((s for _, s in said if "model" in s), {"kind": "sentencepiece", "model": SPM_MODEL})
    return next((s for _, s in said if "codes" in s), {"kind": "bpe", "codes": BPE_CODES})


def read_tokenizer(data):
    """The fairseq tokenizer keywords of ``data``'s record ({} for pre-tokenized releases or no record)."""
    return dict((read_record(Path(str(data).split(os.pathsep)[0])) or {}).get("tokenizer") or {})


def post_process_args(subword, remove_bpe="@@ "):
    """fairseq-generate's options that undo the folder's subword split on its hypotheses and targets."""
    if subword["kind"] == "sentencepiece":
        return ["--post-process", "sentencepiece"]
    return ["--remove-bpe", remove_bpe] if remove_bpe else []


def hub_options(data):
    """The keywords ``from_pretrained`` (and, as options, ``fairseq-interactive``) needs for the data
    folder ``data``: its subword model and tokenizer, as its record says."""
    subword = read_subword(data)
    model = Path(data) / subword["model" if subword["kind"] == "sentencepiece" else "codes"]
    if not model.is_file():  # fairseq would fail later, in its own words, inside from_pretrained
        raise SubwordEvidenceError(f"data folder {data}: its {subword['kind']} model {model.name} is not in it; "
                                   "copy it from the folder the data was prepared in")
    if subword["kind"] == "sentencepiece":
        options = {"bpe": "sentencepiece", "sentencepiece_model": str(model)}
    else:
        options = {"bpe": "subword_nmt", "bpe_codes": str(model)}
    return {"data_name_or_path": str(data), **options, **read_tokenizer(data)}
