"""Multi30k studies of every family against the Transformer (``scripts/reproduce.sh EXPERIMENT``).

Experiments (:mod:`experiments`): ``multi30k`` (the papers' small width, ``configs/multi30k/``),
``multi30k-cpu`` (a 2-core-CPU preset, ``configs/multi30k-cpu/``), ``gigaword-cpu`` and ``cnndm-cpu``
(ROUGE), and ``multi30k-cpu-converge`` / ``gigaword-cpu-converge``: the same studies trained to
convergence (:mod:`convergence`). For each family and seed: train with the recipe launcher
(:mod:`launch`, one process), average the last epoch checkpoints (to convergence: take the best
one), decode every test set with fairseq-generate, score, and write the run's record
(:mod:`study_records`) under ``RESULTS/<experiment>/``. The table (:mod:`table_build`:
``RESULTS/<study>.md``, ``.json`` and a figure, with two paired tests against the same seed's
Transformer, and the runs to convergence beside the fixed budget's) is rebuilt from the records
alone, so a study can advance run by run across machines.

A rerun does not retrain a run whose record matches today's config (its fingerprint); an
interrupted training resumes from its ``checkpoint_last.pt`` (fairseq's own restore); a run folder
of another config is refused; ``--force`` retrains and rescores the selected runs from scratch. A
record made on another data folder (its ``data_identity``: subword model, dictionaries) is refused
before any run unless ``--force`` names its family.
``--table-only`` rebuilds the table from the records without training anything.

``--time-updates N`` instead measures, per family, seconds per update over N updates at the
config's width and batch and extrapolates one epoch (``RESULTS/<experiment>-timing-<device>.json``).
"""

import argparse
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path

from man_recipes import rouge155
from man_recipes.logging_setup import quiet_logging
from man_recipes.metrics import experiment_metric
from man_recipes.provenance import cpu_model, git_commit
from man_recipes.scoring import ScoreInputError
from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.paths import output_folder_problem
from man_recipes.textfile import NotUtf8Error
from man_recipes.config import REPO, load_config
from man_recipes.data.dataprep import PrepError
from man_recipes.data.manifest import read_manifest
from man_recipes.data.subword import read_subword
from man_recipes.evaluation.evaluate import EvaluateError
from man_recipes.options import PRECISION_HELP, PRECISIONS, SEEDS_HELP, batch_size, number, resamples, resolve_precision, seeds, visible_gpus
from man_recipes.training.fairseq_log import LogError, model_params, seconds_per_update
from man_recipes.workdir import try_lock
from man_recipes.studies.experiments import (EXPERIMENTS, FAMILIES, convergence_experiment, other_families,  # noqa: F401  (reproduce.FAMILIES)
                          parse_families, prepare_line, table_experiment)
from man_recipes.studies.study_eval import StudyEvalError, evaluate_run
from man_recipes.studies.study_records import RecordError, data_identity, legacy_training_fingerprint, record_fingerprint
from man_recipes.studies.table_build import TableError, build_table, check_table_is_ours, experiment_configs
from man_recipes.studies.table_build import scoring_config  # noqa: F401  (reproduce.scoring_config)


class ReproduceError(RuntimeError):
    pass


def log(msg):
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def device_name(device):
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)} (1 GPU)"
    return f"CPU: {cpu_model()}, {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"


def prepare_run_dir(run, fingerprint, force, legacy=None):
    """Make ``run`` ready to train the run of ``fingerprint``; True when it already finished.

    A run folder remembers its fingerprint (``.fingerprint``). One of another config is never
    resumed (fairseq would continue its checkpoints under the new options): it is an error, and
    ``--force`` starts it afresh, removing only a folder the launcher made (``run.json``). A stamp
    equal to ``legacy`` (the same training, fingerprinted the older way) is rewritten as ``fingerprint``.
    """
    done, stamp = run / ".train.done", run / ".fingerprint"
    if run.exists() and any(run.iterdir()):
        stamped = stamp.read_text().strip() if stamp.is_file() else None
        same = stamped is not None and stamped in (fingerprint, legacy)
        if force or not same:
            if not (run / "run.json").is_file():
                raise ReproduceError(f"{run} exists and is not a run folder of ours (no run.json); "
                                     "remove it yourself or choose another --runs-dir")
            if not force:
                raise ReproduceError(f"{run} holds a run of another config or options (fingerprint "
                                     f"{stamp.read_text().strip() if stamp.is_file() else 'unknown'}, today "
                                     f"{fingerprint}); pass --force to train it afresh")
            log(f"force: removing {run} (a run folder of ours)")
            shutil.rmtree(run)
        else:
            stamp.write_text(fingerprint + "\n")  # a legacy stamp becomes today's
            if done.is_file():
                return True
    run.mkdir(parents=True, exist_ok=True)
    stamp.write_text(fingerprint + "\n")
    return False


