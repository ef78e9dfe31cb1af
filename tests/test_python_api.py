"""Python use of every family, as docs/python-api.md shows it: ``TransformerModel.from_pretrained``
on a run folder with its data folder, the BPE codes stored there and the Moses tokenizer, then
``translate`` / ``sample`` on raw text; and ``fairseq-interactive`` on the same raw text.

The data folder is made as data-prep makes one (the project's Moses tokenizer, joint subword-nmt
BPE learned on the training split, ``fairseq-preprocess --joined-dictionary``, the codes stored as
``code`` in the folder) from a small synthetic raw corpus with capitals, punctuation, apostrophes
and quotes; one tiny model per family is trained a few updates with the real fairseq-train."""

import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, TINY_MODEL, TINY_TRAIN, USER_DIR, child_env, run_bounded, run_cli

from man_recipes.data.dataprep import apply_bpe_lines, learn_bpe, tokenize_lines

SRC, TGT = "en", "de"
FAMILIES = {
    "transformer": ["--arch", "transformer"],
    "man": ["--arch", "transformer_man_small"],
    "localness": ["--arch", "transformer_localness_small", "--localness-layers", "0,1"],
    "diffwin": ["--arch", "transformer_diffwin_small", "--diffwin-layers", "2", "--diffwin-segment-size", "3"],
    "calibrated": ["--arch", "transformer_calibrated_small", "--criterion", "calibrated_label_smoothed_cross_entropy"],
    "masked": ["--arch", "transformer_masked_small", "--encoder-sublayers", "dman,san,ffn", "--localness-attention-types",
               "encoder_self", "--localness-layers", "0", "--calibration-layers", "all",
               "--criterion", "calibrated_label_smoothed_cross_entropy"],
}
MODEL_CLASS = {"transformer": "TransformerModel", "man": "TransformerMANModel", "localness": "TransformerLocalnessModel",
               "diffwin": "TransformerDiffWinModel", "calibrated": "TransformerCalibratedModel",
               "masked": "TransformerMaskedModel"}
# a raw sentence with what Moses escapes and splits, and a word BPE splits (not in the corpus)
RAW = 'The doctor\'s "new" bicycle isn\'t colder, is it?'
# decode() detokenizes with the target language's rules: a round trip of text in that language
RAW_TGT = 'Der Lehrer hat ein "rote" Fahrrad, nicht?'

WORDS = {"the": "der", "a": "ein", "doctor": "Arzt", "teacher": "Lehrer", "child": "Kind", "dog": "Hund",
         "cat": "Katze", "new": "neue", "old": "alte", "red": "rote", "small": "kleine", "bicycle": "Fahrrad",
         "house": "Haus", "car": "Auto", "is": "ist", "sees": "sieht", "has": "hat", "likes": "mag",
         "near": "nahe", "and": "und", "it": "es", "not": "nicht", "very": "sehr"}


