"""The summarization study (``scripts/reproduce.sh gigaword-cpu``): Gigaword data-prep's record
and references, ROUGE as files2rouge computes it (its empty exception database by default),
per-document ROUGE and its paired bootstrap, and the study end to end on a tiny release."""

import gzip
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from man_recipes import rouge155
from man_recipes.evaluation.copying import copying
from man_recipes.studies.rouge_significance import lead_words, paired_bootstrap
from conftest import REPO, TINY_MODEL
from test_multi30k import run


def test_paired_bootstrap_over_documents():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.4, 500)
    better = base + 0.05
    shift = rng.normal(0, 0.05, 500)
    noise = base + shift - shift.mean()  # as good on average, different per document
    same = paired_bootstrap(base, base)
    assert same["p_value"] == 1.0  # nothing to test, not "significant"
    clear = paired_bootstrap(base, better)
    assert clear["p_value"] < 0.01 and clear["system"] > clear["baseline"]
    assert paired_bootstrap(better, base)["p_value"] == clear["p_value"]  # two-sided
    assert paired_bootstrap(base, noise)["p_value"] > 0.05
    assert paired_bootstrap(base, noise) == paired_bootstrap(base, noise)  # seeded
    with pytest.raises(ValueError, match="3 baseline and 2 system"):
        paired_bootstrap([0.1, 0.2, 0.3], [0.1, 0.2])


def test_per_document_scores_follow_the_lines(rouge155_perl):
    # 12 documents: ROUGE numbers them in file-name order (s.0, s.1, s.10, s.11, s.2, ...)
    refs = [f"alpha{i} beta{i} gamma{i}" for i in range(12)]
    hyps = [refs[i] if i % 3 == 0 else f"delta{i} epsilon{i}" for i in range(12)]
    out, _ = rouge155.run(hyps, refs, empty_scores_zero=True, per_document=True)
    docs = rouge155.document_f(out, 12)
    assert docs["rouge1"] == [1.0 if i % 3 == 0 else 0.0 for i in range(12)]
    assert docs["rougeL"] == docs["rouge1"]


def test_lead_words():
    assert lead_words("a  b c d e f g h i j", 8) == "a b c d e f g h" and lead_words("x", 8) == "x"


def test_man_files2rouge_prints_files2rouge_numbers_on_gigaword(shared_data, tmp_path, rouge155_perl):
    """Lead-8 of the standard Gigaword test: genuine files2rouge (pltrdy/files2rouge + pyrouge, measured
    outside this project) prints ROUGE-1 Average_F 0.21299; with the full WordNet database 0.21384."""
    giga = shared_data / "gigaword-30k" / "Giga"
    lead = tmp_path / "lead8.txt"
    lead.write_text("\n".join(lead_words(a, 8) for a in (giga / "input.txt").read_text().splitlines()) + "\n")
    default = run(["man-files2rouge", giga / "task1_ref0.txt", lead]).stdout
    assert "1 ROUGE-1 Average_F: 0.21299 " in default
    wordnet = run(["man-files2rouge", giga / "task1_ref0.txt", lead, "--exception-db", "wordnet"]).stdout
    assert "1 ROUGE-1 Average_F: 0.21384 " in wordnet


def test_gigaword_30k_layout_and_record(shared_data, tmp_path):
    dest = tmp_path / "bin"
    run([REPO / "data-prep" / "prepare-gigaword.sh", "--from", shared_data / "gigaword-30k", "--work", tmp_path / "w",
         "--dest", dest, "--bpe-merges", "1000", "--allow-nonstandard-splits"])
    record = json.loads((dest / "gigaword.json").read_text())
    assert record["counts"] == record["release_counts"] == {"train": 29911, "valid": 1000, "test": 1951}
    assert record["nonstandard"] and record["subset"].startswith("gigaword-30k:")
    assert record["options"]["bpe_merges"] == 1000 and record["test_sets"] == {"test": "Gigaword test (Rush et al. 2015, Giga/)"}
    giga = shared_data / "gigaword-30k" / "Giga"
    assert (dest / record["references"]["test"]).read_text().splitlines() == [
        " ".join(t.lower().split()) for t in (giga / "task1_ref0.txt").read_text().splitlines()]
    assert len((dest / record["sources"]["test"]).read_text().splitlines()) == 1951
    assert [len((dest / record[side]["valid"]).read_text().splitlines()) for side in ("sources", "references")] == [1000, 1000]