def run_lock(runs_dir, name):
    """Whether this process owns the (family, seed) run: two scripts/reproduce.sh at once (say one per
    family, as on a 2-core machine) must not train the same run folder; the baseline is in both."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    return try_lock(runs_dir / f".{name}.lock")  # beside the folder: --force removes the folder


def train_run(cfg, run, seed, args, fingerprint, force=False):
    """Train one (family, seed) run unless it finished; an interrupted one resumes."""
    from man_recipes.training import launch

    if prepare_run_dir(run, fingerprint, force, legacy_training_fingerprint(cfg, args, seed)):
        log(f"skip  training {run.name} (finished, same config)")
        return
    resumed = (run / "checkpoints" / "checkpoint_last.pt").is_file()
    log(f"{'resume' if resumed else 'start'} training {run.name}")
    try:
        # the config as its file has it: the run folder's config.yaml holds no scoring option
        rc = launch.train(load_config(cfg["_path"]), run, data=args.data, nproc=1, cpu=args.device == "cpu", precision=args.precision,
                          seed=seed, extra=args.fairseq_args)
    except launch.LaunchError as e:
        raise ReproduceError(f"training {run.name}: {e}") from e
    if rc != 0:
        raise ReproduceError(f"training {run.name} failed (exit {rc}); log: {run / 'train.log'}. "
                             "Run the same command again to resume it.")
    (run / ".train.done").write_text(datetime.datetime.now(datetime.timezone.utc).isoformat() + "\n")


# ---------------------------------------------------------------------------------- timing

# --time-updates' ceiling: seconds per update settle within a few hundred updates; 10^12 ran until the
# config's max-epoch stopped it, and then the error blamed a --log-interval no one had given
MAX_TIME_UPDATES = 100_000


def time_families(families, cfgs, args, on_family=None):
    """Seconds per update over ``args.time_updates`` updates per family, extrapolated to an epoch.

    ``on_family(rows)`` is called after each family, so an interrupted measurement keeps what it has.
    """
    from man_recipes.training import launch

    rows = {}
    for fam in families:
        run = Path(args.runs_dir) / f"timing-{args.device}-{fam}"
        if run.exists():
            # a fresh, complete measurement each time; only a run folder launch made (run.json) is removed
            if not (run / "run.json").is_file() and any(run.iterdir()):
                raise ReproduceError(f"{run} exists and is not a timing run of ours (no run.json); "
                                     "remove it yourself or choose another --runs-dir")
            shutil.rmtree(run)
        n = args.time_updates
        interval = max(1, n // 5)
        log(f"timing {fam}: {n} updates")
        extra = ["--max-update", str(n), "--log-interval", str(interval), "--no-save", "--disable-validation"]
        if launch.train(load_config(cfgs[fam]["_path"]), run, data=args.data, nproc=1, cpu=args.device == "cpu",
                        precision=args.precision, seed=1, extra=extra + list(args.fairseq_args)) != 0:
            raise ReproduceError(f"timing run {fam} failed; log: {run / 'train.log'}")
        try:
            spu, size = seconds_per_update(run / "train.log")
        except LogError as e:  # the run stopped first (its config's max-epoch): it is --time-updates that asked too much
            raise ReproduceError(f"--time-updates {n}: timing run {fam} ended before its progress lines (one every "
                                 f"{interval} updates) could time it ({e}); did its config's max-epoch stop it? "
                                 "Ask for fewer updates") from e
        rows[fam] = {"seconds_per_update": round(spu, 3), "updates_per_epoch": size,
                     "epoch_minutes_extrapolated": round(spu * size / 60, 1),
                     "params": model_params(run / "train.log"), "updates_timed": n, "log_interval": interval}
        log(f"      {fam}: {spu:.2f} s/update x {size} updates/epoch = {spu * size / 60:.1f} min/epoch (extrapolated)")
        if on_family:
            on_family(rows)
    return rows


# ------------------------------------------------------------------------------------ main

def build_parser():
    p = argparse.ArgumentParser(
        prog="scripts/reproduce.sh",
        description="Train every family and the Transformer on Multi30k or Gigaword for several seeds, average, "
                    "decode, score (sacreBLEU + tokenized BLEU, or ROUGE-1.5.5 as files2rouge), write one record "
                    "per run, and rebuild the table (paired bootstrap against the Transformer, PNG) from the records.")
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--seeds", type=seeds, default="3", help=SEEDS_HELP)
    p.add_argument("--families", default=None,
                   help=f"comma-separated subset of {','.join(FAMILIES)} (default: every family the experiment has "
                        f"configs for: these, but {other_families()}; the Transformer is always run: it is the baseline "
                        "of the significance test)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cpu for multi30k-cpu (its records were made there), else cuda when visible")
    p.add_argument("--precision", choices=PRECISIONS, default=None, help=PRECISION_HELP)
    p.add_argument("--data", default=None, help="binarized data (default data-bin/multi30k.de-en; gigaword-cpu: "
                   "data-bin/gigaword-30k)")
    p.add_argument("--runs-dir", default=None, help="default runs/EXPERIMENT")
    p.add_argument("--results-dir", default=str(REPO / "results"))
    p.add_argument("--avg-last", type=number("--avg-last", low=1), default=None, help="override eval.avg_last (epoch checkpoints averaged)")
    p.add_argument("--batch-size", type=batch_size(), default=128, help="fairseq-generate sentences per batch")
    p.add_argument("--bootstrap-samples", type=resamples("--bootstrap-samples"), default=1000)
    p.add_argument("--test-sample", type=number("--test-sample", low=0), default=None, metavar="N",
                   help="score a fixed sample of N pairs of each test set (seeded, the same for every run; "
                        "overrides eval.test_sample, e.g. cnndm-cpu's 2,000 validation articles; 0: all of them)")
    p.add_argument("--rouge-exception-db", choices=sorted(rouge155.EXCEPTION_DBS), default=None,
                   help="ROUGE studies: WordNet exception database of ROUGE-1.5.5 (default files2rouge: empty, as "
                        "files2rouge ships it and so as the papers' numbers; wordnet: its 5,930 forms)")
    p.add_argument("--force", action="store_true",
                   help="retrain and rescore the runs of the --families named (the Transformer only when "
                        "named) even when their record matches today's config, and replace a file of the table's "
                        "name in --results-dir that scripts/reproduce.sh did not write")
    p.add_argument("--table-only", action="store_true", help="only rebuild the table from the records")
    # at least 2: seconds per update are measured between two progress lines (fairseq_log.seconds_per_update)
    p.add_argument("--time-updates", type=number("--time-updates", low=2, high=MAX_TIME_UPDATES,
                                                 ceiling="a timing, not a training"), default=None,
                   help="only measure seconds per update over N >= 2 updates per family (extrapolated to an epoch)")
    p.epilog = "Options after '--' go to every fairseq-train run unchanged (they override the configs)."
    return p


def parse_args(argv=None):
    """The command line, checked before any work: ``args`` with ``data``, ``runs_dir``, ``results_dir``
    (resolved paths), ``device``, ``fairseq_args`` (after ``--``), ``families`` (the baseline first, then
    the experiment's order) and ``named`` (the families the command line names: what ``--force`` retrains).
    A mistake is argparse's one line and exit status 2."""
    from man_recipes.training.launch import split_fairseq_args

    p = build_parser()
    argv, fairseq_args = split_fairseq_args(argv)
    args = p.parse_args(argv)
    args.fairseq_args = fairseq_args
    exp = EXPERIMENTS[args.experiment]
    args.data = Path(args.data or exp["data"]).resolve()
    args.runs_dir = Path(args.runs_dir or REPO / "runs" / args.experiment).resolve()
    args.results_dir = Path(args.results_dir).resolve()
    args.device = args.device or exp.get("device")
    if args.device is None:
        args.device = "cuda" if visible_gpus() > 0 else "cpu"
    args.precision = resolve_precision(p, args.precision, args.device == "cpu")
    if experiment_metric(exp["metric"]).is_rouge:
        args.rouge_exception_db = args.rouge_exception_db or rouge155.DEFAULT_EXCEPTION_DB
    elif args.rouge_exception_db is not None:
        p.error(f"--rouge-exception-db: {args.experiment} scores BLEU, not ROUGE")
    if args.avg_last is not None and exp.get("converges"):
        p.error(f"--avg-last: {args.experiment} scores each run's best checkpoint by dev loss, never an average")
    try:
        named, args.families = parse_families(args.experiment, args.families)
    except ValueError as e:
        p.error(str(e))
    for flag, folder in (("--runs-dir", args.runs_dir), ("--results-dir", args.results_dir)):
        if folder.exists() and not folder.is_dir():  # found before any training, not by mkdir after it
            p.error(f"{flag} {folder}: is a file, not a folder")
        if problem := output_folder_problem(folder):  # a read-only one, or one beneath a file
            p.error(f"{flag} {folder}: {problem}")
    args.named = set(named)  # --force applies to these; the baseline runs too, retrained only when named
    return args


def write_timing(args, cfgs, manifest):
    """``--time-updates``: each family's seconds per update into ``RESULTS/<experiment>-timing-<device>.json``,
    rewritten after each family."""
    path = args.results_dir / f"{args.experiment}-timing-{args.device}.json"

    def write(rows):
        out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": git_commit(), "device": device_name(args.device), "loadavg": os.getloadavg(),
               "data": str(args.data), "counts": manifest["counts"], "families": rows,
               "note": "seconds per update measured between the first and last progress line "
                       "(start-up excluded); epoch time = that x updates per epoch, extrapolated, "
                       "training only (no validation, no checkpointing)"}
        path.write_text(json.dumps(out, indent=1) + "\n")
        log(f"wrote {path}")
    time_families(args.families, cfgs, args, on_family=write)


