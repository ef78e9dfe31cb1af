"""A summarization study's table (``scripts/reproduce.sh gigaword-cpu``), rebuilt from its run
records alone: ROUGE-1/2/L F1 per family (mean ± sample standard deviation over seeds), the
difference to the Transformer of the same seed, the verdict over seeds (:mod:`seed_level`), two paired
tests over documents against the Transformer of the same seed (the bootstrap the field reports,
approximate randomization; both test-set sampling, not training noise), how much of each family's summaries (and of the references) their articles contain, a lead baseline and
the published numbers for reference. Writes ``<experiment>.md``, ``.json`` and
``<experiment>.png`` (:mod:`study_figure`: each run's ROUGE as a dot beside the validation loss).
"""

import json

from man_recipes.tables import markdown_table, mean_std
from man_recipes.config import CONFIG_DIR, load_config
from man_recipes.corpora import corpus
from man_recipes.evaluation.copying import copying
from man_recipes.evaluation.metric import score
from man_recipes.metrics import ROUGE
from man_recipes.studies.rouge_significance import (AR_TRIALS, BOOTSTRAP_SEED, lead_sentences, lead_words, paired_bootstrap,
                                             paired_randomization, scored_documents)
from man_recipes.evaluation.fixed_sample import sample_ids
from man_recipes.studies import seed_level, seed_verdicts
from man_recipes.studies.convergence import protocol_payload, record_protocol, saturated_mask_lines, side_by_side
from man_recipes.studies.experiments import BASELINE, FIXED_BUDGET, TO_CONVERGENCE
from man_recipes.studies.study_eval import StudyEvalError, read_references, read_test_lines
from man_recipes.studies.study_figure import figure_path, plot_study
from man_recipes.studies.study_records import check_score, option_flags, read_hypotheses
from man_recipes.studies.study_table import (SAMPLING, STALE_WHY, TESTS, family_rows, family_runs, fmt_p, header_lines,
                                             one_run_command, overrides_note, params, pm, same_seed_pairs, seed_tests,
                                             stale_lines, table_meta, write_table)

KEYS = ("rouge1", "rouge2", "rougeL")
NAMES = {"rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L"}
# a corpus's lead baseline (its record's ``lead``): the first n words or sentences of the article
LEAD_UNITS = {"words": lead_words, "sentences": lead_sentences}


def document_scores(records, records_dir, refs):
    """{(family, seed, subset): {metric: per-document F1}} of every record on every subset with
    references, each checked against the scores its record says (:func:`study_records.check_score`)."""
    docs = {}
    for r in records:
        for subset in [s for s in r["test_sets"] if s in refs]:
            t = r["test_sets"][subset]
            scored = scored_documents(read_hypotheses(records_dir, r, subset), refs[subset], t["rouge_order"],
                                      t["exception_db"])
            for k in KEYS:
                check_score(records_dir, r, subset, k, scored[k])
            docs[(r["family"], r["seed"], subset)] = scored["documents"]
    return docs


def significance(records, docs, refs, n_samples):
    """{(family, seed, subset): {"paired_bootstrap": {metric: test}, "paired_randomization": {metric: test}}}
    of every run against the same seed's Transformer; ``docs``: the runs' :func:`document_scores`."""
    def doc_scores(r, subset):
        return docs[(r["family"], r["seed"], subset)]

    out = {}
    for r, b, subset in same_seed_pairs(records, refs):
        sd, bd = doc_scores(r, subset), doc_scores(b, subset)
        out[(r["family"], r["seed"], subset)] = {
            "paired_bootstrap": {k: paired_bootstrap(bd[k], sd[k], n_samples) for k in KEYS},
            "paired_randomization": {k: paired_randomization(bd[k], sd[k]) for k in KEYS}}
    return out


def copying_of_runs(records, records_dir, articles):
    """{(family, seed, subset): the copying of its hypotheses} (:func:`..evaluation.copying.copying`)."""
    return {(r["family"], r["seed"], subset): copying(read_hypotheses(records_dir, r, subset), articles[subset])
            for r in records for subset in r["test_sets"] if subset in articles}


