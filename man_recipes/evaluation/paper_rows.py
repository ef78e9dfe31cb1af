"""Every results row of the four papers and what the recipes do with it.

Keys are ``(paper, table, row)``, named as in the maintainers' transcription of the papers' tables
(below; P1 = MAN, P2 = localness, P3 = calibration, P4 = differentiable window:
docs/model-families.md#the-four-papers-p1p4).
Each row is one of

* ``configs``: the config names that train it (a row with several columns, e.g. small/base/big or
  Full/Partial, has one config per column; a row that repeats another table's run names that
  run's config);
* ``analysis``: not a training run, a measurement on a trained model (tool and config named);
* ``not reproduced``: a corpus outside the recipes, or another paper's system whose number the
  paper cites.

``tests/test_configs.py`` checks this table (every row present, the configs' paper numbers printed
in the row) and docs/reproducing.md's "Every table row" section against the maintainers' transcription of
the papers' tables, ``paper-tables.md`` beside the repository (``../shared/``, not part of it), and
skips that check where the file is absent.
"""

import re
from pathlib import Path

from man_recipes.corpora import display_name
from man_recipes.tables import markdown_table

PAPER_KEYS = {"P1": "man", "P2": "localness", "P3": "calibration", "P4": "diffwin"}
PAPER_TITLES = {
    "man": "Mask Attention Networks (Fan et al., 2021)",
    "localness": "Modeling Localness for Self-Attention Networks (Yang et al., 2018)",
    "diffwin": "Differentiable Window for Dynamic Local Attention (Nguyen et al., 2020)",
    "calibration": "Attention Calibration for Transformer in NMT (Lu et al., 2021)",
}
CORPUS = "not reproduced: corpus outside the recipes"
CITED = "not reproduced: another paper's system, number cited by the paper"
OTHER_SYSTEM = "not reproduced: a system the plugin cannot express"


def _cfg(*names):
    return {"configs": list(names)}


def _analysis(text):
    return {"analysis": text}


def _not(reason):
    return {"not": reason}


MAN_LOCALITY = ("`man-attention-locality` on the trained `man-t1-iwslt14-man-small` "
                "(DMAN) and its SAN sublayers, IWSLT14 test set, `--windows 1,2,4`")
CAL_ENTROPY = ("`man-export-calibration` (entropy change per decoder layer) on a trained "
               "`calibration-t2-*` model, newstest2014 (the paper does not say which fusion)")

