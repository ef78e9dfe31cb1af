"""A study's table rebuilt from its run records alone (``scripts/reproduce.sh EXPERIMENT [--table-only]``):
which records are current under today's configs and options, and the table of the study's metric
(:mod:`study_table` for BLEU, :mod:`summarization_table` for ROUGE) with, where the study has a
to-convergence protocol (``EXPERIMENT-converge``, :mod:`convergence`), its runs beside the fixed budget's.
"""

from pathlib import Path

from man_recipes.config import load_config
from man_recipes.textfile import read_lines
from man_recipes.studies.experiments import (EXPERIMENTS, FAMILY_LABELS, FIXED_BUDGET, TO_CONVERGENCE, convergence_experiment, families_of,
                          table_experiment)
from man_recipes.studies.study_figure import figure_path, plot_study
from man_recipes.studies.study_records import option_flags, partition, read_records, record_fingerprint


class TableError(RuntimeError):
    pass


def scoring_config(cfg, experiment, args, manifest):
    """``cfg`` with the scoring options of the command line that change a score resolved into its
    ``eval`` (so they are part of the fingerprint): ROUGE's exception database, ``--test-sample``.
    A sample of every pair of each test set (0, or more than the largest holds) is no sample: the
    key goes, so scoring all of them is one fingerprint however it was asked for."""
    evaluation = dict(cfg["eval"])
    if args.test_sample is not None:
        evaluation["test_sample"] = args.test_sample
    sample = evaluation.get("test_sample")
    if sample is not None:
        counts = manifest.get("counts", {})  # a data folder's record older than its counts: unknown
        largest = max((counts.get(subset, 0) for subset in manifest["test_sets"]), default=0)
        if sample == 0 or 0 < largest <= sample:
            del evaluation["test_sample"]
    cfg = dict(cfg, eval=evaluation)
    if experiment["metric"] != "rouge":
        return cfg  # the BLEU studies' fingerprints stay as their committed records have them
    return dict(cfg, eval=dict(cfg["eval"], rouge_exception_db=args.rouge_exception_db))


def experiment_configs(experiment, args, manifest, families=None):
    """{family: its config under ``args``} of ``experiment`` (every family it has by default)."""
    exp = EXPERIMENTS[experiment]
    return {f: scoring_config(load_config(exp["configs"] / f"{f}.yaml"), exp, args, manifest)
            for f in families or families_of(experiment)}


def current_records(experiment, args, manifest, results_dir, log):
    """(current, stale, records folder) of ``experiment``'s records under today's configs and ``args``."""
    cfgs = experiment_configs(experiment, args, manifest)
    records_dir = results_dir / experiment
    records = read_records(records_dir)
    expected = {(r["family"], r["seed"]): record_fingerprint(cfgs[r["family"]], args, r["seed"])
                for r in records if r["family"] in cfgs}
    current, stale = partition(records, expected)
    for r in stale:
        protocol = "" if experiment == table_experiment(experiment) else f" of {experiment}"
        log(f"stale record {r['family']}-seed{r['seed']}{protocol} (fingerprint {r.get('fingerprint')}): "
            "not in the table")
    return current, stale, records_dir


def build_table(experiment, args, manifest, results_dir, log):
    """Rebuild the table of ``experiment``'s study (a to-convergence protocol's is its study's):
    ``RESULTS/<study>.md``, ``.json`` and its figure (``study_figure.figure_path``), from the records alone."""
    from man_recipes.studies import study_table

    study = table_experiment(experiment)
    exp = EXPERIMENTS[study]
    current, stale, records_dir = current_records(study, args, manifest, results_dir, log)
    converging = convergence_experiment(study)
    converged = current_records(converging, args, manifest, results_dir, log) if converging else ([], [], None)
    flags = option_flags(args, exp.get("device"))
    if not current and (not stale or flags or args.fairseq_args):
        raise TableError(f"no current run record in {records_dir}: nothing to tabulate" + (
            f" ({len(stale)} stale: pass the options they were made with)" if stale else ""))
    png = figure_path(results_dir, study, exp["metric"])
    if not current:  # with the default options: the configs changed under every record
        return study_table.write_without_runs(results_dir, study, exp["title"], stale, png, log)
    if exp["metric"] == "rouge":
        from man_recipes.studies import summarization_table  # imported here: a long study picks up a table fixed meanwhile

        return summarization_table.build(study, exp, current, stale, records_dir, args, manifest, results_dir,
                                         families_of(study), FAMILY_LABELS, log, converged)
    return bleu_table(study, exp, current, stale, records_dir, args, manifest, results_dir, png, flags, log, converged)


