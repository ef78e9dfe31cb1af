#!/usr/bin/env python
"""A summarization study's runs scored on the dev set as well: ROUGE of the very checkpoint each run's
record scored on the test set, and the two paired tests over documents against the Transformer of the
same seed (the studies' own: sacreBLEU's bootstrap, approximate randomization for the verdicts).

The studies decode the test set only. A difference between two families that holds on the dev set
too is less likely an accident of the test set's documents; the dev set is not held out from
training decisions, though (its loss picks a run-to-convergence's checkpoint, and its epochs), which
the table says::

    OMP_NUM_THREADS=1 .venv/bin/python -m lab.dev_set_rouge gigaword-cpu-converge --seeds 1, --families man

The arguments are scripts/reproduce.sh's (the experiment, --seeds, --families, --data, --runs-dir,
--results-dir, options after ``--``): they select the records and their fingerprints exactly as the
study does; ``--subset`` (default ``valid``) is a dev set the data folder's record names. Decodes
every run afresh (about 40 s a run for Gigaword's 1,000 dev pairs at one thread); writes
``RESULTS/<experiment>-dev.md``, ``.json`` and the hypotheses in ``RESULTS/<experiment>-dev/``. A run
whose checkpoint is gone (deleted, the machine replaced) or no longer the one its record scored
(trained on since) is scored from the hypotheses that output holds from the very checkpoint its
record scored (the entry names the record's date, protocol, best epoch, dev loss and test scores),
and the table says so; without them it is an error, never a score of another checkpoint, and so
is a seed without a Transformer record (its runs are tested against it). A selected run without a
record (not trained yet) is left out, and the table names it. Every run is checked before any is
decoded.
"""

import datetime
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from man_recipes.studies.summarization_table import KEYS, NAMES  # noqa: E402  (after the path insert)
from man_recipes.interrupt import one_line_on_ctrl_c


class DevSetError(RuntimeError):
    pass


def split_args(argv):
    """(scripts/reproduce.sh's arguments, the dev set's name): ``--subset NAME`` taken out."""
    argv = list(argv)
    subset = "valid"
    before = argv[:argv.index("--")] if "--" in argv else argv
    if "--subset" in before:
        i = argv.index("--subset")
        if i + 1 >= len(before):
            raise DevSetError("--subset: expected the name of a dev set")
        subset = argv[i + 1]
        del argv[i:i + 2]
    return argv, subset


def scored_again(cfg, run, record, avg_last):
    """The checkpoint ``record`` scored, as the study finds it in ``run``: refused when the run folder's
    is another one (a run to convergence trained on after its record, another average)."""
    from man_recipes.studies.convergence import checkpoint_updates, record_protocol
    from man_recipes.studies.experiments import TO_CONVERGENCE
    from man_recipes.studies.study_eval import scored_checkpoint

    checkpoint, averaged = scored_checkpoint(cfg, run, avg_last)
    if record_protocol(record) == TO_CONVERGENCE:
        updates = checkpoint_updates(checkpoint)
        if updates != record["best_updates"]:
            raise DevSetError(f"{checkpoint}: saved at update {updates}, but the record of {run.name} scored its "
                              f"best checkpoint of update {record['best_updates']}; rerun the study for this run first")
    elif [Path(c).name for c in averaged] != record["averaged_checkpoints"]:
        raise DevSetError(f"{run.name}: averages {[Path(c).name for c in averaged]}, its record "
                          f"{record['averaged_checkpoints']}")
    return checkpoint


def record_identity(family, seed, record):
    """What names the checkpoint a record scored: written into each run's entry, and matched against an
    earlier entry before its hypotheses are reused."""
    from man_recipes.studies.convergence import record_protocol

    test = next(iter(record["test_sets"].values()))
    return {"family": family, "seed": seed, "protocol": record_protocol(record), "best_epoch": record.get("best_epoch"),
            "best_valid_loss": record.get("best_valid_loss"), "test": {k: test[k] for k in KEYS},
            "record_date": record["date"]}


def earlier_decoding(args, subset, family, seed, record, n_refs):
    """The entry and hypotheses this tool wrote before for ``family``/``seed`` on ``subset``, when they
    come from the checkpoint ``record`` scored (None otherwise): the same record's date, protocol, best
    epoch, dev loss and test scores, one hypothesis per reference."""
    from man_recipes.textfile import read_lines

    try:
        earlier = json.loads((args.results_dir / f"{args.experiment}-dev.json").read_text())
        hyps = read_lines(args.results_dir / f"{args.experiment}-dev" / f"{family}-seed{seed}.{subset}.hyp")
    except (OSError, ValueError):  # ValueError: not JSON, not UTF-8
        return None
    if earlier.get("subset") != subset or len(hyps) != n_refs:
        return None
    now = record_identity(family, seed, record)
    for entry in earlier.get("runs", []):
        if all(entry.get(k) == v for k, v in now.items()):
            return dict(entry, decoded_on=entry.get("decoded_on") or earlier["date"]), hyps
    return None


