"""The CNN/DM CPU study (``scripts/reproduce.sh cnndm-cpu``): its families, the lead-3 baseline,
and the fixed test sample it is scored on (the same articles for every run and the lead)."""

import json
import random
import sys

import pytest

from man_recipes.studies.rouge_significance import lead_sentences
from man_recipes.evaluation.fixed_sample import sample_ids, sampled_split
from conftest import REPO, TINY_MODEL
from test_multi30k import run


def test_lead_sentences_end_at_final_punctuation_and_its_closing_quotes():
    article = "a b . c d ! '' says he . e -lrb- f -rrb- ? g h . i j ."
    assert lead_sentences(article, 3) == "a b . c d ! '' says he ."
    assert lead_sentences(article, 1) == "a b ."
    assert lead_sentences("q . '' r . s .", 1) == "q . ''"  # a quote closing the sentence stays with it
    assert lead_sentences("no final punctuation", 3) == "no final punctuation"
    assert lead_sentences("one . two .", 3) == "one . two ."


def test_sample_ids_are_fixed_sorted_and_distinct():
    ids = sample_ids(1000, 50)
    assert ids == sample_ids(1000, 50) and ids == sorted(set(ids)) and len(ids) == 50 and ids[-1] < 1000
    assert ids != sample_ids(1000, 50, seed=2)
    assert sample_ids(7, 10) == list(range(7))


def test_sampled_split_holds_exactly_the_sampled_pairs(toy_data_bin, tmp_path):
    from fairseq.data import indexed_dataset

    def items(folder, lang):
        ds = indexed_dataset.make_dataset(str(folder / f"test.src-tgt.{lang}"), impl="mmap")
        return [ds[i].tolist() for i in range(len(ds))]

    dest = sampled_split(toy_data_bin, "test", "src", "tgt", [1, 5, 7], tmp_path / "sample")
    for lang in ("src", "tgt"):
        whole = items(toy_data_bin, lang)
        assert items(dest, lang) == [whole[1], whole[5], whole[7]]
        assert (dest / f"dict.{lang}.txt").read_text() == (toy_data_bin / f"dict.{lang}.txt").read_text()
    built = (dest / "test.src-tgt.src.bin").stat().st_mtime_ns
    assert sampled_split(toy_data_bin, "test", "src", "tgt", [1, 5, 7], dest) == dest
    assert (dest / "test.src-tgt.src.bin").stat().st_mtime_ns == built  # the same sample: reused
    sampled_split(toy_data_bin, "test", "src", "tgt", [0, 2], dest)
    assert items(dest, "src") == [items(toy_data_bin, "src")[i] for i in (0, 2)]  # another: rebuilt
    assert not (tmp_path / "sample.partial").exists()


def test_cnndm_cpu_trains_only_the_families_it_has_configs_for(capsys):
    from man_recipes.config import load_config
    from man_recipes.studies import reproduce
    from man_recipes.studies.experiments import EXPERIMENTS, families_of

    assert families_of("cnndm-cpu") == ["transformer", "man", "localness"]
    assert families_of("gigaword-cpu") == reproduce.FAMILIES + ["calibration-alpha0.01", "man-zeros"]
    for fam in families_of("cnndm-cpu"):
        cfg = load_config(EXPERIMENTS["cnndm-cpu"]["configs"] / f"{fam}.yaml")
        assert cfg["eval"]["test_sample"] == 2000 and cfg["train"]["max-tokens"] == 8192
    with pytest.raises(SystemExit) as e:
        reproduce.main(["cnndm-cpu", "--families", "sman2"])
    assert e.value.code == 2
    assert "unknown families ['sman2'] for cnndm-cpu; choose from ['transformer', 'man', 'localness']" in capsys.readouterr().err