def bleu_table(study, exp, current, stale, records_dir, args, manifest, results_dir, png, flags, log, converged):
    from man_recipes.studies import seed_level, study_table
    from man_recipes.studies.convergence import protocol_payload, record_protocol, saturated_mask_lines, side_by_side
    from man_recipes.studies.study_records import read_hypotheses

    tgt = manifest["target_lang"]
    ref_files = {subset: Path(args.data) / f"{subset}.raw.{tgt}" for subset in manifest["test_sets"]}
    refs = {subset: read_lines(path) for subset, path in ref_files.items()}
    log("paired bootstrap and approximate randomization against the Transformer of the same seed")
    boot = study_table.significance(current, records_dir, refs, args.bootstrap_samples, ref_files)
    conv, conv_stale, conv_dir = converged
    conv_tests = study_table.significance(conv, conv_dir, refs, args.bootstrap_samples, ref_files) if conv else {}
    summary = study_table.summarize(current, families_of(study), FAMILY_LABELS, boot)
    panels = [(f"sacreBLEU, {release}", lambda r, s=subset: r["test_sets"][s]["sacrebleu"] if s in r["test_sets"] else None)
              for subset, release in manifest["test_sets"].items()]
    plot_study(current, families_of(study), FAMILY_LABELS, panels, png,
               exp["title"].split(":")[0] + study_table.overrides_note(args), conv)
    first = next(iter(current[0]["test_sets"].values()))
    meta = dict(study_table.table_meta(exp, current, records_dir, args), **{
            "command": study_table.one_run_command(study, "1", flags, args),
            "test_sets": manifest["test_sets"], "sacrebleu_signature": first["sacrebleu_signature"],
            **{f"{name}_signature": next((b[test]["signature"] for b in boot.values()), "–")
               for name, test in (("bootstrap", "paired_bootstrap"), ("randomization", "paired_randomization"))},
            "png": png.name})
    subset = next(iter(manifest["test_sets"]))
    protocol_lines, family_means = side_by_side(
        current, conv, conv_stale, families_of(study), FAMILY_LABELS,
        lambda r: f"{r['test_sets'][subset]['sacrebleu']:.2f}" if subset in r["test_sets"] else "–",
        lambda r, tests: " / ".join(study_table.fmt_p(tests[t]["p_value"]) for t in study_table.TESTS),
        {**{(FIXED_BUDGET, *k): v for k, v in boot.items()}, **{(TO_CONVERGENCE, *k): v for k, v in conv_tests.items()}},
        subset, f"sacreBLEU, {manifest['test_sets'][subset]}",
        [("sacreBLEU", lambda r: r["test_sets"][subset]["sacrebleu"] if subset in r["test_sets"] else None,
          lambda tests: tests["paired_randomization"]["p_value"])]) if conv or conv_stale else ([], [])
    protocol_lines += saturated_mask_lines(current + conv)  # fixed-budget runs too
    log("the verdict over seeds: two-level bootstrap, Welch's t, ASO, Holm")
    bleu = seed_level.CorpusBleu()
    folders = {FIXED_BUDGET: records_dir, TO_CONVERGENCE: conv_dir}
    units = {(record_protocol(r), r["family"], r["seed"]): bleu.units(
        read_hypotheses(folders[record_protocol(r)], r, subset), refs[subset]) for r in current + conv
        if subset in r["test_sets"]}
    verdict_lines, verdicts = seed_level.protocol_sections(
        [(proto, [r for r in records if subset in r["test_sets"]]) for proto, records in
         ((FIXED_BUDGET, current), (TO_CONVERGENCE, conv))], families_of(study), FAMILY_LABELS,
        {"sacreBLEU": (lambda r: r["test_sets"][subset]["sacrebleu"],
                       lambda r: units[(record_protocol(r), r["family"], r["seed"])], bleu)}, "sacreBLEU",
        manifest["test_sets"][subset])
    payload = {"meta": meta, "summary": summary, "seed_level": verdicts}
    if conv or conv_stale:
        payload["to_convergence"] = protocol_payload(conv, conv_stale, conv_tests, study_table.TESTS, family_means)
    return study_table.write_table(results_dir, study,
                                   study_table.to_markdown(summary, meta, stale, protocol_lines, verdict_lines),
                                   payload, boot, current, stale, png, log)
