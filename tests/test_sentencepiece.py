"""``--subword sentencepiece`` in data-prep, and decoding and scoring that read it from the data record.

On the shared samples of WMT14 (BLEU), Gigaword and CNN/DM (ROUGE): prepare with a small
sentencepiece model, train a tiny Transformer a few updates with the real fairseq-train, decode the
test set with fairseq-generate through the recipes' decode step (which reads the record) and score:
the hypotheses come out as text without sentencepiece marks and the scores are computed on them.
The models are far too small to translate: the tests check the path, not the scores' size. One
corpus per fixture, each prepared and trained once. The other tests check the options and records.
"""

import json
import random

import pytest

from conftest import SHARED_DATA, TINY_MODEL, TINY_TRAIN, run_cli
from test_data_prep import (
    MERGES, WORDS_DE, WORDS_EN, lines, make_sumdata, make_wmt_folder, prep_in_process, run_prep, sentence,
)
from man_recipes.data import subword
from man_recipes.data.destination import read_record
from man_recipes.data.dataprep import PrepError, tokenize_lines

SPM = ["--subword", "sentencepiece", "--spm-vocab-size", "300"]
MARK = "\u2581"  # sentencepiece's word-start mark


@pytest.fixture(scope="module")
def shared(request):
    """``../shared/data`` for a module-scoped fixture (the ``shared_data`` fixture is per test)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is not present (real data samples)")
    return SHARED_DATA


def train_tiny(data, src, tgt, save):
    run_cli(["fairseq-train", data, "--arch", "transformer", *TINY_MODEL, *TINY_TRAIN, "--source-lang", src,
             "--target-lang", tgt, "--share-all-embeddings", "--max-update", "6", "--save-dir", save,
             "--disable-validation"], timeout=600)
    return save / "checkpoint_last.pt"


def decode_test(data, checkpoint, src, tgt, tmp, metric, sources_only=False):
    from man_recipes.evaluation.decode import decode

    cfg = {"source_lang": src, "target_lang": tgt,
           "eval": {"metric": metric, "beam": 2, "max_len_a": 0, "max_len_b": 12}}
    return decode(cfg, data, checkpoint, "test", "cpu", "fp32", 64, tmp / "generate.txt", sources_only=sources_only)


@pytest.fixture(scope="module")
def wmt14_spm(shared, tmp_path_factory):
    from sacremoses import MosesDetokenizer

    tmp = tmp_path_factory.mktemp("wmt14spm")
    en = [MosesDetokenizer(lang="en").detokenize(l.split()) for l in lines(shared / "wmt14-sample/src-train.txt")[:300]]
    de = [MosesDetokenizer(lang="de").detokenize(l.split()) for l in lines(shared / "wmt14-sample/tgt-train.txt")[:300]]
    _, test_de = make_wmt_folder(tmp / "downloads", en, de)
    run_prep("prepare-wmt14en2de.sh", "--from", tmp / "downloads", "--work", tmp / "work", "--dest", tmp / "bin", *SPM)
    return tmp, tmp / "bin", test_de


@pytest.mark.shared_data
def test_wmt14_sentencepiece_prepare_train_generate_sacrebleu(wmt14_spm):
    from man_recipes.evaluation.metric import score

    tmp, data, test_de = wmt14_spm
    record = read_record(data)
    assert record["subword"] == {"kind": "sentencepiece", "model": "spm.model", "model_type": "unigram",
                                 "vocab_size": 300, "seed": 1, "threads": 16, "trained_on": "train split, both sides"}
    assert record["options"]["subword"] == "sentencepiece" and "bpe_merges" not in record["options"]
    assert record["tokenizer"] == {"tokenizer": "moses"}
    assert (data / "spm.model").is_file() and not (data / "code").exists()
    # trained on the training split only: every training line, no test line (the raw test text is not in it)
    assert (tmp / "work" / "prep-spm" / "train.en").read_text().count(MARK) > 0
    checkpoint = train_tiny(data, "en", "de", tmp / "ckpt")
    cmd, ids, hyps, refs = decode_test(data, checkpoint, "en", "de", tmp, "bleu_wmt")
    assert cmd[cmd.index("--post-process") + 1] == "sentencepiece" and "--remove-bpe" not in cmd
    # the targets come back as the tokenized test text: the pieces joined with the same model (a
    # character the training split never had is <unk> in fairseq's dictionary, as with BPE)
    tokenized = lines(tmp / "work" / "tok" / "test.de")
    known = [i for i, r in enumerate(refs) if "<unk>" not in r]
    assert len(known) >= 25 and [refs[i] for i in known] == [tokenized[i] for i in known]
    assert len(hyps) == 30 and not any(MARK in h for h in hyps)
    scores = score("bleu_wmt", hyps, refs, raw_refs=lines(data / "test.raw.de"), target_lang="de")
    assert scores.sacrebleu is not None and 0 <= scores.sacrebleu["bleu"] <= 100
    assert lines(data / "test.raw.de") == test_de  # sacreBLEU's references: the raw text, untouched
    # Python use with the record's keywords: raw text in, the pieces joined and Moses-detokenized out
    from fairseq.models.transformer import TransformerModel

    hub = TransformerModel.from_pretrained(str(checkpoint.parent), checkpoint_file=checkpoint.name,
                                           **subword.hub_options(data), source_lang="en", target_lang="de").eval()
    # the same pieces as data-prep's WMT14 test text (tokenizer.perl -a, escaped; the folder's model)
    prepared = subword.apply_sentencepiece_lines(tokenize_lines(["A house, today."], "en", aggressive=True),
                                                 data / "spm.model")
    assert hub.apply_bpe(hub.tokenize("A house, today.")) == prepared[0] and MARK in prepared[0]
    assert hub.decode(hub.encode("A house, today.")) == "A house, today."
    out = hub.translate("The house is small.", beam=2, max_len_b=8)
    assert isinstance(out, str) and MARK not in out and "@@" not in out


@pytest.mark.shared_data
def test_a_rerun_with_the_other_subword_is_refused_without_force(wmt14_spm):
    tmp, data, _ = wmt14_spm
    before = {p.name: p.stat().st_mtime_ns for p in data.iterdir()}
    proc = run_prep("prepare-wmt14en2de.sh", "--from", tmp / "downloads", "--work", tmp / "work", "--dest", data,
                    "--bpe-merges", MERGES, check=False)
    assert proc.returncode == 2, proc.stdout
    assert "subword sentencepiece -> None" in proc.stdout and "pass --force" in proc.stdout
    assert {p.name: p.stat().st_mtime_ns for p in data.iterdir()} == before
    # the same sentencepiece command again skips every step (its record is the same)
    out = run_prep("prepare-wmt14en2de.sh", "--from", tmp / "downloads", "--work", tmp / "work", "--dest", data,
                   *SPM).stdout
    assert "skip  learn_spm" in out and "skip  binarize" in out and "start " not in out


@pytest.mark.shared_data
def test_the_data_is_the_same_whatever_workers_says(wmt14_spm):
    # sentencepiece trained in --workers threads: --workers 2 made other pieces, dictionaries and .bin
    # files than --workers 1, and both folders' records were byte-identical
    tmp, data, _ = wmt14_spm
    other = tmp / "bin-workers2"
    run_prep("prepare-wmt14en2de.sh", "--from", tmp / "downloads", "--work", tmp / "work2", "--dest", other, *SPM,
             "--workers", "2")
    made = sorted(p.name for p in data.iterdir() if p.name != "preprocess.log")  # fairseq's log names its options
    assert made == sorted(p.name for p in other.iterdir() if p.name != "preprocess.log") and "spm.model" in made
    assert [name for name in made if (data / name).read_bytes() != (other / name).read_bytes()] == []


@pytest.fixture(scope="module")
def gigaword_spm(shared, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gigaspm")
    art = lines(shared / "gigaword-sample/valid.article.filter.4K.txt")[:600]
    ttl = lines(shared / "gigaword-sample/valid.title.filter.4K.txt")[:600]
    archive = make_sumdata(tmp, art, ttl)
    run_prep("prepare-gigaword.sh", "--from", archive, "--work", tmp / "work", "--dest", tmp / "bin", *SPM)
    return tmp, tmp / "bin"


@pytest.mark.shared_data
def test_gigaword_sentencepiece_prepare_train_generate_rouge(gigaword_spm):
    from man_recipes.evaluation.metric import score

    tmp, data = gigaword_spm
    manifest = json.loads((data / "gigaword.json").read_text())
    assert manifest["subword"]["kind"] == "sentencepiece" and manifest["options"]["spm_vocab_size"] == 300
    assert read_record(data)["tokenizer"] == {}  # the release is tokenized
    checkpoint = train_tiny(data, "article", "title", tmp / "ckpt")
    cmd, ids, hyps, refs = decode_test(data, checkpoint, "article", "title", tmp, "rouge", sources_only=True)
    assert refs is None and "sentencepiece" in cmd and len(hyps) == 100
    assert not any(MARK in h for h in hyps)
    scores = score("rouge", [h or "x" for h in hyps], lines(data / "test.raw.title"),
                   rouge_implementation="rouge-score")
    assert 0 <= scores.rouge["rouge1"] <= 100


@pytest.fixture(scope="module")
def cnndm_spm(shared, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cnndmspm")
    src, tgt = lines(shared / "cnndm-sample/val.source"), lines(shared / "cnndm-sample/val.target")
    folder = tmp / "presplit"
    folder.mkdir()
    for split, (a, b) in {"train": (0, 60), "val": (60, 70), "test": (70, 80)}.items():
        (folder / f"{split}.source").write_text("\n".join(src[a:b]) + "\n")
        (folder / f"{split}.target").write_text("\n".join(tgt[a:b]) + "\n")
    run_prep("prepare-cnndm.sh", "--from", folder, "--work", tmp / "work", "--dest", tmp / "bin",
             "--max-source-tokens", "50", *SPM)
    return tmp, tmp / "bin"


@pytest.mark.shared_data
def test_cnndm_sentencepiece_prepare_train_generate_rouge(cnndm_spm):
    from man_recipes.evaluation.metric import score

    tmp, data = cnndm_spm
    assert read_record(data)["tokenizer"] == {"tokenizer": "moses", "moses_no_dash_splits": True,
                                              "moses_no_escape": True}
    assert json.loads((data / "cnndm.json").read_text())["subword"]["model"] == "spm.model"
    checkpoint = train_tiny(data, "source", "target", tmp / "ckpt")
    cmd, ids, hyps, refs = decode_test(data, checkpoint, "source", "target", tmp, "rouge", sources_only=True)
    assert "sentencepiece" in cmd and len(hyps) == 10 and not any(MARK in h for h in hyps)
    scores = score("rouge", [h or "x" for h in hyps], lines(data / "test.raw.target"),
                   rouge_implementation="rouge-score")
    assert 0 <= scores.rouge["rougeL"] <= 100
    options = subword.hub_options(data)
    assert options["bpe"] == "sentencepiece" and options["sentencepiece_model"] == str(data / "spm.model")
    assert options["moses_no_escape"] is True


def test_sentencepiece_options_are_refused_where_they_change_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        prep_in_process("wmt14", "--from", tmp_path, "--spm-vocab-size", "100")  # without --subword sentencepiece
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --spm-vocab-size: read with --subword sentencepiece only")
    with pytest.raises(SystemExit) as exit_:
        prep_in_process("wmt14", "--from", tmp_path, "--subword", "sentencepiece", "--bpe-merges", "100")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --bpe-merges: not read with --subword sentencepiece (--spm-vocab-size sets its size)")


def test_sentencepiece_training_is_seeded_and_too_large_a_vocabulary_is_one_line(tmp_path):
    rng = random.Random(3)
    train = tmp_path / "train.txt"
    train.write_text("\n".join(sentence(rng, WORDS_EN + WORDS_DE, rng.randint(3, 12)) for _ in range(300)) + "\n")
    subword.learn_sentencepiece([train], tmp_path / "a.model", "unigram", 60)
    subword.learn_sentencepiece([train], tmp_path / "b.model", "unigram", 60)
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
    with pytest.raises(PrepError, match=r"failed: Vocabulary size too high \(100000\)\. Please set it to a "
                                        r"value <= \d+\. \(see --spm-vocab-size"):
        subword.learn_sentencepiece([train], tmp_path / "c.model", "unigram", 100000)
    assert not (tmp_path / "c.model").exists()


def test_a_char_model_with_fewer_pieces_than_asked_is_refused_not_recorded_as_asked(tmp_path):
    # --spm-model-type char --spm-vocab-size 300 made a model of the text's characters, and the record said 300
    train = tmp_path / "train.txt"
    train.write_text("the cat sat on the mat\nthe dog ran\n" * 50)
    chars = len(set("the cat sat on the mat the dog ran") - {" "})  # sentencepiece's <unk>, <s>, </s> and ▁ besides
    with pytest.raises(PrepError, match=rf"sentencepiece's char model of {train} has {chars + 4} pieces \(for a char "
                                        rf"model: the training text's characters\), not --spm-vocab-size 300: pass "
                                        rf"--spm-vocab-size {chars + 4}$"):
        subword.learn_sentencepiece([train], tmp_path / "c.model", "char", 300)
    assert not (tmp_path / "c.model").exists() and not list(tmp_path.glob("spm-partial*"))
    subword.learn_sentencepiece([train], tmp_path / "c.model", "char", chars + 4)
    assert (tmp_path / "c.model").is_file()


def test_a_folder_without_a_record_decodes_as_bpe(tmp_path):
    assert subword.read_subword(tmp_path) == {"kind": "bpe", "codes": "code"}
    assert subword.post_process_args(subword.read_subword(tmp_path)) == ["--remove-bpe", "@@ "]
    (tmp_path / "code").write_text("a b\n")  # Python use needs the file (test_subword_evidence: when it is missing)
    assert subword.hub_options(tmp_path)["bpe_codes"] == str(tmp_path / "code")


def test_decoding_joins_the_pieces_of_the_folder_it_was_made_from(tmp_path):
    """A test sample's or a sources view's folder holds no record: the caller passes the data folder's."""
    from man_recipes.evaluation.decode import generate_args

    cfg = {"eval": {"remove_bpe": "@@ "}}
    spm = {"kind": "sentencepiece", "model": "spm.model"}
    argv = generate_args(cfg, tmp_path, "ckpt.pt", "test", "cpu", "fp32", 8, spm)
    assert argv[argv.index("--post-process") + 1] == "sentencepiece" and "--remove-bpe" not in argv
    argv = generate_args(cfg, tmp_path, "ckpt.pt", "test", "cpu", "fp32", 8)  # no record: BPE
    assert argv[argv.index("--remove-bpe") + 1] == "@@ " and "--post-process" not in argv


def test_the_records_tokenizer_options_are_the_documented_ones():
    """The ``tokenizer`` field of each recipe's record is docs/python-api.md's row (checked against
    data-prep's tokenizer in test_python_api)."""
    from test_python_api import TOKENIZERS
    from man_recipes.corpora import CORPORA

    fields = {c.dest.format(src="de", tgt="en"): c.tokenizer for c in CORPORA.values()}
    for folder, (_, keywords, _) in TOKENIZERS.items():
        assert ", ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in fields[folder].items()) \
            == keywords, folder
    assert CORPORA["gigaword"].tokenizer == {}
