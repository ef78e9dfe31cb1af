"""A study's table rebuilt from its run records alone (``scripts/reproduce.sh EXPERIMENT [--table-only]``):
which records are current under today's configs and options, and the table of the study's metric
(:mod:`bleu_table` for BLEU, :mod:`summarization_table` for ROUGE, both on :mod:`study_table`) with, where the study has a
to-convergence protocol (``EXPERIMENT-converge``, :mod:`convergence`), its runs beside the fixed budget's.
"""

from man_recipes.config import load_config
from man_recipes.metrics import experiment_metric
from man_recipes.studies.experiments import EXPERIMENTS, FAMILY_LABELS, convergence_experiment, families_of, table_experiment
from man_recipes.studies.study_figure import figure_path
from man_recipes.studies.study_records import (RecordError, option_flags, partition, read_records,
                                                record_fingerprint, record_path)


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
    if not experiment_metric(experiment["metric"]).is_rouge:
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
    check_test_sets(current, records_dir, manifest)  # a stale record is never tabulated: another data's may differ
    for r in stale:
        protocol = "" if experiment == table_experiment(experiment) else f" of {experiment}"
        log(f"stale record {r['family']}-seed{r['seed']}{protocol} (fingerprint {r.get('fingerprint')}): "
            "not in the table")
    return current, stale, records_dir


def check_test_sets(records, records_dir, manifest):
    """RecordError unless every test set a current record scores is one of the data folder's: a test set
    renamed in a record by hand was left out of the table unsaid."""
    known = manifest["test_sets"]
    for r in records:
        for subset in r["test_sets"]:
            if subset not in known:
                raise RecordError(f"{record_path(records_dir, r['family'], r['seed'])}: its test set {subset} is not one "
                                  f"of the data folder's ({', '.join(known)}); renamed? restore it (git checkout) or "
                                  "rerun that run (--force)")


def check_table_is_ours(experiment, results_dir):
    """TableError, before any run, unless every file of ``experiment``'s study table in ``results_dir``
    is one this module wrote or none is there (a user's own ``gigaword-cpu.md`` is never replaced;
    ``--force`` skips this)."""
    from man_recipes.studies.study_table import foreign_table

    study = table_experiment(experiment)
    path = foreign_table(results_dir, study, figure_path(results_dir, study, EXPERIMENTS[study]["metric"]))
    if path is not None:
        raise TableError(f"{path} was not written by scripts/reproduce.sh (no table of ours: its marker line or "
                         f"the .json beside it); refusing to replace it with {study}'s table: move it away, choose "
                         "another --results-dir, or pass --force")


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
    if experiment_metric(exp["metric"]).is_rouge:
        from man_recipes.studies import summarization_table  # imported here: a long study picks up a table fixed meanwhile

        return summarization_table.build(study, exp, current, stale, records_dir, args, manifest, results_dir,
                                         families_of(study), FAMILY_LABELS, log, converged)
    from man_recipes.studies import bleu_table  # imported here: a long study picks up a table fixed meanwhile

    return bleu_table.build(study, exp, current, stale, records_dir, args, manifest, results_dir, png, flags, log, converged)