def decode_run(cfg, run, checkpoint, subset, args, refs):
    """The hypotheses of ``checkpoint`` on ``subset``, one per reference, in order."""
    from man_recipes.data.subword import read_subword
    from man_recipes.evaluation.steps import decode

    device = "cpu" if args.device == "cpu" else "gpu"
    cmd, ids, hyps, _ = decode(cfg, args.data, checkpoint, subset, device, args.precision, args.batch_size,
                               run / "eval" / f"generate-{subset}.txt", sources_only=True,
                               subword=read_subword(args.data))
    if ids != list(range(len(refs))):
        raise DevSetError(f"{run.name} {subset}: {len(ids)} hypotheses for {len(refs)} references")
    return cmd, hyps


def dev_scores(args, subset, log):
    """({(family, seed): entry} of every selected run with a current record: its dev-set scores and
    per-document F1, the checkpoint scored, the record's test-set scores; the runs left out, without a
    record; the references; the dev set's name). The Transformer of every selected seed must have one."""
    from man_recipes.data.manifest import read_manifest
    from man_recipes.metrics import experiment_metric
    from man_recipes.studies.rouge_significance import scored_documents
    from man_recipes.studies.experiments import BASELINE, EXPERIMENTS, prepare_line
    from man_recipes.studies.study_eval import StudyEvalError, read_references
    from man_recipes.studies.study_records import matching_record, record_fingerprint
    from man_recipes.studies.study_table import shown_path
    from man_recipes.studies.table_build import experiment_configs

    exp = EXPERIMENTS[args.experiment]
    if not experiment_metric(exp["metric"]).is_rouge:
        raise DevSetError(f"{args.experiment} scores BLEU; this scores the summarization studies' ROUGE")
    manifest = read_manifest(args.data, exp["dataset"], prepare_line(args.experiment, args.data))
    if subset not in (manifest.get("dev_sets") or {}):
        raise DevSetError(f"{args.data}: its record names no dev set {subset!r} "
                          f"(dev sets: {', '.join(manifest.get('dev_sets') or {}) or 'none'}); prepare the data "
                          f"again (data-prep copies the dev set's raw text): {prepare_line(args.experiment, args.data)}")
    ref_path, refs = read_references(args.data, manifest, subset)
    ref_path = shown_path(ref_path)  # the record names a file of the checkout, not of a machine
    cfgs = experiment_configs(args.experiment, args, manifest, args.families)
    records_dir = args.results_dir / args.experiment
    # every run's record and checkpoint first: what is refused is refused before minutes of decoding
    selected, left_out = [], []
    for seed in args.seeds:
        for fam in args.families:
            record = matching_record(records_dir, fam, seed, record_fingerprint(cfgs[fam], args, seed))
            if record is None and fam != BASELINE:  # not trained yet: the table says so
                log(f"{fam}-seed{seed}: no record of today's config in {records_dir}; left out")
                left_out.append(f"{fam}-seed{seed}")
                continue
            if record is None:
                raise DevSetError(f"{fam}-seed{seed}: no record of today's config in {records_dir}, and the "
                                  f"seed's other runs are tested against it; run the study first: "
                                  f"scripts/reproduce.sh {args.experiment} --seeds {seed}, --families {fam}")
            run = args.runs_dir / f"{fam}-seed{seed}"
            try:
                checkpoint, earlier = scored_again(cfgs[fam], run, record, args.avg_last), None
            except (DevSetError, StudyEvalError) as e:
                earlier = earlier_decoding(args, subset, fam, seed, record, len(refs))
                if earlier is None:
                    raise
                log(f"{e}: {run.name}'s hypotheses decoded on {earlier[0]['decoded_on']} from the checkpoint "
                    "its record scored are reused")
                checkpoint = earlier[0]["checkpoint"]
            selected.append((fam, seed, run, record, checkpoint, earlier))
    out = {}
    for fam, seed, run, record, checkpoint, earlier in selected:
        if earlier is None:
            log(f"decode {run.name} on {subset} ({len(refs):,} documents) from {checkpoint}")
            cmd, hyps = decode_run(cfgs[fam], run, checkpoint, subset, args, refs)
            decoded_on = None
        else:
            hyps, cmd, decoded_on = earlier[1], earlier[0]["generate_command"], earlier[0]["decoded_on"]
        test = next(iter(record["test_sets"].values()))
        scored = scored_documents(hyps, refs, test["rouge_order"], test["exception_db"])
        out[(fam, seed)] = {**record_identity(fam, seed, record), "hypotheses": hyps,
                            "documents": scored["documents"], "dev": {k: scored[k] for k in KEYS},
                            "checkpoint": Path(checkpoint).name, "generate_command": [str(c) for c in cmd],
                            "decoded_on": decoded_on}
        log(f"      {run.name}: " + " / ".join(f"{NAMES[k]} {scored[k]:.2f}" for k in KEYS))
    return out, left_out, ref_path, manifest["dev_sets"][subset]


