#!/usr/bin/env python
"""The table of docs/summarization-scoring.md: what the ROUGE choices change, on real summaries.

Two baselines on the shared samples, scored every way this project can score them: CNN/DM
validation lead-3 (articles and highlights Moses-tokenized and lowercased as data-prep does,
articles cut after their third " . ") and Gigaword validation "first 12 words of the article".
Rows: ROUGE-1.5.5 as files2rouge runs it (its empty exception database) in both argument orders,
with WordNet's 5,930 irregular forms instead, and Google's rouge-score as the fall-back reports it
(rougeLsum on split sentences) and as a plain whole-line rougeL::

    .venv/bin/python -m lab.compare_rouge_scorers ../shared/data
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from man_recipes.interrupt import one_line_on_ctrl_c  # noqa: E402
from man_recipes.options import number  # noqa: E402


def baselines(shared, max_docs=None):
    from man_recipes.data.dataprep import tokenize_lines

    arts = (shared / "cnndm-sample/val.source").read_text().splitlines()[:max_docs]
    high = (shared / "cnndm-sample/val.target").read_text().splitlines()[:max_docs]
    arts, high = [tokenize_lines(x, "en", escape=False, lowercase=True) for x in (arts, high)]
    lead3 = [" . ".join(a.split(" . ")[:3]).rstrip(" .") + " ." for a in arts]
    giga_art = (shared / "gigaword-sample/valid.article.filter.4K.txt").read_text().splitlines()[:max_docs]
    giga_ttl = (shared / "gigaword-sample/valid.title.filter.4K.txt").read_text().splitlines()[:max_docs]
    return [(f"CNN/DM lead-3 ({len(lead3):,})", lead3, high),
            (f"Gigaword first 12 words ({len(giga_ttl):,})", [" ".join(a.split()[:12]) for a in giga_art], giga_ttl)]


def whole_line_rouge_l(hyps, refs):
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return round(100 * sum(scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hyps, refs)) / len(hyps), 2)


def table(shared, max_docs=None):
    from man_recipes import scoring
    from man_recipes.tables import markdown_table

    cells = []
    for name, hyps, refs in baselines(shared, max_docs):
        fallback = scoring.rouge(hyps, refs, implementation="rouge-score")
        rows = [("ROUGE-1.5.5 as files2rouge, hyp-ref (the recipes' default)", scoring.rouge(hyps, refs, order="hyp-ref")),
                ("ROUGE-1.5.5 as files2rouge, ref-hyp", scoring.rouge(hyps, refs, order="ref-hyp")),
                ("ROUGE-1.5.5, hyp-ref, WordNet exception DB (5,930 forms; `--exception-db wordnet`)",
                 scoring.rouge(hyps, refs, order="hyp-ref", exception_db="wordnet")),
                ("rouge-score fall-back, hyp-ref (R-L = rougeLsum on split sentences)", fallback),
                ("rouge-score, plain rougeL over the whole line", dict(fallback, rougeL=whole_line_rouge_l(hyps, refs)))]
        cells += [[name, label, f"{s['rouge1']:.2f}", f"{s['rouge2']:.2f}", f"{s['rougeL']:.2f}"] for label, s in rows]
    return "\n".join(markdown_table(["data", "scorer", "R-1", "R-2", "R-L"], cells)) + "\n"


@one_line_on_ctrl_c("python -m lab.compare_rouge_scorers")
def main(argv=None):
    from man_recipes.logging_setup import quiet_logging

    quiet_logging()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shared_data", type=Path, help="the folder holding cnndm-sample/ and gigaword-sample/")
    # no ceiling needed: more than a sample holds is all of it
    p.add_argument("--max-docs", type=number("--max-docs", low=1), default=None,
                   help="only the first N documents of each sample")
    args = p.parse_args(argv)
    print(table(args.shared_data, args.max_docs), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