def tiny_release(root, seed=5):
    """The sent-summary layout with a learnable toy task: the title is the article's first words."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(60)]

    def pairs(n):
        arts = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 14))) for _ in range(n)]
        return arts, [" ".join(a.split()[:4]) for a in arts]
    (root / "train").mkdir(parents=True)
    (root / "Giga").mkdir()
    for name, n in (("train/train.{}.txt.gz", 300), ("train/valid.{}.filter.txt.gz", 30)):
        arts, titles = pairs(n)
        for side, lines in (("article", arts), ("title", titles)):
            with gzip.open(root / name.format(side), "wt") as f:
                f.write("\n".join(lines) + "\n")
    arts, titles = pairs(40)
    (root / "Giga/input.txt").write_text("\n".join(arts) + "\n")
    (root / "Giga/task1_ref0.txt").write_text("\n".join(titles) + "\n")
    return root


def test_gigaword_study_end_to_end(tmp_path, rouge155_perl):
    release = tiny_release(tmp_path / "sumdata")
    data = tmp_path / "bin"
    run([REPO / "data-prep" / "prepare-gigaword.sh", "--from", release, "--work", tmp_path / "w", "--dest", data,
         "--bpe-merges", "100", "--allow-nonstandard-splits"])
    cmd = [sys.executable, "-m", "man_recipes.studies.reproduce", "gigaword-cpu", "--seeds", "1,", "--families", "man",
           "--device", "cpu", "--data", data, "--runs-dir", tmp_path / "runs", "--results-dir", tmp_path / "results",
           "--avg-last", "1", "--bootstrap-samples", "100", "--",
           *TINY_MODEL, "--max-epoch", "1", "--max-tokens", "1500", "--warmup-updates", "4", "--lr", "0.003"]
    out = run(cmd).stdout
    results = tmp_path / "results"
    table = json.loads((results / "gigaword-cpu.json").read_text())
    man, transformer = table["runs"]
    for r in (man, transformer):
        scores = r["test_sets"]["test"]
        assert scores["n_sentences"] == 40 and scores["exception_db"] == "files2rouge"
        assert scores["rouge_order"] == "hyp-ref" and "files2rouge" in scores["rouge_implementation"]
        assert all(0 <= scores[k] <= 100 for k in ("rouge1", "rouge2", "rougeL"))
        hyps = (results / "gigaword-cpu" / f"{r['family']}-seed1.test.hyp").read_text().splitlines()
        assert len(hyps) == 40
    boot = man["paired_bootstrap"]["test"]
    assert set(boot) == {"rouge1", "rouge2", "rougeL"} and boot["rouge1"]["n_documents"] == 40
    assert boot["rouge1"]["system"] == pytest.approx(man["test_sets"]["test"]["rouge1"], abs=1.0)
    md = (results / "gigaword-cpu.md").read_text()
    assert "| Transformer (small) |" in md and "| MAN (small, DMAN enc.) |" in md and "Lead-8" in md
    lead = next(r for r in table["references"] if r["what"].startswith("Lead-8"))
    assert lead["rouge1"] > 50  # the toy titles are the articles' first 4 words
    assert lead["lead_subset"] == "test"  # the figure draws it as the score panels' baseline line
    # the toy titles are their article's first words: every word and bigram is found there
    assert table["references_copying"]["test"] == {"words": 1.0, "bigrams": 1.0,
                                                   "bigrams_chance": table["references_copying"]["test"]["bigrams_chance"]}
    copied = table["summary"]["man"]["test_sets"]["test"]["copying"][0]
    assert 0 <= copied["words"] <= 1 and "| from its article: words / bigrams |" in md
    assert "ROUGE-1/2/L" in out and (results / "gigaword-cpu.png").stat().st_size > 10_000
    # a score edited by hand is not what its hypotheses give: refused in one line, never tabulated
    record_path = results / "gigaword-cpu" / "man-seed1.json"
    kept = record_path.read_text()
    edited = json.loads(kept)
    edited["test_sets"]["test"]["rouge1"] = 45.0
    record_path.write_text(json.dumps(edited))
    refused = run(cmd[:cmd.index("--")] + ["--table-only"] + cmd[cmd.index("--"):], check=False)
    assert refused.returncode == 2 and f"{record_path}: its rouge1 on test is 45.00, but its hypotheses" in refused.stdout
    record_path.write_text(kept)
    # another exception database is another scoring: today's records do not match it
    again = run(cmd[:cmd.index("--")] + ["--rouge-exception-db", "wordnet", "--table-only"] + cmd[cmd.index("--"):],
                check=False)
    assert again.returncode == 2 and "stale record man-seed1" in again.stdout
    check_dev_set_rouge(cmd, results, data)
    check_both_protocols(cmd, results, data)


def check_both_protocols(study_cmd, results, data):
    """The same runs trained to convergence (here the cap of the study's one epoch stops them) join the
    table beside the fixed budget's, each with its ROUGE and how much of its summaries its articles hold."""
    cmd = [c if c != "gigaword-cpu" else "gigaword-cpu-converge" for c in study_cmd]
    i = cmd.index("--avg-last")  # a run to convergence is scored on its best checkpoint, never an average
    del cmd[i:i + 2]
    cmd[cmd.index("--runs-dir") + 1] = Path(str(cmd[cmd.index("--runs-dir") + 1]) + "-converge")
    run(cmd)
    table = json.loads((results / "gigaword-cpu.json").read_text())
    converged = {r["family"]: r for r in table["to_convergence"]["runs"]}
    assert set(converged) == {"man", "transformer"} and converged["man"]["stopped_by"] == "cap"
    for fam, r in converged.items():
        copied = r["copying"]["test"]
        hyps = (results / "gigaword-cpu-converge" / f"{fam}-seed1.test.hyp").read_text().splitlines()
        assert copied == copying(hyps, (data / "test.raw.article").read_text().splitlines())
    md = (results / "gigaword-cpu.md").read_text()
    per_seed, per_family = md.split("## Fixed budget | to convergence")[1].split("Per family, over the seeds")
    (row,) = [line for line in per_seed.splitlines() if line.startswith("| MAN (small, DMAN enc.) | 1 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    fixed_copied = table["summary"]["man"]["test_sets"]["test"]["copying"][0]
    assert cells[4].endswith(f"; {fixed_copied['words']:.2f} / {fixed_copied['bigrams']:.2f}")
    conv_copied = converged["man"]["copying"]["test"]
    scores = {fam: r["test_sets"]["test"] for fam, r in converged.items()}
    assert cells[8] == " / ".join(f"{scores['man'][k]:.2f}" for k in ("rouge1", "rouge2", "rougeL")) \
        + f"; {conv_copied['words']:.2f} / {conv_copied['bigrams']:.2f}"
    # the family summary: one seed run both ways, its ROUGE and its difference to the Transformer's
    (row,) = [line for line in per_family.splitlines() if line.startswith("| MAN (small, DMAN enc.) | 1 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == " / ".join(f"{scores['man'][k]:.2f}" for k in ("rouge1", "rouge2", "rougeL"))
    assert cells[6] == " / ".join(f"{scores['man'][k] - scores['transformer'][k]:+.2f}"
                                  for k in ("rouge1", "rouge2", "rougeL"))


def check_dev_set_rouge(study_cmd, results, data):
    """lab/dev_set_rouge.py on the study's runs: the checkpoints each record scored, decoded on the dev
    set (30 pairs), scored and tested against the Transformer; its arguments are the study's."""
    args = study_cmd[study_cmd.index("gigaword-cpu"):]
    dev = run([sys.executable, "-m", "lab.dev_set_rouge", *args])
    table = json.loads((results / "gigaword-cpu-dev.json").read_text())
    runs = {r["family"]: r for r in table["runs"]}
    assert set(runs) == {"man", "transformer"} and table["subset"] == "valid"
    refs = (data / "valid.raw.title").read_text().splitlines()
    for fam, r in runs.items():
        hyps = (results / "gigaword-cpu-dev" / f"{fam}-seed1.valid.hyp").read_text().splitlines()
        assert len(hyps) == len(refs) == 30 and r["checkpoint"] == "checkpoint_avg1.pt"
        again = rouge155_scores(hyps, refs)
        assert {k: r["dev"][k] for k in again} == again  # its hypotheses score what it says
        assert r["test"]["rouge1"] == json.loads((results / "gigaword-cpu" / f"{fam}-seed1.json").read_text())[
            "test_sets"]["test"]["rouge1"]
    tests = runs["man"]["paired_randomization"]["rouge1"]
    assert tests["n_documents"] == 30 and tests["system"] == pytest.approx(runs["man"]["dev"]["rouge1"], abs=1.0)
    assert "paired_randomization" not in runs["transformer"] and "| transformer | 1 |" in dev.stdout
    # another scoring option has no record to compare with; the test set is not a dev set: one line each
    other = run([sys.executable, "-m", "lab.dev_set_rouge", *args[:args.index("--")], "--avg-last", "2",
                 *args[args.index("--"):]], check=False)
    assert other.returncode == 2 and "transformer-seed1: no record of today's config" in other.stdout
    # a seed without a Transformer is refused before any run is decoded (seed 1's are there)
    seeds = args.index("--seeds") + 1
    missing = run([sys.executable, "-m", "lab.dev_set_rouge", *args[:seeds], "1,2", *args[seeds + 1:]], check=False)
    assert missing.returncode == 2 and "transformer-seed2: no record of today's config" in missing.stdout
    assert "decode " not in missing.stdout
    # a family not trained yet is left out, and the table names it
    fams = args.index("--families") + 1
    run([sys.executable, "-m", "lab.dev_set_rouge", *args[:fams], "man,localness", *args[fams + 1:]])
    table = json.loads((results / "gigaword-cpu-dev.json").read_text())
    assert {r["family"] for r in table["runs"]} == {"man", "transformer"} and table["left_out"] == ["localness-seed1"]
    assert "left out: localness-seed1." in (results / "gigaword-cpu-dev.md").read_text()
    test_set = run([sys.executable, "-m", "lab.dev_set_rouge", *args[:args.index("--")], "--subset", "test",
                    *args[args.index("--"):]], check=False)
    assert test_set.returncode == 2 and "names no dev set 'test' (dev sets: valid)" in test_set.stdout
    check_dev_set_rouge_without_checkpoint(args, results)


def check_dev_set_rouge_without_checkpoint(args, results):
    """A run whose checkpoints are gone is scored from the hypotheses decoded earlier from its record's
    very checkpoint, and said so; never from those of another record of the same run."""
    checkpoints = Path(args[args.index("--runs-dir") + 1]) / "transformer-seed1" / "checkpoints"
    before = {r["family"]: r for r in json.loads((results / "gigaword-cpu-dev.json").read_text())["runs"]}
    checkpoints.rename(checkpoints.with_name("gone"))
    try:
        again = run([sys.executable, "-m", "lab.dev_set_rouge", *args])
        runs = {r["family"]: r for r in json.loads((results / "gigaword-cpu-dev.json").read_text())["runs"]}
        assert runs["transformer"]["decoded_on"] and runs["man"]["decoded_on"] is None
        assert runs["transformer"]["dev"] == before["transformer"]["dev"]
        assert runs["man"]["paired_randomization"] == before["man"]["paired_randomization"]
        assert "checkpoint its record scored, no longer here: transformer-seed1 (decoded " in again.stdout
        # the earlier hypotheses name another record (another test score): refused, one line
        table = json.loads((results / "gigaword-cpu-dev.json").read_text())
        for r in table["runs"]:
            r["test"]["rouge1"] += r["family"] == "transformer"
        (results / "gigaword-cpu-dev.json").write_text(json.dumps(table))
        other = run([sys.executable, "-m", "lab.dev_set_rouge", *args], check=False)
        assert other.returncode == 2 and "cannot average" in other.stdout
    finally:
        checkpoints.with_name("gone").rename(checkpoints)


def rouge155_scores(hyps, refs):
    from man_recipes import scoring

    scored = scoring.rouge(hyps, refs, order="hyp-ref")
    return {k: scored[k] for k in ("rouge1", "rouge2", "rougeL")}


def test_the_table_says_which_checkpoint_was_scored():
    from man_recipes.studies.summarization_table import scored_checkpoints

    last = {"averaged_checkpoints": ["checkpoint10.pt"]}
    five = {"averaged_checkpoints": [f"checkpoint{i}.pt" for i in range(6, 11)]}
    assert scored_checkpoints([last, last]) == "Each run is scored on its last checkpoint (no averaging)."
    assert scored_checkpoints([five]) == "Each run is scored on the average of its last 5 checkpoints."
    assert scored_checkpoints([last, five]) == "Each run is scored on the average of its last 1 or 5 checkpoints."


def test_dev_set_rouge_refuses_a_checkpoint_its_record_did_not_score(tmp_path):
    import torch

    from lab.dev_set_rouge import DevSetError, scored_again
    from man_recipes.config import load_config

    cfg = load_config(REPO / "configs" / "gigaword-cpu-converge" / "man.yaml")
    (tmp_path / "man-seed1" / "checkpoints").mkdir(parents=True)
    torch.save({"optimizer_history": [{"num_updates": 4428}]}, tmp_path / "man-seed1" / "checkpoints" / "checkpoint_best.pt")
    record = {"protocol": "to-convergence", "best_updates": 4428}
    assert scored_again(cfg, tmp_path / "man-seed1", record, None).name == "checkpoint_best.pt"
    # trained on after its record: the best checkpoint moved
    with pytest.raises(DevSetError, match="saved at update 4428, but the record of man-seed1 scored .* update 3690"):
        scored_again(cfg, tmp_path / "man-seed1", dict(record, best_updates=3690), None)