ROWS = {
    # ---------------------------------------------------------------- P1 MAN
    ("P1", "Table 1", "Transformer (Vaswani et al., 2017)"): _cfg(
        "man-t1-iwslt14-transformer-small", "man-t1-wmt14-transformer-base", "man-t1-wmt14-transformer-big"),
    ("P1", "Table 1", "Convolutional Transformer (Yang et al., 2019b)"): _not(OTHER_SYSTEM),
    ("P1", "Table 1", "Weighted Transformer (Ahmed et al., 2017)"): _not(OTHER_SYSTEM),
    ("P1", "Table 1", "Local Transformer (Yang et al., 2018)"): _not(
        CITED + " (the localness recipes train that paper's own rows: localness Table 4)"),
    ("P1", "Table 1", "Relative Transformer (Shaw et al., 2018)"): _not(
        CITED + " (relative positions: localness/diffwin `*-relpos`, `diffwin-t1-shaw`)"),
    ("P1", "Table 1", "Scaling NMT (Ott et al., 2018)"): _not(CITED),
    ("P1", "Table 1", "Dynamic Conv (Wu et al., 2019)"): _not(OTHER_SYSTEM),
    ("P1", "Table 1", "Ours"): _cfg("man-t1-iwslt14-man-small", "man-t1-wmt14-man-base", "man-t1-wmt14-man-big"),
    ("P1", "Table 2", "LEAD-3 (Nallapati et al., 2016)"): _not(OTHER_SYSTEM),
    ("P1", "Table 2", "PTGEN+Coverage (See et al., 2017)"): _not(OTHER_SYSTEM),
    ("P1", "Table 2", "Dynamic Conv (Wu et al., 2019)"): _not(OTHER_SYSTEM),
    ("P1", "Table 2", "Transformer (Vaswani et al., 2017)"): _cfg("man-t2-cnndm-transformer", "man-t2-gigaword-transformer"),
    ("P1", "Table 2", "Ours"): _cfg("man-t2-cnndm-man", "man-t2-gigaword-man"),
    ("P1", "Table 3", "C#1 FFN→SAN→FFN"): _cfg("man-t3-iwslt14-order1"),
    ("P1", "Table 3", "C#2 SAN→SAN→FFN"): _cfg("man-t3-iwslt14-order2"),
    ("P1", "Table 3", "C#3 DMAN→DMAN→FFN"): _cfg("man-t3-iwslt14-order3"),
    ("P1", "Table 3", "C#4 SAN→DMAN→FFN"): _cfg("man-t3-iwslt14-order4"),
    ("P1", "Table 3", "C#5 DMAN→SAN→FFN"): _cfg("man-t3-iwslt14-order5"),
    ("P1", "Table 4", "Transformer"): _cfg("man-t1-iwslt14-transformer-small"),
    ("P1", "Table 4", "SMAN1"): _cfg("man-t4-iwslt14-sman1"),
    ("P1", "Table 4", "SMAN2"): _cfg("man-t4-iwslt14-sman2"),
    ("P1", "Table 4", "DMAN"): _cfg("man-t4-iwslt14-dman"),
    **{("P1", "Table 5", f"{m}, w={w}"): _analysis(MAN_LOCALITY) for m in ("DMAN", "SAN") for w in (1, 2, 4)},
    # ---------------------------------------------------------------- P2 localness
    **{("P2", "Table 1", r): _not(CORPUS + " (WMT17 Zh-En dev)")
       for r in ("Baseline", "Fixed", "Layer-Spec.", "Query-Spec.")},
    **{("P2", "Table 2", r): _not(CORPUS + " (WMT17 Zh-En dev)")
       for r in ("1 [1-6]", "2 [1-1]", "3 [1-2]", "4 [1-3]", "5 [1-4]", "6 [4-6]")},
    **{("P2", "Table 3", r): _not(CORPUS + " (WMT17 Zh-En dev)")
       for r in ("Enc ✓ Dec × Enc-Dec ×", "Enc ✓ Dec ✓ Enc-Dec ×", "Enc ✓ Dec × Enc-Dec ✓", "Enc ✓ Dec ✓ Enc-Dec ✓")},
    ("P2", "Table 4", "(Wu et al., 2016) GNMT"): _not(OTHER_SYSTEM),
    ("P2", "Table 4", "(Gehring et al., 2017) CONVS2S"): _not(OTHER_SYSTEM),
    ("P2", "Table 4", "(Vaswani et al., 2017) TRANSFORMER-BASE"): _not(CITED),
    ("P2", "Table 4", "(Vaswani et al., 2017) TRANSFORMER-BIG"): _not(CITED),
    ("P2", "Table 4", "(Hassan et al., 2018) TRANSFORMER-BIG"): _not(CORPUS + " (WMT17 Zh-En)"),
    ("P2", "Table 4", "this work TRANSFORMER-BASE"): _cfg("localness-t4-base-transformer"),
    ("P2", "Table 4", "this work TRANSFORMER-BASE + Rel_Pos (Shaw et al., 2018)"): _cfg("localness-t4-base-relpos"),
    ("P2", "Table 4", "this work TRANSFORMER-BASE + Localness"): _cfg("localness-t4-base-localness"),
    ("P2", "Table 4", "this work TRANSFORMER-BASE + Localness + Rel_Pos"): _cfg("localness-t4-base-localness-relpos"),
    ("P2", "Table 4", "this work TRANSFORMER-BIG"): _cfg("localness-t4-big-transformer"),
    ("P2", "Table 4", "this work TRANSFORMER-BIG + Localness"): _cfg("localness-t4-big-localness"),
    ("P2", "Table 4", "this work TRANSFORMER-BIG + Localness + Rel_Pos"): _cfg("localness-t4-big-localness-relpos"),
    ("P2", "Table 5", "BASE"): _not(CORPUS + " (WMT17 Zh-En dev)"),
    ("P2", "Table 5", "OURS"): _not(CORPUS + " (WMT17 Zh-En dev)"),
    # ---------------------------------------------------------------- P3 calibration
    ("P3", "Table 2", "GNMT (Wu et al., 2016)‡"): _not(OTHER_SYSTEM),
    ("P3", "Table 2", "Conv (Gehring et al., 2017)‡"): _not(OTHER_SYSTEM),
    ("P3", "Table 2", "AttIsAll (Vaswani et al., 2017)‡"): _not(CITED),
    ("P3", "Table 2", "(Feng et al., 2020)‡"): _not(OTHER_SYSTEM),
    ("P3", "Table 2", "(Weng et al., 2020)‡"): _not(OTHER_SYSTEM),
    ("P3", "Table 2", "Our Implemented Baseline"): _cfg("calibration-t2-transformer"),
    ("P3", "Table 2", "Ours Fixed"): _cfg("calibration-t2-fixed"),
    ("P3", "Table 2", "Ours Anneal"): _cfg("calibration-t2-anneal"),
    ("P3", "Table 2", "Ours Gate"): _cfg("calibration-t2-gate"),
    **{("P3", "Table 3", r): _not(CORPUS + " (LDC Zh-En, NIST)")
       for r in ("Baseline", "Ours Fixed", "Ours Anneal", "Ours Gate")},
    **{("P3", "Table 4", r): _not(CORPUS + " (WMT17 En-Lv/En-Fi, WMT16 En-Ro)")
       for r in ("Baseline", "Ours Fixed", "Ours Anneal", "Ours Gate")},
    **{("P3", "Table 5", r): _analysis(CAL_ENTROPY + "; the Zh-En column: corpus outside the recipes")
       for r in ("layer 1", "layer 2", "layer 3", "layer 4", "layer 5", "layer 6", "All")},
    # ---------------------------------------------------------------- P4 differentiable window
    ("P4", "Table 1", "Vaswani et al. (2017)"): _cfg("diffwin-t1-transformer"),
    ("P4", "Table 1", "Shaw et al. (2018)"): _cfg("diffwin-t1-shaw"),
    ("P4", "Table 1", "Yang et al. (2018)"): _cfg("diffwin-t1-yang"),
    ("P4", "Table 1", "Enc(AW)-Dec(MW)"): _cfg("diffwin-t1-enc-aw-dec-mw"),
    ("P4", "Table 1", "Cr(AW, Seg)"): _cfg("diffwin-t1-cr-aw-seg"),
    ("P4", "Table 1", "Enc(AW)-Cr(AW,Seg)-Dec(MW)"): _cfg("diffwin-t1-enc-aw-cr-aw-seg-dec-mw"),
    ("P4", "Table 2", "Transformer (Module -)"): _cfg("diffwin-t1-transformer"),
    **{("P4", "Table 2", f"{m} {mod}"): _cfg(f"diffwin-t2-{key}-{m.lower()}-full", f"diffwin-t2-{key}-{m.lower()}-partial")
       for m in ("AW", "MW") for mod, key in (("Encoder", "enc"), ("Decoder", "dec"), ("Cross", "cross"))},
    ("P4", "Table 3", "Cr(AW)"): _cfg("diffwin-t2-cross-aw-partial", "diffwin-t1-cr-aw-seg"),
    ("P4", "Table 3", "Enc(AW)-Dec(MW)"): _cfg("diffwin-t1-enc-aw-dec-mw", "diffwin-t3-enc-aw-seg-dec-mw"),
    ("P4", "Table 4", "Vaswani et al. (2017)"): _cfg("diffwin-t1-transformer"),
    ("P4", "Table 4", "Yang et al. (2018)"): _cfg("diffwin-t1-yang"),
    ("P4", "Table 4", "Vaswani et al. (2017) 7 layers"): _cfg("diffwin-t4-transformer-7-layers"),
    ("P4", "Table 4", "Vaswani et al. (2017) 8 layers"): _cfg("diffwin-t4-transformer-8-layers"),
    ("P4", "Table 4", "Enc(AW)-Cr(AW,Seg)-Dec(MW)"): _cfg("diffwin-t1-enc-aw-cr-aw-seg-dec-mw"),
    **{("P4", "Table 5", r): _not(CORPUS + " (text classification: SST, IMDB, SVA)")
       for r in ("Vaswani et al. ( 2017)", "Shaw et al. (2018)", "Yang et al. (2018)", "Enc (MW)", "Enc (AW)")},
    **{("P4", "Table 6", r): _not(CORPUS + " (1 Billion Word language modelling)")
       for r in ("Vaswani et al. ( 2017)", "Shaw et al. (2018)", "Dec (MW)", "Dec (AW)")},
}

NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


def parse_paper_rows(path):
    """{(paper, table, row): (dataset, numbers text)} from the 'Rows a reproduction config must
    cover' section of paper-tables.md (dataset-statistics rows excluded)."""
    text = Path(path).read_text()
    marker = "## Rows a reproduction config must cover"
    if marker not in text:
        raise ValueError(f"{path}: no '{marker}' section")
    section = text.split(marker, 1)[1].split("### Dataset-statistics rows", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("- P"):
            continue
        parts = [p.strip() for p in line[2:].split("|")]
        if len(parts) < 5:
            raise ValueError(f"{path}: malformed row line {line!r}")
        rows[(parts[0], parts[1], parts[2])] = (parts[3], " | ".join(parts[4:]))
    return rows


def numbers_in(text):
    return {float(n) for n in NUMBER.findall(text)}


def readme_rows_section(configs, paper_rows, repo):
    """Markdown of docs/reproducing.md's "## 4. Every table row": per paper table, one line per config (row,
    data, paper number, ours, command), then the rows that are analyses or not reproduced."""
    by_name = {c["name"]: c for c in configs}
    out = []
    for paper_id, paper in PAPER_KEYS.items():
        out.append(f"### {PAPER_TITLES[paper]}\n")
        trained = []
        for (pid, table, row), status in ROWS.items():
            if pid != paper_id or "configs" not in status:
                continue
            for name in status["configs"]:
                cfg = by_name[name]
                res = cfg.get("paper_results") or {}
                if "bleu" in res:
                    paper_num = f"{res['bleu']:.2f} BLEU"
                else:
                    paper_num = "R-1/2/L " + "/".join(f"{res[k]:.2f}" for k in ("rouge1", "rouge2", "rougeL"))
                rel = Path(cfg["_path"]).resolve().relative_to(Path(repo).resolve())
                data = display_name(cfg["dataset"])
                if f"Table {cfg['table']}" != table:
                    label = f"{row} (same run as Table {cfg['table']} {cfg['row']})"
                else:
                    label = cfg["row"] if cfg["row"].startswith(row) else f"{row}: {cfg['row']}"
                trained.append([table.replace("Table ", "T"), label, data, paper_num, "–",
                                f"`scripts/train.sh {rel} && scripts/evaluate.sh runs/{name}`"])
        out += markdown_table(["table", "row", "data", "paper", "ours", "command"], trained) + [""]
        other = [(k, s) for k, s in ROWS.items() if k[0] == paper_id and "configs" not in s]
        if other:
            out += markdown_table(
                ["table", "row", "paper's number(s)", "status"],
                [[key[1].replace("Table ", "T"), key[2], paper_rows.get(key, ("", "?"))[1],
                  status.get("not") or "analysis: " + status["analysis"]] for key, status in other]) + [""]
    return "\n".join(out)