def run_study(args, cfgs, manifest):
    """Train, evaluate and record every (seed, family) run whose record does not match today's config
    (all of ``--families`` with ``--force``); a run another process holds is left to it."""
    from man_recipes.studies.study_records import matching_record, write_record

    exp = EXPERIMENTS[args.experiment]
    records_dir = args.results_dir / args.experiment
    today = data_identity(args.data)
    check_no_other_data(records_dir, args, today)
    for seed in args.seeds:
        for fam in args.families:
            fp = record_fingerprint(cfgs[fam], args, seed)
            force = args.force and fam in args.named
            with run_lock(args.runs_dir, f"{fam}-seed{seed}") as ours:
                if not ours:
                    log(f"skip  {fam}-seed{seed}: another scripts/reproduce.sh is running it now "
                        f"(lock {args.runs_dir / f'.{fam}-seed{seed}.lock'}); its record joins the table "
                        "when it finishes (--table-only)")
                    continue
                if not force and matching_record(records_dir, fam, seed, fp):
                    log(f"skip  {fam}-seed{seed} (its record matches today's config: {fp})")
                    continue
                run = args.runs_dir / f"{fam}-seed{seed}"
                args.doing = (f"training {run.name}", "it resumes from its last epoch checkpoint")
                train_run(cfgs[fam], run, seed, args, record_fingerprint(cfgs[fam], args, seed, True), force)
                args.doing = (f"scoring {run.name}", "its training is kept and it is scored again")
                record, hyps = evaluate_run(cfgs[fam], run, seed, fam, manifest, exp["metric"], args, fp,
                                            device_name(args.device), log)
                args.doing = None
                log(f"wrote record {write_record(records_dir, dict(record, data_identity=today), hyps)}")