def raw_pairs(n, seed):
    """(English, pseudo-German) sentences: word for word, with capitals, commas, quotes, 's and n't."""
    rng = random.Random(seed)
    nouns = ["doctor", "teacher", "child", "dog", "cat", "bicycle", "house", "car"]
    adjs = ["new", "old", "red", "small"]
    pairs = []
    for _ in range(n):
        a, b = rng.sample(nouns, 2)
        adj = rng.choice(adjs)
        verb = rng.choice(["sees", "has", "likes"])
        en = [w for w in ("the", a, verb, "a", adj, b) if w]
        de = [WORDS[w] for w in en]
        form = rng.randrange(4)
        if form == 0:
            en_s, de_s = " ".join(en) + ".", " ".join(de) + "."
        elif form == 1:
            en_s, de_s = " ".join(en[:2]) + "'s " + " ".join(en[2:]) + ", and it isn't " + adj + "!", \
                " ".join(de[:2]) + "s " + " ".join(de[2:]) + ", und es ist nicht " + WORDS[adj] + "!"
        elif form == 2:
            en_s, de_s = " ".join(en[:-1]) + ' "' + b + '" near the house?', \
                " ".join(de[:-1]) + ' "' + WORDS[b] + '" nahe der Haus?'
        else:
            en_s, de_s = " ".join(en) + ", is it very " + adj + "?", " ".join(de) + ", ist es sehr " + WORDS[adj] + "?"
        pairs.append((en_s[0].upper() + en_s[1:], de_s[0].upper() + de_s[1:]))
    return pairs


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    """A data folder as data-prep makes one: Moses-tokenized, joint BPE, binarized, codes as ``code``."""
    tmp = tmp_path_factory.mktemp("python_api")
    tok, prep = tmp / "tok", tmp / "prep"
    tok.mkdir()
    prep.mkdir()
    for split, n, seed in (("train", 300, 1), ("valid", 20, 2), ("test", 10, 3)):
        pairs = raw_pairs(n, seed)
        for i, lang in enumerate((SRC, TGT)):
            lines = tokenize_lines([p[i] for p in pairs], lang)
            (tok / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    learn_bpe([tok / f"train.{SRC}", tok / f"train.{TGT}"], tmp / "code", 60)  # some words stay split
    for split in ("train", "valid", "test"):
        for lang in (SRC, TGT):
            lines = (tok / f"{split}.{lang}").read_text().splitlines()
            (prep / f"{split}.{lang}").write_text("\n".join(apply_bpe_lines(lines, tmp / "code")) + "\n")
    data = tmp / "data-bin"
    run_cli(["fairseq-preprocess", "--source-lang", SRC, "--target-lang", TGT, "--trainpref", prep / "train",
             "--validpref", prep / "valid", "--testpref", prep / "test", "--destdir", data, "--joined-dictionary",
             "--workers", "1"])
    shutil.copy2(tmp / "code", data / "code")
    return data


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    """One run folder per family, its checkpoints in checkpoints/ as scripts/train.sh writes them, a
    few updates of fairseq-train each (TINY_TRAIN's criterion comes first: the calibrated one given
    later wins)."""
    root = tmp_path_factory.mktemp("python_api_runs")
    commands = [["fairseq-train", data_bin, "--user-dir", USER_DIR, "--share-all-embeddings", *TINY_MODEL,
                 *TINY_TRAIN, *options, "--max-update", "6", "--disable-validation", "--save-dir", root / family / "checkpoints"]
                for family, options in FAMILIES.items()]
    with ThreadPoolExecutor(len(commands)) as pool:  # their start-up dominates, not compute
        for future in [pool.submit(run_cli, c, env={"OMP_NUM_THREADS": "1"}) for c in commands]:
            future.result()
    return {family: root / family for family in FAMILIES}


def load(run, data_bin):
    from fairseq.models.transformer import TransformerModel

    import man_fairseq  # noqa: F401  (registers the families; user_dir= works as well)

    return TransformerModel.from_pretrained(
        str(run), checkpoint_file="checkpoints/checkpoint_last.pt", data_name_or_path=str(data_bin),
        bpe="subword_nmt", bpe_codes=str(data_bin / "code"), tokenizer="moses", moses_no_dash_splits=True,
        source_lang=SRC, target_lang=TGT)


@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_translates_raw_text(family, runs, data_bin):
    hub = load(runs[family], data_bin).eval()
    assert type(hub.models[0]).__name__ == MODEL_CLASS[family]
    # what the hub does around the model: Moses (English rules split "doctor's", ' and " escaped), BPE
    # (an unseen word in pieces), the joined dictionary; back: BPE joined, Moses detokenization (German rules)
    pieces = hub.apply_bpe(hub.tokenize(RAW))
    assert "&apos;@@ s &quot; new &quot;" in pieces and "c@@ o@@ l@@ " in pieces
    assert hub.src_dict.unk() not in hub.encode(RAW).tolist()
    assert "@@ " in hub.apply_bpe(hub.tokenize(RAW_TGT)) and hub.decode(hub.encode(RAW_TGT)) == RAW_TGT
    out = hub.translate(RAW, beam=2, max_len_b=12)
    assert isinstance(out, str) and out.strip()
    assert "@@" not in out and "&quot;" not in out and "&apos;" not in out
    # translate is sample; a list in, a list out, each sentence as on its own
    assert hub.sample(RAW, beam=2, max_len_b=12) == out
    assert hub.translate([RAW, "A dog."], beam=2, max_len_b=12)[0] == out
    # the same text as the hub's own steps: generate on the encoded input, decode the best hypothesis
    best = hub.generate([hub.encode(RAW)], beam=2, max_len_b=12)[0][0]["tokens"]
    assert out == hub.decode(best) == hub.detokenize(hub.remove_bpe(hub.string(best)))


def test_user_dir_instead_of_import(runs, data_bin):
    """from_pretrained(user_dir=...) loads a family in a process that never imported man_fairseq."""
    code = ("from fairseq.models.transformer import TransformerModel; import sys\n"
            f"hub = TransformerModel.from_pretrained({str(runs['man'])!r}, checkpoint_file='checkpoints/checkpoint_last.pt', "
            f"data_name_or_path={str(data_bin)!r}, bpe='subword_nmt', bpe_codes={str(data_bin / 'code')!r}, "
            f"tokenizer='moses', moses_no_dash_splits=True, source_lang={SRC!r}, target_lang={TGT!r}, user_dir={USER_DIR!r})\n"
            f"print('MODEL', type(hub.models[0]).__name__, 'man_fairseq' in sys.modules)\n"
            f"print('OUT', hub.translate({RAW!r}, beam=2, max_len_b=12))")
    proc = run_cli([sys.executable, "-c", code])
    printed = {l.split(" ", 1)[0]: l.split(" ", 1)[1] for l in proc.stdout.splitlines() if l.startswith(("MODEL ", "OUT "))}
    assert printed["MODEL"] == "TransformerMANModel True"
    assert printed["OUT"] == load(runs["man"], data_bin).eval().translate(RAW, beam=2, max_len_b=12)


def test_interactive_on_raw_text(runs, data_bin):
    """fairseq-interactive with --tokenizer moses --bpe subword_nmt --bpe-codes: raw text in,
    detokenized text out (its D- lines), the same as the Python hub's."""
    cmd = ["fairseq-interactive", data_bin, "--user-dir", USER_DIR, "--path", runs["man"] / "checkpoints" / "checkpoint_last.pt",
           "--source-lang", SRC, "--target-lang", TGT, "--tokenizer", "moses", "--moses-no-dash-splits", "--bpe", "subword_nmt",
           "--bpe-codes", data_bin / "code", "--beam", "2", "--max-len-b", "12", "--cpu"]
    proc = run_bounded(cmd, 300, input=RAW + "\nA dog.\n", env=child_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    source = [l.split("\t", 1)[1] for l in lines if l.startswith("S-0\t")]
    assert source and "&quot; new &quot;" in source[0] and "@@ " in source[0]  # what the model saw
    detok = {int(l.split("\t")[0][2:]): l.split("\t")[2] for l in lines if l.startswith("D-")}
    hub = load(runs["man"], data_bin).eval()
    assert [detok[0], detok[1]] == hub.translate([RAW, "A dog."], beam=2, max_len_b=12)


# docs/python-api.md's table: data folder -> (data-prep's tokenize_lines options, fairseq's tokenizer
# keywords as the table writes them, whether the input is lowercased first)
TOKENIZERS = {
    "multi30k.de-en": (dict(), 'tokenizer="moses", moses_no_dash_splits=True', False),
    "iwslt14.tokenized.de-en": (dict(lowercase=True), 'tokenizer="moses", moses_no_dash_splits=True', True),
    "wmt14_en_de": (dict(aggressive=True), 'tokenizer="moses"', False),
    "cnndm": (dict(escape=False, lowercase=True),
              'tokenizer="moses", moses_no_dash_splits=True, moses_no_escape=True', True),
}
SENTENCES = ['A well-known "cat" sits on the mat, doesn\'t it?', "Zwei Männer & ein T-Shirt: 3.5 Euro (oder mehr)!",
             "The dog's toy <is> red | blue."]


@pytest.mark.parametrize("folder", TOKENIZERS)
def test_documented_tokenizer_options_tokenize_as_data_prep(folder):
    from argparse import Namespace

    from fairseq.data import encoders

    prep_options, keywords, lowercased = TOKENIZERS[folder]
    row = next(l for l in (REPO / "docs" / "python-api.md").read_text().splitlines() if l.startswith(f"| `{folder}`"))
    assert f"`{keywords}`" in row
    options = dict(kv.split("=") for kv in keywords.replace('"', "").split(", "))
    for lang in ("en", "de"):
        tokenizer = encoders.build_tokenizer(Namespace(
            tokenizer=options["tokenizer"], source_lang=lang, target_lang=lang,
            moses_no_dash_splits="moses_no_dash_splits" in options, moses_no_escape="moses_no_escape" in options))
        ours = tokenize_lines(SENTENCES, lang, **prep_options)
        assert [tokenizer.encode(s.lower() if lowercased else s) for s in SENTENCES] == ours


@pytest.mark.parametrize("wrong", ["run", "checkpoint", "data"])
def test_from_pretrained_names_a_path_that_does_not_exist(tmp_path, wrong):
    """Each was a TypeError on None from fairseq's archive lookup (issue #72 item 6)."""
    import man_fairseq  # noqa: F401  (its fixes)
    from fairseq.models.transformer import TransformerModel

    run, data = tmp_path / "run", tmp_path / "data"
    (run / "checkpoints").mkdir(parents=True)
    data.mkdir()
    (run / "checkpoints" / "checkpoint_best.pt").write_bytes(b"")
    given = {"run": (tmp_path / "no-run", "checkpoints/checkpoint_best.pt", data),
             "checkpoint": (run, "checkpoint_best.pt", data),
             "data": (run, "checkpoints/checkpoint_best.pt", tmp_path / "no-data")}[wrong]
    message = {"run": f"from_pretrained: the run folder {tmp_path / 'no-run'} does not exist",
               "checkpoint": f"from_pretrained: checkpoint_file 'checkpoint_best.pt' is not in the run folder {run} "
                             "(it is relative to it)",
               "data": f"from_pretrained: the data folder {tmp_path / 'no-data'} (data_name_or_path, the folder with "
                       "the dictionaries) does not exist"}[wrong]
    with pytest.raises(FileNotFoundError) as e:
        TransformerModel.from_pretrained(str(given[0]), checkpoint_file=given[1], data_name_or_path=str(given[2]))
    assert str(e.value) == message
