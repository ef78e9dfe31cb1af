"""A BLEU study's table (``scripts/reproduce.sh multi30k-cpu``), on :mod:`study_table`'s shared parts.

Per family and test set: sacreBLEU and tokenized BLEU as mean ± sample standard deviation over
seeds, the difference to the Transformer, the verdict over seeds (:mod:`seed_level`: training
noise, the test the verdicts rest on), and two paired tests of each seed against the Transformer
of the same seed, computed here from the records' hypothesis files (seeded, so a rebuild gives the
same p-values): sacreBLEU's paired bootstrap (the p the field reports) and sacreBLEU's paired
approximate randomization (its statistic reads a near-zero difference as the bootstrap's does not).
Both paired tests say whether two trained networks differ on these sentences (test-set sampling),
not whether two architectures do. Writes ``<experiment>.md``, ``.json`` and its figure
(:mod:`study_figure`).
"""

from pathlib import Path

from man_recipes.scoring import check_aligned, sacrebleu_detok
from man_recipes.studies import seed_level, seed_verdicts
from man_recipes.studies.convergence import protocol_payload, record_protocol, saturated_mask_lines, side_by_side
from man_recipes.studies.experiments import BASELINE, FAMILY_LABELS, FIXED_BUDGET, TO_CONVERGENCE, families_of
from man_recipes.studies.rouge_significance import AR_TRIALS
from man_recipes.studies.study_figure import plot_study
from man_recipes.studies.study_records import check_score, hypothesis_path, read_hypotheses
from man_recipes.studies.study_table import (SAMPLING, STALE_WHY, TESTS, family_rows, family_runs, fmt_p, header_lines,
                                             one_run_command, overrides_note, params, pm, same_seed_pairs, seed_tests,
                                             stale_lines, table_meta, write_table)
from man_recipes.tables import markdown_table, mean_std
from man_recipes.textfile import read_lines


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
    lines += list(verdict_lines)  # the verdict over seeds (seed_verdicts.protocol_sections)
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
            rows.append([e["label"], params(e["params"]), minutes, pm(s["sacrebleu"]), delta,
                         pm(s["bleu_tok_ci"]), *pcols, sig])
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


def build(study, exp, current, stale, records_dir, args, manifest, results_dir, png, flags, log, converged):
    """The table of the BLEU study ``study`` from its current records (and ``converged``: its runs to
    convergence, their stale ones and folder); returns the Markdown file."""

    tgt = manifest["target_lang"]
    ref_files = {subset: Path(args.data) / f"{subset}.raw.{tgt}" for subset in manifest["test_sets"]}
    refs = {subset: read_lines(path) for subset, path in ref_files.items()}
    log("paired bootstrap and approximate randomization against the Transformer of the same seed")
    boot = significance(current, records_dir, refs, args.bootstrap_samples, ref_files)
    conv, conv_stale, conv_dir = converged
    conv_tests = significance(conv, conv_dir, refs, args.bootstrap_samples, ref_files) if conv else {}
    summary = summarize(current, families_of(study), FAMILY_LABELS, boot)
    panels = [(f"sacreBLEU, {release}", lambda r, s=subset: r["test_sets"][s]["sacrebleu"] if s in r["test_sets"] else None)
              for subset, release in manifest["test_sets"].items()]
    plot_study(current, families_of(study), FAMILY_LABELS, panels, png,
               exp["title"].split(":")[0] + overrides_note(args), conv)
    first = next(iter(current[0]["test_sets"].values()))
    meta = dict(table_meta(exp, current, records_dir, args), **{
            "command": one_run_command(study, "1", flags, args),
            "test_sets": manifest["test_sets"], "sacrebleu_signature": first["sacrebleu_signature"],
            **{f"{name}_signature": next((b[test]["signature"] for b in boot.values()), "–")
               for name, test in (("bootstrap", "paired_bootstrap"), ("randomization", "paired_randomization"))},
            "png": png.name})
    subset = next(iter(manifest["test_sets"]))
    protocol_lines, family_means = side_by_side(
        current, conv, conv_stale, families_of(study), FAMILY_LABELS,
        lambda r: f"{r['test_sets'][subset]['sacrebleu']:.2f}" if subset in r["test_sets"] else "–",
        lambda r, tests: " / ".join(fmt_p(tests[t]["p_value"]) for t in TESTS),
        {**{(FIXED_BUDGET, *k): v for k, v in boot.items()}, **{(TO_CONVERGENCE, *k): v for k, v in conv_tests.items()}},
        subset, f"sacreBLEU, {manifest['test_sets'][subset]}",
        [("sacreBLEU", lambda r: r["test_sets"][subset]["sacrebleu"] if subset in r["test_sets"] else None,
          lambda tests: tests["paired_randomization"]["p_value"])]) if conv or conv_stale else ([], [])
    protocol_lines += saturated_mask_lines(current + conv)  # fixed-budget runs too
    log("the verdict over seeds: Welch's t with the test set's part, ASO, Holm")
    bleu = seed_level.CorpusBleu()
    folders = {FIXED_BUDGET: records_dir, TO_CONVERGENCE: conv_dir}
    units = {(record_protocol(r), r["family"], r["seed"]): bleu.units(
        read_hypotheses(folders[record_protocol(r)], r, subset), refs[subset]) for r in current + conv
        if subset in r["test_sets"]}
    verdict_lines, verdicts = seed_verdicts.protocol_sections(
        [(proto, [r for r in records if subset in r["test_sets"]]) for proto, records in
         ((FIXED_BUDGET, current), (TO_CONVERGENCE, conv))], families_of(study), FAMILY_LABELS,
        {"sacreBLEU": (lambda r: r["test_sets"][subset]["sacrebleu"],
                       lambda r: units[(record_protocol(r), r["family"], r["seed"])], bleu)}, "sacreBLEU",
        manifest["test_sets"][subset])
    payload = {"meta": meta, "summary": summary, "seed_level": verdicts}
    if conv or conv_stale:
        payload["to_convergence"] = protocol_payload(conv, conv_stale, conv_tests, TESTS, family_means)
    return write_table(results_dir, study,
                                   to_markdown(summary, meta, stale, protocol_lines, verdict_lines),
                                   payload, boot, current, stale, png, log)
