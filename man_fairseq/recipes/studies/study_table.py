"""A study's table, rebuilt from its committed run records (:mod:`study_records`) alone.

Per family and test set: sacreBLEU and tokenized BLEU as mean ± sample standard deviation over
seeds, the difference to the Transformer, and sacreBLEU's paired bootstrap of each seed against
the Transformer of the same seed (computed here from the records' hypothesis files; seeded, so a
rebuild gives the same p-values). Stale records (config changed since they ran) are listed below
the table, never mixed into it. Writes ``<prefix>.md``, ``<prefix>.json`` and
``<prefix>-valid-loss.png``.
"""

import datetime
import json
import os

from ...scoring import check_aligned
from ..config import REPO
from .study_records import hypothesis_path, read_hypotheses
from .experiments import BASELINE
from ...tables import mean_std

def _pm(values):
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f} (1 seed)"


def _params(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def paired_bootstrap(baseline_hyps, system_hyps, refs, n_samples=1000,
                     names=("baseline hypotheses", "system hypotheses", "references")):
    """sacreBLEU's paired bootstrap (Koehn 2004) of ``system`` against ``baseline``: p-value, signature.

    Same as ``sacrebleu REF -i BASELINE SYSTEM --paired-bs`` (13a BLEU, 1000 resamples, seed
    SACREBLEU_SEED, default 12345). ``names`` name the three inputs (their files) in errors.
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    baseline_hyps, system_hyps, refs = check_aligned(zip(names, (baseline_hyps, system_hyps, refs)),
                                                     references=names[2])
    test = PairedTest([("baseline", baseline_hyps), ("system", system_hyps)],
                      {"BLEU": BLEU()}, references=[refs], test_type="bs", n_samples=n_samples)
    signatures, scores = test()
    (metric,) = [k for k in scores if k != "System"]
    base, system = scores[metric]
    return {"p_value": float(system.p_value), "baseline_bleu": round(base.score, 2), "system_bleu": round(system.score, 2),
            "system_mean": round(float(system.mean), 2), "system_ci95": round(float(system.ci), 2),
            "signature": str(signatures[metric])}


def significance(records, records_dir, references, n_samples, reference_files=None):
    """{(family, seed, subset): bootstrap} of every non-baseline record against the same seed's
    Transformer; ``references`` maps a subset to its raw reference lines, ``reference_files`` to
    the file they were read from (named in errors). Every record's hypotheses of a subset with
    references, paired or not, must have one line per reference: the table shows their scores."""
    ref_names = {subset: f"references {(reference_files or {}).get(subset, f'of {subset}')}" for subset in references}
    hypotheses, names = {}, {}
    for r in records:
        for subset in [s for s in r["test_sets"] if s in references]:
            key = (r["family"], r["seed"], subset)
            names[key] = f"hypotheses {hypothesis_path(records_dir, r['family'], r['seed'], subset)}"
            hypotheses[key], _ = check_aligned([(names[key], read_hypotheses(records_dir, r, subset)),
                                                (ref_names[subset], references[subset])], references=ref_names[subset])
    base = {r["seed"]: r for r in records if r["family"] == BASELINE}
    out = {}
    for r in records:
        b = base.get(r["seed"])
        if r["family"] == BASELINE or b is None:
            continue
        for subset in r["test_sets"]:
            if subset in b["test_sets"] and subset in references:
                pair = (BASELINE, b["seed"], subset), (r["family"], r["seed"], subset)
                out[pair[1]] = paired_bootstrap(hypotheses[pair[0]], hypotheses[pair[1]], references[subset],
                                                n_samples, (names[pair[0]], names[pair[1]], ref_names[subset]))
    return out


def summarize(records, families, labels, boot):
    """Per family and test set: mean/std of both BLEUs, delta to the Transformer, p-values."""
    summary = {}
    base = [r for r in records if r["family"] == BASELINE]
    for fam in families:
        fr, entry = family_entry(fam, records, labels)
        if not fr:
            continue
        for subset in fr[0]["test_sets"]:
            sac = [r["test_sets"][subset]["sacrebleu"] for r in fr]
            tok = [r["test_sets"][subset]["bleu_tok_ci"] for r in fr]
            s = {"name": fr[0]["test_sets"][subset]["name"], "sacrebleu": sac, "bleu_tok_ci": tok,
                 "sacrebleu_mean_std": mean_std(sac), "bleu_tok_ci_mean_std": mean_std(tok)}
            # matched seeds, like the bootstrap: a one-seed family is not measured against a 3-seed mean
            bsac = {r["seed"]: r["test_sets"][subset]["sacrebleu"] for r in base if subset in r["test_sets"]}
            diffs = [r["test_sets"][subset]["sacrebleu"] - bsac[r["seed"]] for r in fr if r["seed"] in bsac]
            s["delta_sacrebleu_vs_transformer"] = round(sum(diffs) / len(diffs), 2) if diffs else None
            if fam != BASELINE:
                s["paired_bootstrap"] = [boot.get((fam, r["seed"], subset)) for r in fr]
            entry["test_sets"][subset] = s
        summary[fam] = entry
    return summary


def to_markdown(summary, meta, stale):
    lines = header_lines(meta, f"extra fairseq options: `{' '.join(meta['fairseq_args']) or 'none'}`")
    for subset, release in meta["test_sets"].items():
        lines += [f"## {release}", "",
                  "| family | params | train min (mean) | sacreBLEU | Δ vs Transformer | tok. BLEU (ci) | "
                  "paired bootstrap p (per seed, sign of Δ) | seeds p<0.05 |",
                  "|---|---|---|---|---|---|---|---|"]
        for fam, e in summary.items():
            s = e["test_sets"].get(subset)
            if s is None:
                continue
            minutes = f"{sum(e['train_minutes']) / len(e['train_minutes']):.1f}"
            delta = "–" if s["delta_sacrebleu_vs_transformer"] is None else f"{s['delta_sacrebleu_vs_transformer']:+.2f}"
            if fam == BASELINE:
                pcol, sig, delta = "baseline", "baseline", "0 (baseline)"
            else:
                # the bootstrap's p is two-sided: the sign says which way each seed went
                boots = [(b["p_value"], b["system_bleu"] >= b["baseline_bleu"])
                         for b in s.get("paired_bootstrap") or [] if b]
                pcol = ", ".join(f"{p:.3f} ({'+' if up else '−'})" for p, up in boots) or "–"
                better = sum(p < 0.05 and up for p, up in boots)
                worse = sum(p < 0.05 and not up for p, up in boots)
                sig = f"{better} better, {worse} worse of {len(boots)}" if boots else "–"
            lines.append(f"| {e['label']} | {_params(e['params'])} | {minutes} | {_pm(s['sacrebleu'])} | {delta} | "
                         f"{_pm(s['bleu_tok_ci'])} | {pcol} | {sig} |")
        lines.append("")
    lines += ["sacreBLEU: detokenized hypotheses against the raw references, signature "
              f"`{meta['sacrebleu_signature']}`. Tokenized BLEU: case-insensitive multi-bleu formula on the "
              "Moses-tokenized text (BPE removed). Mean ± sample standard deviation over seeds. Δ: mean over the "
              "family's seeds of its difference to the Transformer of the same seed. Paired bootstrap: "
              f"sacreBLEU's (`{meta['bootstrap_signature']}`), each run against the Transformer of the same "
              "seed on the same test set; p is the probability of the observed difference under no difference. "
              "Train minutes: wall time of the training epochs from the log, with validation and checkpointing "
              "(start-up left out; an epoch cut short by a kill and redone counts once).", "",
              f"Validation loss of every run: `{meta['png']}`.", ""]
    lines += stale_lines(stale, STALE_WHY)
    return "\n".join(lines)


def family_entry(family, records, labels):
    """(the family's records by seed, the start of its summary entry): what every study table says of
    a family besides its scores; ([], None) for a family without records."""
    fr = sorted((r for r in records if r["family"] == family), key=lambda r: r["seed"])
    if not fr:
        return fr, None
    return fr, {"label": labels.get(family, family), "arch": fr[0]["arch"], "seeds": [r["seed"] for r in fr],
                "params": fr[0]["params"], "train_minutes": [round(r["train_seconds"] / 60, 1) for r in fr],
                "updates": [r["updates"] for r in fr], "test_sets": {}}


def table_meta(exp, records, records_dir, args):
    """The head of a study table's ``meta``: title, build date, where the records are, their devices
    and commits, the configs and the extra fairseq options."""
    return {"title": exp["title"], "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "records": os.path.relpath(records_dir, REPO) if records_dir.is_relative_to(REPO) else str(records_dir),
            "devices": sorted({f"{r['device']} (threads {r.get('threads')})" for r in records}),
            "commits": sorted({r["commit"] for r in records}),
            "configs": os.path.relpath(exp["configs"], REPO), "fairseq_args": args.fairseq_args}


def header_lines(meta, sources):
    """The Markdown head of a study table; ``sources``: what the commits line says after the configs."""
    return [f"# {meta['title']}", "",
            f"- built: {meta['date']} from the run records in `{meta['records']}` (each names its commit, "
            "device, threads and command)",
            f"- devices: {'; '.join(meta['devices'])}",
            f"- commits: {', '.join(meta['commits'])}; configs: `{meta['configs']}`; {sources}",
            f"- one run: `{meta['command']}`", ""]


STALE_WHY = ("Their fingerprint differs from what today's configs give with this table's options: the config "
             "changed after they ran, or they were made with other options. Rerun them, or rebuild the table with "
             "their options, to bring them back.")


def write_without_runs(results_dir, experiment, title, stale, png, log):
    """Every record is stale under the default options (the configs changed after they ran):
    ``<experiment>.md`` and ``.json`` say that no run is current and list the stale ones, and the last
    table's figure ``png`` is removed, so no table of this study shows what today's configs did not give.
    The records stay."""
    lines = [f"# {title}", "", "No run record matches today's configs: no table until one does.", ""]
    (results_dir / f"{experiment}.md").write_text("\n".join(lines + stale_lines(stale, STALE_WHY)))
    (results_dir / f"{experiment}.json").write_text(json.dumps(
        {"meta": {"title": title}, "summary": [], "runs": [],
         "stale": [f"{r['family']}-seed{r['seed']}" for r in stale]}, indent=1) + "\n")
    png.unlink(missing_ok=True)
    log(f"no current record: wrote {results_dir / (experiment + '.md')} and .json listing {len(stale)} stale")
    return results_dir / f"{experiment}.md"


def stale_lines(stale, why):
    """The section listing the stale records (never in the table); ``why`` explains them."""
    if not stale:
        return []
    lines = ["## Stale records (not in the table)", "", why, "",
             "| run | fingerprint | commit | date |", "|---|---|---|---|"]
    lines += [f"| {r['family']}-seed{r['seed']} | `{r.get('fingerprint')}` | `{r.get('commit')}` | {r.get('date')} |"
              for r in stale]
    return lines + [""]


def write_table(results_dir, experiment, markdown, payload, boot, current, stale, png, log):
    """Write ``<experiment>.md`` and ``.json`` (``payload``, then every run with its paired bootstrap
    and the stale runs' names); returns the Markdown file."""
    runs = [dict(r, paired_bootstrap={k[2]: v for k, v in boot.items() if k[:2] == (r["family"], r["seed"])})
            for r in current]
    (results_dir / f"{experiment}.md").write_text(markdown)
    (results_dir / f"{experiment}.json").write_text(json.dumps(
        dict(payload, runs=runs, stale=[f"{r['family']}-seed{r['seed']}" for r in stale]), indent=1) + "\n")
    log(f"wrote {results_dir / (experiment + '.md')}, .json and {png.name}")
    return results_dir / f"{experiment}.md"