def summarize(records, families, labels, boot, copied):
    summary = {}
    base = {r["seed"]: r for r in records if r["family"] == BASELINE}
    for fam, fr, entry in family_runs(families, records, labels):
        for subset in fr[0]["test_sets"]:
            s = {"name": fr[0]["test_sets"][subset]["name"]}
            for k in KEYS:
                values = [r["test_sets"][subset][k] for r in fr]
                # matched seeds, like the bootstrap
                diffs = [r["test_sets"][subset][k] - base[r["seed"]]["test_sets"][subset][k]
                         for r in fr if r["seed"] in base and subset in base[r["seed"]]["test_sets"]]
                s[k] = values
                s[f"{k}_mean_std"] = mean_std(values)
                s[f"delta_{k}"] = round(sum(diffs) / len(diffs), 2) if diffs else None
            s["copying"] = [copied.get((fam, r["seed"], subset)) for r in fr]
            s.update(seed_tests(fam, fr, subset, boot))
            entry["test_sets"][subset] = s
        summary[fam] = entry
    return summary


def record_samples(records, manifest):
    """{subset: the sentence ids the runs scored (None: all)}, from their records, which must agree."""
    samples = {}
    for subset in manifest["test_sets"]:
        specs = {json.dumps(r["test_sets"][subset].get("sample"), sort_keys=True)
                 for r in records if subset in r["test_sets"]}
        if len(specs) > 1:
            raise StudyEvalError(f"the runs scored different samples of {subset} ({', '.join(sorted(specs))}): "
                                 "rescore them with one config (eval.test_sample)")
        spec = json.loads(specs.pop()) if specs else None
        if spec and spec["of"] != manifest["counts"][subset]:
            raise StudyEvalError(f"the runs' sample of {subset} was drawn from {spec['of']} pairs; the data "
                                 f"folder's {subset} has {manifest['counts'][subset]}")
        samples[subset] = sample_ids(spec["of"], spec["n"], spec["seed"]) if spec else None
    return samples


def references_table(dataset, manifest, exception_db, order, articles, refs):
    """Rows for the lead baseline (computed here, on the articles and references the runs were scored
    on, ``{subset: lines}``) and the published numbers (from the configs)."""
    rows, c = [], corpus(dataset)
    if c.lead is not None:
        what, lead_of = c.lead.what, LEAD_UNITS[c.lead.unit]
        for subset, release in manifest["test_sets"].items():
            lead = [lead_of(line, c.lead.n) for line in articles[subset]]
            r = score(ROUGE.name, lead, refs[subset], rouge_order=order, rouge_exception_db=exception_db).rouge
            rows.append({"what": f"{what}, {release}", "lead_subset": subset, "metric":
                         "ROUGE-1.5.5 as files2rouge, same references and settings as the runs",
                         **{k: r[k] for k in KEYS}})
    for row in c.published_rows:
        cfg = load_config(CONFIG_DIR / f"{row}.yaml")
        pr = cfg["paper_results"]
        rows.append({"what": f"published: {cfg['row']} (MAN paper Table {cfg['table']}, full data, d=768, 6+6 layers)",
                     "metric": f"ROUGE-1.5.5 F1 via files2rouge; {c.published_data}",
                     **{k: pr[k] for k in KEYS}})
    return rows


def p_column(seeds, tests):
    """One test's p-values of a family, per seed: R-1 / R-2 / R-L with the sign of each difference."""
    return "; ".join(
        f"seed {seed}: " + " / ".join(f"{fmt_p(t[k]['p_value'])} ({'+' if t[k]['system'] >= t[k]['baseline'] else '−'})"
                                      for k in KEYS)
        for seed, t in zip(seeds, tests or []) if t) or "–"


def _share(values, key):
    """The mean over seeds of one share of :func:`..evaluation.copying.copying`, as the table prints it."""
    values = [v for v in values if v]
    if not values or any(v[key] is None for v in values):
        return "–"
    return f"{sum(v[key] for v in values) / len(values):.2f}"


def _copied(values):
    """'words / bigrams' found in the article, the mean over seeds."""
    return f"{_share(values, 'words')} / {_share(values, 'bigrams')}"


