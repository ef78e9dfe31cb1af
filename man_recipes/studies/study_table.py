"""A study's table, rebuilt from its committed run records (:mod:`study_records`) alone.

Per family and test set: sacreBLEU and tokenized BLEU as mean ± sample standard deviation over
seeds, the difference to the Transformer, the verdict over seeds (:mod:`seed_level`: training
noise, the test the verdicts rest on), and two paired tests of each seed against the Transformer
of the same seed, computed here from the records' hypothesis files (seeded, so a rebuild gives the
same p-values): sacreBLEU's paired bootstrap (the p the field reports) and sacreBLEU's paired
approximate randomization (its statistic reads a near-zero difference as the bootstrap's does not).
Both paired tests say whether two trained networks differ on these sentences (test-set sampling),
not whether two architectures do. Stale records (config changed since they ran)
are listed below the table, never mixed into it. Writes ``<prefix>.md``, ``<prefix>.json`` and
``<prefix>-valid-loss.png``.
"""

import datetime
import json
import os
import shlex
from pathlib import Path

from man_recipes.scoring import check_aligned, sacrebleu_detok
from man_recipes.config import REPO
from man_recipes.studies.study_records import check_score, hypothesis_path, read_hypotheses
from man_recipes.studies.experiments import BASELINE
from man_recipes.tables import markdown_table, mean_std
from man_recipes.studies.rouge_significance import AR_TRIALS

def _pm(values):
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f} (1 seed)"