def paired_tests(runs, n_samples):
    """Each non-Transformer run's two tests per metric against the Transformer of the same seed."""
    from man_recipes.studies.rouge_significance import paired_bootstrap, paired_randomization
    from man_recipes.studies.experiments import BASELINE

    for (fam, seed), r in runs.items():
        base = runs.get((BASELINE, seed))
        if fam == BASELINE or base is None:
            continue
        b, s = base["documents"], r["documents"]
        r["paired_bootstrap"] = {k: paired_bootstrap(b[k], s[k], n_samples) for k in KEYS}
        r["paired_randomization"] = {k: paired_randomization(b[k], s[k]) for k in KEYS}


def to_markdown(runs, left_out, args, subset, subset_name, ref_path):
    from man_recipes.studies.experiments import BASELINE
    from man_recipes.studies.study_table import fmt_p
    from man_recipes.tables import markdown_table

    rows = []
    for (fam, seed), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0] != BASELINE, kv[0][0])):
        base = runs.get((BASELINE, seed))
        delta = {where: "–" if base is None or fam == BASELINE else
                 " / ".join(f"{r[where][k] - base[where][k]:+.2f}" for k in KEYS) for where in ("dev", "test")}
        p = {t: ("baseline" if fam == BASELINE else " / ".join(fmt_p(r[t][k]["p_value"]) for k in KEYS)
                 if t in r else "–") for t in ("paired_bootstrap", "paired_randomization")}
        epoch = f"best epoch {r['best_epoch']}, dev loss {r['best_valid_loss']:.3f}" if r["best_epoch"] else r["checkpoint"]
        rows.append([fam, str(seed), epoch, " / ".join(f"{r['dev'][k]:.2f}" for k in KEYS), delta["dev"],
                     p["paired_bootstrap"], p["paired_randomization"],
                     " / ".join(f"{r['test'][k]:.2f}" for k in KEYS), delta["test"]])
    n = len(next(iter(runs.values()))["hypotheses"])
    reused = [f"{fam}-seed{seed} (decoded {r['decoded_on'][:10]})" for (fam, seed), r in runs.items() if r["decoded_on"]]
    lines = [f"# {args.experiment}: the runs' checkpoints on the dev set", "",
             f"`{subset}`: {subset_name}; {n:,} documents, references `{ref_path}`. Each run's checkpoint is the one "
             f"its record scored on the test set (`results/{args.experiment}/`); decoded with the study's options, "
             "ROUGE-1.5.5 as files2rouge runs it (the record's order and exception database). The dev set is not "
             "held out: its loss picked the checkpoints of the runs to convergence.", "",
             "p: paired bootstrap / approximate randomization over documents against the Transformer of the same "
             "seed (R-1 / R-2 / R-L; as the study tables). Test: the record's scores."
             + (f" Selected but without a current record (not trained yet), left out: {', '.join(left_out)}."
                if left_out else "")
             + (" Scored from the hypotheses decoded earlier from the checkpoint its record scored, no longer "
                f"here: {', '.join(reused)}." if reused else ""), ""]
    lines += markdown_table(["family", "seed", "checkpoint", f"{subset} R-1 / R-2 / R-L", "Δ vs Transformer",
                             "p bootstrap", "p randomization", "test R-1 / R-2 / R-L", "test Δ"], rows)
    return "\n".join(lines) + "\n\nMade by `python -m lab.dev_set_rouge " + " ".join(args.argv) + "`.\n"


def write(runs, left_out, args, subset, subset_name, ref_path):
    from man_recipes.provenance import git_commit

    out_dir = args.results_dir / f"{args.experiment}-dev"
    out_dir.mkdir(parents=True, exist_ok=True)
    for (fam, seed), r in runs.items():
        (out_dir / f"{fam}-seed{seed}.{subset}.hyp").write_text("\n".join(r["hypotheses"]) + "\n")
    payload = {"experiment": args.experiment, "subset": subset, "name": subset_name, "references": str(ref_path),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": git_commit(), "command": ["python", "-m", "lab.dev_set_rouge", *args.argv],
               "runs": [{k: v for k, v in r.items() if k not in ("hypotheses", "documents")} for r in runs.values()],
               "left_out": left_out}
    md = args.results_dir / f"{args.experiment}-dev.md"
    (args.results_dir / f"{args.experiment}-dev.json").write_text(json.dumps(payload, indent=1) + "\n")
    md.write_text(to_markdown(runs, left_out, args, subset, subset_name, ref_path))
    return md


@one_line_on_ctrl_c("python -m lab.dev_set_rouge")
def main(argv=None):
    from man_recipes.logging_setup import quiet_logging
    from man_recipes.studies import reproduce

    quiet_logging()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        reproduce_argv, subset = split_args(argv)
        args = reproduce.parse_args(reproduce_argv)
        args.argv = argv
        runs, left_out, ref_path, subset_name = dev_scores(args, subset, reproduce.log)
        paired_tests(runs, args.bootstrap_samples)
        md = write(runs, left_out, args, subset, subset_name, ref_path)
    except (DevSetError, *reproduce.STUDY_ERRORS) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