def check_no_other_data(records_dir, args, today):
    """Refuse, before any run, to replace a record made on another data folder (another subword
    model or dictionaries: a result of another kind, not a stale one of this study) without ``--force``
    for its family, nor skip it as current; a record of this data whose config changed is stale and
    replaced as before."""
    from man_recipes.studies.study_records import other_data, read_record, record_path

    for seed in args.seeds:
        for fam in args.families:
            path = record_path(records_dir, fam, seed)
            if (args.force and fam in args.named) or not path.is_file():
                continue
            record = read_record(path)
            differs = other_data(record, today)  # even when the fingerprint matches: the subword model is not in it
            if differs:
                raise ReproduceError(f"{path} holds the scores of another data folder ({differs}); refusing to "
                                     f"replace them: choose another --results-dir, or pass --force with --families "
                                     f"naming {fam} to retrain it on --data {args.data}")


# what a study's steps raise for bad input or a missing file: one ERROR line, exit status 2
STUDY_ERRORS = (ReproduceError, LogError, PrepError, StudyEvalError, EvaluateError, ScoreInputError, NotUtf8Error,
                RecordError, TableError, OSError)


@one_line_on_ctrl_c("scripts/reproduce.sh")  # the line of an interrupt outside the run's own handler
def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    args = parse_args(argv)
    exp = EXPERIMENTS[args.experiment]
    args.doing = None
    try:
        if args.table_only:
            check_records_exist(args)
        if not args.force and args.time_updates is None:  # timing writes no table
            check_table_is_ours(args.experiment, args.results_dir)
        check_fixed_budget_records(args)
        try:
            manifest = read_manifest(args.data, exp["dataset"], prepare_line(args.experiment, args.data))
        except PrepError as e:
            if not args.table_only:
                raise
            raise ReproduceError(f"--table-only reads the data folder {args.data} (its dictionaries are part of "
                                 "every record's fingerprint, its references are scored and tested): "
                                 f"{e}") from e
        read_subword(args.data)  # a folder whose files disagree on it is refused before any run
        cfgs = experiment_configs(args.experiment, args, manifest, args.families)
        args.results_dir.mkdir(parents=True, exist_ok=True)
        if args.time_updates is not None:
            write_timing(args, cfgs, manifest)
            return 0
        if not args.table_only:
            run_study(args, cfgs, manifest)
        md = build_table(args.experiment, args, manifest, args.results_dir, log)
        print(md.read_text())
    except STUDY_ERRORS as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        what, then = args.doing or ("building the table" if args.table_only else "starting", "nothing is lost")
        print(f"scripts/reproduce.sh: interrupted while {what}; run the same command again to resume: finished "
              f"runs are skipped and {then}", file=sys.stderr)
        return 130
    return 0


