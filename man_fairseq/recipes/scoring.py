"""Scores used by the papers: tokenized BLEU (optionally with compound splitting), detokenized
sacreBLEU, and ROUGE-1/2/L F1.

* Tokenized BLEU = multi-bleu.perl / fairseq-score: corpus BLEU-4 on whitespace tokens, no
  smoothing, brevity penalty exp(1 - r/c) when c < r. Computed with sacreBLEU's implementation of
  the same formula (``tokenize='none'``, ``smooth_method='none'``).
* Compound splitting (the usual WMT14 En-De convention, fairseq's ``compound_split_bleu.sh`` and
  tensor2tensor's ``get_ende_bleu.sh``): ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`` on hypotheses and
  references, so a hyphenated compound counts as three tokens. Reproduced with the same regex,
  including its non-overlapping behaviour on ``a-b-c`` (Perl and Python agree).
* ROUGE: ``files2rouge`` (the ROUGE-1.5.5 Perl package the papers used) when it is installed,
  otherwise Google's ``rouge-score`` reimplementation with Porter stemming. The result records
  which one produced the numbers: the two differ slightly (ROUGE-1.5.5 drops non-alphanumeric
  tokens in its own way and reports bootstrap averages).
"""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

COMPOUND_RE = re.compile(r"(\S)-(\S)")


def compound_split(line):
    return COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps, refs, lowercase=False, compound=False):
    """Corpus BLEU on already tokenized text; returns a dict with the score and its parts."""
    import sacrebleu

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    prep = (lambda s: compound_split(s.strip())) if compound else (lambda s: s.strip())
    hyps = [prep(h) for h in hyps]
    refs = [prep(r) for r in refs]
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", lowercase=lowercase,
                                  force=True)
    res = bleu.corpus_score(hyps, [refs])
    return {
        "bleu": round(res.score, 2),
        "precisions": [round(p, 2) for p in res.precisions],
        "bp": round(res.bp, 4), "sys_len": res.sys_len, "ref_len": res.ref_len,
        "lowercase": lowercase, "compound_split": compound,
        "implementation": "multi-bleu.perl formula (sacrebleu, tokenize=none, no smoothing)",
    }


def sacrebleu_detok(detok_hyps, raw_refs):
    """Standard detokenized sacreBLEU (13a, case-sensitive) with its signature."""
    import sacrebleu

    bleu = sacrebleu.metrics.BLEU()
    res = bleu.corpus_score(list(detok_hyps), [list(raw_refs)])
    return {"bleu": round(res.score, 2), "signature": str(bleu.get_signature()),
            "score_line": str(res)}


def moses_detokenize(lines, lang):
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    return [md.detokenize(line.split()) for line in lines]


# --------------------------------------------------------------------------------------- ROUGE

_F2R_LINE = re.compile(r"ROUGE-(1|2|L) Average_F:\s*([0-9.]+)")


def parse_files2rouge(output):
    scores = {}
    for kind, value in _F2R_LINE.findall(output):
        scores[f"rouge{kind}"] = round(100 * float(value), 2)
    if set(scores) != {"rouge1", "rouge2", "rougeL"}:
        raise RuntimeError(f"could not read ROUGE-1/2/L Average_F from files2rouge output:\n{output[-2000:]}")
    return scores


def rouge(hyps, refs, prefer_files2rouge=True):
    """ROUGE-1/2/L F1 (x100) of one hypothesis against one reference per line."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    exe = shutil.which("files2rouge") if prefer_files2rouge else None
    if exe:
        with tempfile.TemporaryDirectory() as tmp:
            hyp_file, ref_file = Path(tmp) / "hyp.txt", Path(tmp) / "ref.txt"
            hyp_file.write_text("\n".join(h.strip() for h in hyps) + "\n")
            ref_file.write_text("\n".join(r.strip() for r in refs) + "\n")
            proc = subprocess.run([exe, str(ref_file), str(hyp_file)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"files2rouge failed ({proc.returncode}):\n{proc.stdout[-2000:]}")
            scores = parse_files2rouge(proc.stdout)
        scores["implementation"] = f"files2rouge ({exe}; ROUGE-1.5.5)"
        return scores

    from importlib.metadata import version as pkg_version

    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for h, r in zip(hyps, refs):
        s = scorer.score(r.strip(), h.strip())
        for k in totals:
            totals[k] += s[k].fmeasure
    n = max(1, len(hyps))
    scores = {k: round(100 * v / n, 2) for k, v in totals.items()}
    version = pkg_version("rouge-score")
    scores["implementation"] = (f"rouge-score {version} (Python reimplementation, Porter stemmer, "
                                "mean sentence F1; files2rouge not installed)")
    return scores