def fmt_p(p):
    """A p-value as the tables print it: 3 decimals, 4 below 0.001 (an AR's smallest, 1/10,001, is not 0)."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.4f}"


def _params(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def _paired_test(baseline_hyps, system_hyps, refs, test_type, n_samples, names):
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    baseline_hyps, system_hyps, refs = check_aligned(zip(names, (baseline_hyps, system_hyps, refs)),
                                                     references=names[2])
    test = PairedTest([("baseline", baseline_hyps), ("system", system_hyps)],
                      {"BLEU": BLEU()}, references=[refs], test_type=test_type, n_samples=n_samples)
    signatures, scores = test()
    (metric,) = [k for k in scores if k != "System"]
    base, system = scores[metric]
    return base, system, str(signatures[metric])


NAMES = ("baseline hypotheses", "system hypotheses", "references")
# the two paired tests of every study table, as its JSON names them: sacreBLEU's p and randomization's
TESTS = ("paired_bootstrap", "paired_randomization")
# what they measure, in their column headers: two trained networks on these sentences, not two architectures
SAMPLING = "test-set sampling, not training noise"


def paired_bootstrap(baseline_hyps, system_hyps, refs, n_samples=1000, names=NAMES):
    """sacreBLEU's paired bootstrap (Koehn 2004) of ``system`` against ``baseline``: p-value, signature.

    Same as ``sacrebleu REF -i BASELINE SYSTEM --paired-bs`` (13a BLEU, 1000 resamples, seed
    SACREBLEU_SEED, default 12345). ``names`` name the three inputs (their files) in errors.
    """
    base, system, signature = _paired_test(baseline_hyps, system_hyps, refs, "bs", n_samples, names)
    return {"p_value": float(system.p_value), "baseline_bleu": round(base.score, 2), "system_bleu": round(system.score, 2),
            "system_mean": round(float(system.mean), 2), "system_ci95": round(float(system.ci), 2),
            "signature": signature}


def paired_randomization(baseline_hyps, system_hyps, refs, n_trials=AR_TRIALS, names=NAMES):
    """sacreBLEU's paired approximate randomization of ``system`` against ``baseline``: p-value, signature.

    Same as ``sacrebleu REF -i BASELINE SYSTEM --paired-ar --paired-ar-n N`` (each trial swaps each
    sentence's two hypotheses with probability 1/2, statistic |BLEU difference|, seed SACREBLEU_SEED),
    but for identical hypotheses: sacreBLEU counts trials whose statistic is *above* the observed 0
    and so calls a system against itself significant (1/(N+1)); that is p = 1 here.
    """
    base, system, signature = _paired_test(baseline_hyps, system_hyps, refs, "ar", n_trials, names)
    same = list(baseline_hyps) == list(system_hyps)
    return {"p_value": 1.0 if same else float(system.p_value), "baseline_bleu": round(base.score, 2),
            "system_bleu": round(system.score, 2), "n_trials": n_trials, "signature": signature}


def significance(records, records_dir, references, n_samples, reference_files=None, ar_trials=AR_TRIALS):
    """{(family, seed, subset): {"paired_bootstrap": ..., "paired_randomization": ...}} of every
    non-baseline record against the same seed's Transformer; ``references`` maps a subset to its raw
    reference lines, ``reference_files`` to the file they were read from (named in errors). Every record's hypotheses of a subset with
    references, paired or not, must have one line per reference and score the sacreBLEU its record
    says (:func:`study_records.check_score`): the table shows their scores."""
    ref_names = {subset: f"references {(reference_files or {}).get(subset, f'of {subset}')}" for subset in references}
    hypotheses, names = {}, {}
    for r in records:
        for subset in [s for s in r["test_sets"] if s in references]:
            key = (r["family"], r["seed"], subset)
            names[key] = f"hypotheses {hypothesis_path(records_dir, r['family'], r['seed'], subset)}"
            hypotheses[key], _ = check_aligned([(names[key], read_hypotheses(records_dir, r, subset)),
                                                (ref_names[subset], references[subset])], references=ref_names[subset])
            check_score(records_dir, r, subset, "sacrebleu", sacrebleu_detok(hypotheses[key], references[subset])["bleu"])
    out = {}
    for r, b, subset in same_seed_pairs(records, references):
        pair = (BASELINE, b["seed"], subset), (r["family"], r["seed"], subset)
        inputs = (hypotheses[pair[0]], hypotheses[pair[1]], references[subset])
        files = (names[pair[0]], names[pair[1]], ref_names[subset])
        out[pair[1]] = {"paired_bootstrap": paired_bootstrap(*inputs, n_samples, files),
                        "paired_randomization": paired_randomization(*inputs, ar_trials, files)}
    return out


def same_seed_pairs(records, subsets):
    """(run, the Transformer of its seed, test set) of every run but the Transformers', on every test set of
    ``subsets`` both scored: the pairs the significance tests compare."""
    base = {r["seed"]: r for r in records if r["family"] == BASELINE}
    for r in records:
        b = base.get(r["seed"])
        if r["family"] != BASELINE and b is not None:
            for subset in r["test_sets"]:
                if subset in b["test_sets"] and subset in subsets:
                    yield r, b, subset


def summarize(records, families, labels, boot):
    """Per family and test set: mean/std of both BLEUs, delta to the Transformer, p-values."""
    summary = {}
    base = [r for r in records if r["family"] == BASELINE]
    for fam, fr, entry in family_runs(families, records, labels):
        for subset in fr[0]["test_sets"]:
            sac = [r["test_sets"][subset]["sacrebleu"] for r in fr]
            tok = [r["test_sets"][subset]["bleu_tok_ci"] for r in fr]
            s = {"name": fr[0]["test_sets"][subset]["name"], "sacrebleu": sac, "bleu_tok_ci": tok,
                 "sacrebleu_mean_std": mean_std(sac), "bleu_tok_ci_mean_std": mean_std(tok)}
            # matched seeds, like the bootstrap: a one-seed family is not measured against a 3-seed mean
            bsac = {r["seed"]: r["test_sets"][subset]["sacrebleu"] for r in base if subset in r["test_sets"]}
            diffs = [r["test_sets"][subset]["sacrebleu"] - bsac[r["seed"]] for r in fr if r["seed"] in bsac]
            s["delta_sacrebleu_vs_transformer"] = round(sum(diffs) / len(diffs), 2) if diffs else None
            s.update(seed_tests(fam, fr, subset, boot))
            entry["test_sets"][subset] = s
        summary[fam] = entry
    return summary


def to_markdown(summary, meta, stale, protocol_lines=(), verdict_lines=()):
    lines = header_lines(meta, f"extra fairseq options: `{' '.join(meta['fairseq_args']) or 'none'}`")
    lines += list(verdict_lines)  # the verdict over seeds (seed_level.protocol_sections)
    for subset, release in meta["test_sets"].items():
        rows = []
        for fam, e, s, minutes in family_rows(summary, subset):
            delta = "–" if s["delta_sacrebleu_vs_transformer"] is None else f"{s['delta_sacrebleu_vs_transformer']:+.2f}"
            if fam == BASELINE:
                pcols, sig, delta = ["baseline", "baseline"], "baseline", "0 (baseline)"
            else:
                # both p's are two-sided: the sign says which way each seed went
                tested = {test: [(b["p_value"], b["system_bleu"] >= b["baseline_bleu"]) for b in s.get(test) or [] if b]
                          for test in TESTS}
                pcols = [", ".join(f"{fmt_p(p)} ({'+' if up else '−'})" for p, up in tested[test]) or "–" for test in TESTS]
                ar = tested["paired_randomization"]
                better = sum(p < 0.05 and up for p, up in ar)
                worse = sum(p < 0.05 and not up for p, up in ar)
                sig = f"{better} better, {worse} worse of {len(ar)}" if ar else "–"
            rows.append([e["label"], _params(e["params"]), minutes, _pm(s["sacrebleu"]), delta,
                         _pm(s["bleu_tok_ci"]), *pcols, sig])
        lines += [f"## {release}", ""] + markdown_table(
            ["family", "params", "train min (mean)", "sacreBLEU", "Δ vs Transformer", "tok. BLEU (ci)",
             f"paired bootstrap p (per seed, sign of Δ; {SAMPLING})",
             f"approximate randomization p (per seed, sign of Δ; {SAMPLING})", "seeds p<0.05 (randomization)"],
            rows) + [""]
    lines += ["sacreBLEU: detokenized hypotheses against the raw references, signature "
              f"`{meta['sacrebleu_signature']}`. Tokenized BLEU: case-insensitive multi-bleu formula on the "
              "Moses-tokenized text (BPE removed). Mean ± sample standard deviation over seeds. Δ: mean over the "
              "family's seeds of its difference to the Transformer of the same seed. Both tests pair each "
              "run with the Transformer of the same seed on the same test set and are two-sided. Paired bootstrap: "
              f"sacreBLEU's (`{meta['bootstrap_signature']}`), the p the field reports; its statistic (the "
              "resampled absolute difference centred on its own mean) reads a near-zero difference as more "
              "significant than it is. Approximate randomization: sacreBLEU's paired AR "
              f"(`{meta['randomization_signature']}`; each trial swaps each sentence's two hypotheses with "
              "probability 1/2; p = (trials with |ΔBLEU| at least the observed + 1) / (trials + 1), 1 for "
              "identical hypotheses): the probability of a difference this large if the two trained networks "
              "were exchangeable on these sentences. Both paired tests measure test-set sampling, not "
              "training noise: two seeds of one config differ by them too; the verdict is the test over seeds. "
              "Train minutes: wall time of the training epochs from the log, with validation and checkpointing "
              "(start-up left out; an epoch cut short by a kill and redone counts once).", "",
              f"Validation loss of every run: `{meta['png']}`.", ""]
    lines += list(protocol_lines)  # the runs to convergence beside these (convergence.side_by_side)
    lines += stale_lines(stale, STALE_WHY)
    return "\n".join(lines)


def seed_tests(family, runs, subset, boot):
    """{test: its result per seed of ``runs`` (the family's, by seed) on ``subset``}, from ``boot`` as
    :func:`significance` gives it; none for the Transformer, the baseline of every test."""
    if family == BASELINE:
        return {}
    return {test: [(boot.get((family, r["seed"], subset)) or {}).get(test) for r in runs] for test in TESTS}


def family_rows(summary, subset):
    """(family, its summary entry, its scores on ``subset``, its mean train minutes) of every family
    scored on ``subset``: the rows of a study table's section."""
    for fam, e in summary.items():
        s = e["test_sets"].get(subset)
        if s is not None:
            yield fam, e, s, f"{sum(e['train_minutes']) / len(e['train_minutes']):.1f}"


def family_runs(families, records, labels):
    """(family, its records by seed, the start of its summary entry) of every family of ``families``
    with records (:func:`family_entry`)."""
    for fam in families:
        fr, entry = family_entry(fam, records, labels)
        if fr:
            yield fam, fr, entry


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
    return {"title": exp["title"] + overrides_note(args), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "records": shown_path(records_dir),
            "devices": sorted({f"{r['device']} (threads {r.get('threads')})" for r in records}),
            "commits": sorted({r["commit"] for r in records}),
            "configs": os.path.relpath(exp["configs"], REPO), "fairseq_args": args.fairseq_args}


def overrides_note(args):
    """What a study's headings add when its runs read another data folder than the experiment's (its
    path and subword model: the title names the experiment's data) or had fairseq options after ``--``
    (the title says the configs' sizes and budget, "d=256, 3+3 layers", which those options may override)."""
    note = ""
    if other_data(args):
        from man_recipes.data.subword import read_subword

        note += f" [data `{shown_path(args.data)}`, {read_subword(args.data)['kind']} subwords]"
    if getattr(args, "fairseq_args", None):
        note += f" [with fairseq options `{shlex.join(args.fairseq_args)}`, which override the configs' values above]"
    return note


def other_data(args):
    """Whether ``args.data`` is another folder than the experiment's default."""
    from man_recipes.studies.experiments import EXPERIMENTS

    exp = EXPERIMENTS.get(getattr(args, "experiment", None))
    return exp is not None and Path(args.data).resolve() != Path(exp["data"]).resolve()


def shown_path(path):
    """``path`` relative to the checkout when inside it (a table names no machine's folders)."""
    path = Path(path).resolve()
    return os.path.relpath(path, REPO) if path.is_relative_to(REPO) else str(path)


def one_run_command(study, seeds, flags, args):
    """The table's command for one run of it: the study, the options that change a score (``flags``)
    and where the table's runs read and write when not at the defaults (``--data``, ``--results-dir``),
    shell-quoted, so that it runs as printed (a path with a space, ``--adam-betas '(0.9, 0.98)'``)."""
    where = f" --data {shlex.quote(shown_path(args.data))}" if other_data(args) else ""
    if Path(args.results_dir).resolve() != (REPO / "results").resolve():
        where += f" --results-dir {shlex.quote(shown_path(args.results_dir))}"
    return (f"scripts/reproduce.sh {study} --seeds {seeds} --families FAMILY{where}{flags}"
            + (" -- " + shlex.join(args.fairseq_args) if args.fairseq_args else ""))


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
    return ["## Stale records (not in the table)", "", why, ""] + markdown_table(
        ["run", "fingerprint", "commit", "date"],
        [[f"{r['family']}-seed{r['seed']}", f"`{r.get('fingerprint')}`", f"`{r.get('commit')}`", f"{r.get('date')}"]
         for r in stale]) + [""]


def write_table(results_dir, experiment, markdown, payload, boot, current, stale, png, log):
    """Write ``<experiment>.md`` and ``.json`` (``payload``, then every run with its two paired tests,
    ``boot`` as :func:`significance` returns them, and the stale runs' names); returns the Markdown file."""
    runs = [dict(r, **{test: {k[2]: v[test] for k, v in boot.items() if k[:2] == (r["family"], r["seed"])}
                       for test in TESTS}) for r in current]
    (results_dir / f"{experiment}.md").write_text(markdown)
    (results_dir / f"{experiment}.json").write_text(json.dumps(
        dict(payload, runs=runs, stale=[f"{r['family']}-seed{r['seed']}" for r in stale]), indent=1) + "\n")
    log(f"wrote {results_dir / (experiment + '.md')}, .json and {png.name}")
    return results_dir / f"{experiment}.md"