def test_cnndm_cpu_measures_mans_floor_and_sman2_beside_its_families():
    """scripts/speed.sh cnndm-cpu measures man-nobias (MAN's floor) and SMAN2 (issue 80) from configs of the
    study's training; reproduce.sh does not train them (above)."""
    from man_recipes.config import load_config
    from man_recipes.studies.experiments import EXPERIMENTS, parse_families, speed_families_of

    assert speed_families_of("cnndm-cpu") == ["transformer", "man", "localness", "man-nobias", "sman2"]
    assert parse_families("cnndm-cpu", None, speed=True)[1] == speed_families_of("cnndm-cpu")
    assert parse_families("cnndm-cpu", "sman2", speed=True)[1] == ["transformer", "sman2"]
    configs = EXPERIMENTS["cnndm-cpu"]["configs"]
    man = load_config(configs / "man.yaml")
    nobias, sman2 = (load_config(configs / f"{fam}.yaml") for fam in ("man-nobias", "sman2"))
    assert nobias["model"] == dict(man["model"], **{"encoder-sublayers": "san,san,ffn"})
    assert sman2["model"] == dict(man["model"], **{"encoder-sublayers": "sman2,san,ffn", "static-mask-window": 4})
    for cfg in (nobias, sman2):
        assert cfg["arch"] == man["arch"] and cfg["train"] == man["train"] and cfg["eval"] == man["eval"]


def test_the_runs_must_agree_on_their_test_sample():
    from man_recipes.studies.study_eval import StudyEvalError
    from man_recipes.studies.summarization_table import record_samples

    manifest = {"test_sets": {"test": "val"}, "counts": {"test": 100}}
    spec = {"n": 10, "of": 100, "seed": 1}
    a, b = ({"test_sets": {"test": {"sample": s}}} for s in (spec, dict(spec, n=20)))
    assert record_samples([a, a], manifest) == {"test": sample_ids(100, 10)}
    assert record_samples([{"test_sets": {"test": {}}}], manifest) == {"test": None}
    with pytest.raises(StudyEvalError, match="different samples of test"):
        record_samples([a, b], manifest)
    with pytest.raises(StudyEvalError, match="drawn from 100 pairs; the data folder's test has 90"):
        record_samples([a], dict(manifest, counts={"test": 90}))


def test_a_sample_of_every_pair_is_scored_under_one_fingerprint():
    """--test-sample 0 and one above the test set's size both score all of it: one record, not two."""
    from man_recipes.config import load_config
    from man_recipes.studies import reproduce
    from man_recipes.studies.experiments import EXPERIMENTS
    from man_recipes.studies.study_records import record_fingerprint

    exp = EXPERIMENTS["cnndm-cpu"]
    cfg = load_config(exp["configs"] / "man.yaml")  # eval.test_sample: 2000
    manifest = {"test_sets": {"test": "val"}, "counts": {"test": 13368}}

    def fingerprint(test_sample):
        args = reproduce.parse_args(["cnndm-cpu", *(["--test-sample", str(test_sample)] if test_sample is not None
                                                    else [])])
        return record_fingerprint(reproduce.scoring_config(cfg, exp, args, manifest), args, 1)
    everything = {fingerprint(0), fingerprint(13368), fingerprint(20000)}
    assert len(everything) == 1
    assert len({*everything, fingerprint(None), fingerprint(2000), fingerprint(13367)}) == 3  # None is 2000
    assert fingerprint(None) == fingerprint(2000)
    small = dict(manifest, counts={"test": 300})  # the config's own 2,000 of a 300-pair test set: all of it
    args = reproduce.parse_args(["cnndm-cpu"])
    assert "test_sample" not in reproduce.scoring_config(cfg, exp, args, small)["eval"]