def to_markdown(summary, meta, stale, reference_rows, reference_copying, protocol_lines=(), verdict_lines=()):
    lines = header_lines(meta, f"data: {meta['subset']}")
    lines += list(verdict_lines)  # the verdict over seeds (seed_verdicts.protocol_sections)
    for subset, release in meta["test_sets"].items():
        rows = []
        for fam, e, s, minutes in family_rows(summary, subset):
            if fam == BASELINE:
                delta, pcols = "0 (baseline)", ["baseline", "baseline"]
            else:
                delta = " / ".join("–" if s[f"delta_{k}"] is None else f"{s[f'delta_{k}']:+.2f}" for k in KEYS)
                pcols = [p_column(e["seeds"], s.get(test)) for test in TESTS]
            rows.append([e["label"], params(e["params"]), minutes, *(pm(s[k]) for k in KEYS),
                         _copied(s.get("copying") or []), delta, *pcols])
        lines += [f"## {release}", ""] + markdown_table(
            ["family", "params", "train min (mean)", "R-1", "R-2", "R-L", "from its article: words / bigrams",
             "Δ R-1 / R-2 / R-L vs Transformer", f"paired bootstrap p, R-1 / R-2 / R-L (per seed, sign of Δ; {SAMPLING})",
             f"approximate randomization p, R-1 / R-2 / R-L (per seed, sign of Δ; {SAMPLING})"], rows)
        ref = reference_copying.get(subset)
        if ref:
            lines += ["", f"From its article: of all the summaries' words (bigrams), the share found in their own article, "
                          f"pooled over the documents (lowercase tokens, sentence tags dropped). The references: "
                          f"{_copied([ref])}. Chance level (each summary against the next document's article), "
                          f"bigrams: the references {_share([ref], 'bigrams_chance')}, "
                          + ", ".join(f"{e['label']} {_share(e['test_sets'][subset]['copying'], 'bigrams_chance')}"
                                      for e in summary.values() if subset in e["test_sets"]) + "."]
        lines.append("")
    lines += ["For reference (not comparable runs):", ""] + markdown_table(
        ["what", "R-1", "R-2", "R-L", "how scored"],
        [[r["what"], f"{r['rouge1']:.2f}", f"{r['rouge2']:.2f}", f"{r['rougeL']:.2f}", r["metric"]]
         for r in reference_rows])
    lines += ["", f"ROUGE: {meta['rouge']}. Mean ± sample standard deviation over seeds. Δ: mean over the family's "
              "seeds of its difference to the Transformer of the same seed. Both tests pair each run "
              "with the Transformer of the same seed over the same documents and are two-sided. Paired bootstrap: "
              f"{meta['bootstrap']}; the p the field reports, whose statistic reads a near-zero difference as more "
              f"significant than it is. Approximate randomization: {meta['randomization']}; the probability of a "
              "difference this large if the two trained networks were exchangeable on these documents. Both "
              "paired tests measure test-set sampling, not training noise (two seeds of one config differ by "
              "them too); the verdict is the test over seeds. Train "
              f"minutes: wall time of the training epochs from the log, with validation and checkpointing. {meta['scored']}", "",
              f"Each run's scores and validation loss: `{meta['png']}`.", ""]
    lines += list(protocol_lines)  # the runs to convergence beside these (convergence.side_by_side)
    lines += stale_lines(stale, STALE_WHY)
    return "\n".join(lines)


def scored_checkpoints(records):
    """What the runs were scored on, from their records (how many checkpoints each averaged)."""
    counts = sorted({len(r.get("averaged_checkpoints") or []) for r in records})
    if counts == [1]:
        return "Each run is scored on its last checkpoint (no averaging)."
    return f"Each run is scored on the average of its last {' or '.join(map(str, counts))} checkpoints."