def check_records_exist(args):
    """``--table-only`` with no record of the study (or of its to-convergence protocol) has nothing to
    tabulate: said before the data folder is asked for."""
    study = table_experiment(args.experiment)
    folders = [args.results_dir / name for name in (study, convergence_experiment(study)) if name]
    if not any(any(folder.glob("*-seed*.json")) for folder in folders if folder.is_dir()):
        raise ReproduceError(f"--table-only: no run record in {' or '.join(map(str, folders))}: nothing to tabulate "
                             f"(train one first: scripts/reproduce.sh {args.experiment} --seeds 1,)")


def check_fixed_budget_records(args):
    """A to-convergence protocol's table is its study's, built on the study's fixed-budget records (the
    Transformer's and each family's of the same seed): without any in ``--results-dir`` the table could
    not be built, said before training, not after it."""
    study = EXPERIMENTS[args.experiment].get("converges")
    if study is None:
        return
    folder = args.results_dir / study
    if not (folder.is_dir() and any(folder.glob("*-seed*.json"))):
        raise ReproduceError(
            f"{args.experiment} is tabulated beside {study}'s fixed-budget records (RESULTS/{study}/FAMILY-seedN.json), "
            f"and {folder} holds none: run scripts/reproduce.sh {study} first, or pass the --results-dir that holds them")


if __name__ == "__main__":
    sys.exit(main())