def tiny_see_release(root, seed=7):
    """See et al.'s text layout as cnndm-see names its splits, with a learnable toy task: the summary
    is the article's first sentence."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(50)]

    def sentence():
        return " ".join(rng.choice(words) for _ in range(rng.randint(4, 7))) + " ."
    root.mkdir(parents=True)
    for split, n in (("train", 240), ("dev", 20), ("val", 30)):
        arts = [" ".join(sentence() for _ in range(4)) for _ in range(n)]
        (root / f"{split}.article.txt").write_text("\n".join(arts) + "\n")
        (root / f"{split}.abstract.tagged.txt").write_text(
            "\n".join(f"<s> {a.split(' . ')[0]} . </s>" for a in arts) + "\n")
    return root


def test_cnndm_study_end_to_end_on_a_test_sample(tmp_path, rouge155_perl):
    data = tmp_path / "bin"
    run([REPO / "data-prep" / "prepare-cnndm.sh", "--from", tiny_see_release(tmp_path / "see"), "--work",
         tmp_path / "w", "--dest", data, "--bpe-merges", "100", "--allow-nonstandard-splits", "--workers", "1"])
    cmd = [sys.executable, "-m", "man_recipes.studies.reproduce", "cnndm-cpu", "--seeds", "1,",
           "--families", "localness", "--data", data, "--runs-dir", tmp_path / "runs", "--results-dir",
           tmp_path / "results", "--test-sample", "12", "--bootstrap-samples", "100", "--",
           *TINY_MODEL, "--max-epoch", "1", "--max-tokens", "2000", "--warmup-updates", "4", "--lr", "0.003",
           "--save-interval-updates", "2"]
    run(cmd)
    results = tmp_path / "results"
    table = json.loads((results / "cnndm-cpu.json").read_text())
    articles = (data / "test.raw.source").read_text().splitlines()
    refs = (data / "test.raw.target").read_text().splitlines()
    ids = sample_ids(30, 12)
    for r in table["runs"]:
        scored = r["test_sets"]["test"]
        assert scored["sample"] == {"n": 12, "of": 30, "seed": 1} and scored["n_sentences"] == 12
        assert "12 of its 30 pairs sampled" in scored["name"]
        # mid-epoch checkpoints are validated too: more curve points than epochs, which count once
        assert r["epochs"] == 1 and len(r["valid_curve"]) > 1
        assert len((results / "cnndm-cpu" / f"{r['family']}-seed1.test.hyp").read_text().splitlines()) == 12
    assert {r["family"] for r in table["runs"]} == {"transformer", "localness"}
    # lead-3 on the same 12 articles: the first sentence of each is its reference, so ROUGE-1 recall is 1
    # and precision about a third; on every article it would be scored against other references
    lead = next(r for r in table["references"] if r["what"].startswith("Lead-3"))
    from man_recipes import scoring

    expected = scoring.rouge([lead_sentences(articles[i], 3) for i in ids], [refs[i] for i in ids],
                             order="hyp-ref", exception_db="files2rouge")
    assert lead["rouge1"] == pytest.approx(expected["rouge1"])
    md = (results / "cnndm-cpu.md").read_text()
    assert "Lead-3 (first 3 sentences of the article)" in md and "standard 11,490-article test split" in md
    # the command of one run reads and writes where this table's runs did: another data folder, results folder
    assert (f"`scripts/reproduce.sh cnndm-cpu --seeds 1, --families FAMILY --data {data} --results-dir {results} "
            "--test-sample 12 -- ") in md
    assert md.splitlines()[0].endswith(f"[data `{data}`, bpe subwords] [with fairseq options `{' '.join(cmd[cmd.index('--') + 1:])}`, "
                                       "which override the configs' values above]")


@pytest.mark.parametrize("experiment", ["multi30k-cpu", "gigaword-cpu"])
def test_the_short_sentence_studies_measure_the_floor_of_man_and_sman2(experiment):
    """At 30-token sentences SMAN2's distance to the Transformer is its second attention sublayer (docs/speed.md):
    scripts/speed.sh measures man-nobias there too, after the study's families; reproduce.sh does not train it."""
    from man_recipes.config import load_config
    from man_recipes.studies.experiments import EXPERIMENTS, families_of, speed_families_of

    assert speed_families_of(experiment) == families_of(experiment) + ["man-nobias"]
    assert "man-nobias" not in families_of(experiment)
    configs = EXPERIMENTS[experiment]["configs"]
    man, nobias = (load_config(configs / f"{fam}.yaml") for fam in ("man", "man-nobias"))
    assert nobias["model"] == dict(man["model"], **{"encoder-sublayers": "san,san,ffn"})
    assert nobias["arch"] == man["arch"] and nobias["train"] == man["train"] and nobias["eval"] == man["eval"]