def build(experiment, exp, current, stale, records_dir, args, manifest, results_dir, families, labels, log,
          converged=([], [], None)):
    """The table of ``current`` (the fixed budget's records) and, from ``converged`` (current records,
    stale ones and their folder), the runs to convergence beside them."""
    conv, conv_stale, conv_dir = converged
    samples = record_samples(current + conv, manifest)
    refs = {subset: read_references(args.data, manifest, subset, samples[subset])[1] for subset in manifest["test_sets"]}
    log("paired bootstrap and approximate randomization over documents against the Transformer of the same seed")
    docs = {FIXED_BUDGET: document_scores(current, records_dir, refs),
            TO_CONVERGENCE: document_scores(conv, conv_dir, refs) if conv else {}}
    boot = significance(current, docs[FIXED_BUDGET], refs, args.bootstrap_samples)
    conv_tests = significance(conv, docs[TO_CONVERGENCE], refs, args.bootstrap_samples) if conv else {}
    articles = {subset: read_test_lines(args.data, manifest["sources"][subset], f"the articles of {subset}",
                                        samples[subset])[1] for subset in manifest["test_sets"]}
    copied = {FIXED_BUDGET: copying_of_runs(current, records_dir, articles),
              TO_CONVERGENCE: copying_of_runs(conv, conv_dir, articles)}
    summary = summarize(current, families, labels, boot, copied[FIXED_BUDGET])
    reference_copying = {subset: copying(refs[subset], articles[subset]) for subset in manifest["test_sets"]}
    first = next(iter(current[0]["test_sets"].values()))
    reference_rows = references_table(exp["dataset"], manifest, first["exception_db"], first["rouge_order"], articles,
                                      refs)
    png = figure_path(results_dir, experiment, exp["metric"])
    subset = next(iter(manifest["test_sets"]))
    lead = next((row for row in reference_rows if row.get("lead_subset") == subset), None)
    panels = [(NAMES[k], lambda r, k=k: r["test_sets"][subset][k] if subset in r["test_sets"] else None,
               (lead["what"].split(" (")[0], lead[k]) if lead else None) for k in KEYS]
    # the scored set on a line of its own: its name is longer than a panel is wide
    plot_study(current, families, labels, panels, png,
               f"{exp['title'].split(':')[0]}{overrides_note(args)}\nscored on: {manifest['test_sets'][subset]}", conv)
    meta = dict(table_meta(exp, current, records_dir, args), subset=manifest.get("subset"), **{
            "command": one_run_command(experiment, "1,", option_flags(args, exp.get("device")), args),
            "test_sets": manifest["test_sets"], "rouge": first["rouge_implementation"],
            "bootstrap": (f"{args.bootstrap_samples} resamples of the documents (numpy default_rng seed {BOOTSTRAP_SEED}), "
                          "each run's per-document F1 of ROUGE-1.5.5 (-d), sacreBLEU's paired-bootstrap statistic"),
            "randomization": (f"{AR_TRIALS} trials (numpy default_rng seed {BOOTSTRAP_SEED}, sacreBLEU's draws), each "
                              "swapping each document's two per-document F1 with probability 1/2; p = (trials with "
                              "|mean difference| at least the observed + 1) / (trials + 1)"),
            "png": png.name, "scored": scored_checkpoints(current)})
    def score_cell(r):  # its ROUGE and how much of its summaries its articles hold (the main table's column)
        if subset not in r["test_sets"]:
            return "–"
        c = copied[record_protocol(r)].get((r["family"], r["seed"], subset))
        return " / ".join(f"{r['test_sets'][subset][k]:.2f}" for k in KEYS) + (
            f"; {c['words']:.2f} / {c['bigrams']:.2f}" if c else "")

    protocol_lines, family_means = side_by_side(
        current, conv, conv_stale, families, labels, score_cell,
        lambda r, tests: "; ".join(" / ".join(fmt_p(tests[t][k]["p_value"]) for k in KEYS) for t in TESTS),
        {**{(FIXED_BUDGET, *k): v for k, v in boot.items()}, **{(TO_CONVERGENCE, *k): v for k, v in conv_tests.items()}},
        subset, "R-1 / R-2 / R-L; from its article: words / bigrams (the share of the summaries' words and bigrams "
                "found in their own article, as the main table counts them); p per test R-1 / R-2 / R-L",
        [(NAMES[k], lambda r, k=k: r["test_sets"][subset][k] if subset in r["test_sets"] else None,
          lambda tests, k=k: tests["paired_randomization"][k]["p_value"]) for k in KEYS]
    ) if conv or conv_stale else ([], [])
    protocol_lines += saturated_mask_lines(current + conv)  # fixed-budget runs too
    log("the verdict over seeds: Welch's t with the test set's part, ASO, Holm")
    verdict_lines, verdicts = seed_verdicts.protocol_sections(
        [(proto, [r for r in records if subset in r["test_sets"]]) for proto, records in
         ((FIXED_BUDGET, current), (TO_CONVERGENCE, conv))], families, labels,
        {NAMES[k]: (lambda r, k=k: r["test_sets"][subset][k],
                    lambda r, k=k: docs[record_protocol(r)][(r["family"], r["seed"], subset)][k],
                    seed_level.MeanOfDocuments()) for k in KEYS}, NAMES[KEYS[0]], manifest["test_sets"][subset])
    payload = {"meta": meta, "summary": summary, "references": reference_rows, "references_copying": reference_copying,
               "seed_level": verdicts}
    if conv or conv_stale:
        payload["to_convergence"] = protocol_payload(conv, conv_stale, conv_tests, TESTS, family_means)
        for r in payload["to_convergence"]["runs"]:
            r["copying"] = {s: copied[TO_CONVERGENCE].get((r["family"], r["seed"], s)) for s in r["test_sets"]}
    return write_table(results_dir, experiment,
                       to_markdown(summary, meta, stale, reference_rows, reference_copying, protocol_lines,
                                   verdict_lines),
                       payload, boot, current, stale, png, log)
