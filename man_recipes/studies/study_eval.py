"""One study run's evaluation (``scripts/reproduce.sh``), the steps of :mod:`..evaluation.steps`:
average the last checkpoints (a run trained to convergence: take its best one, :mod:`convergence`),
decode every test set of the data folder's record, score with the experiment's metric, and assemble
the run's record (:mod:`study_records` writes it).

Metrics: ``bleu`` (detokenized sacreBLEU against the raw references and case-insensitive
tokenized BLEU; the Multi30k studies) and ``rouge`` (ROUGE-1/2/L F1 of ROUGE-1.5.5 as files2rouge
runs it, in the config's ``eval.rouge_order``, against the release's references that data-prep
copies into the data folder; the summarization studies). A config's ``eval.test_sample: N`` scores a
fixed sample of N pairs of each test set (:mod:`..evaluation.fixed_sample`).
"""

import datetime
import json
import os
from pathlib import Path

from man_recipes.provenance import git_commit
from man_recipes.config import REPO
from man_recipes.evaluation.steps import AverageError, Names, average, decode, score
from man_recipes.evaluation.fixed_sample import SAMPLE_SEED, describe, sample_ids, sampled_split
from man_recipes.training.fairseq_log import epoch_seconds, epochs_ended, model_params, train_curve, valid_curve
from man_recipes.textfile import read_lines
from man_recipes.metrics import experiment_metric
from man_recipes.studies.convergence import ConvergenceError, best_checkpoint, record_fields
from man_recipes.studies.experiments import TO_CONVERGENCE, protocol


class StudyEvalError(RuntimeError):
    pass


def read_references(data, manifest, subset, ids=None):
    """The reference lines of ``subset`` (the record's ``references`` file, else ``SUBSET.raw.TGT``),
    only those of ``ids`` (a test sample) when given."""
    name = (manifest.get("references") or {}).get(subset, f"{subset}.raw.{manifest['target_lang']}")
    return read_test_lines(data, name, f"the references of {subset}", ids)


def read_test_lines(data, name, what, ids=None):
    """(path, lines) of the data folder's text file ``name``; the lines of ``ids`` when given."""
    path = Path(data) / name
    if not path.is_file():
        raise StudyEvalError(f"{path}: missing ({what}); prepare the data again")
    lines = read_lines(path)
    return path, lines if ids is None else [lines[i] for i in ids]


def test_sample(cfg, manifest, subset):
    """The sentence ids of ``subset`` a config scores (``eval.test_sample``), or None: all of them."""
    n = cfg["eval"].get("test_sample")
    if not n or n >= manifest["counts"][subset]:
        return None
    return sample_ids(manifest["counts"][subset], n)


def score_test_set(metric, hyps, refs, raw_refs, ref_path, cfg, manifest, args, hyp_name):
    """One test set's scores for the run's record (:func:`..evaluation.metric.score`), the hypotheses
    the record keeps (detokenized for BLEU) and a line for the log. BLEU: case-insensitive tokenized
    BLEU on the tokenized references, sacreBLEU on the raw ones; ROUGE: against the raw references."""
    m = experiment_metric(metric)  # an experiment's metric (experiments.py): the record that scores it
    if m.is_rouge:
        order = cfg["eval"].get("rouge_order", "hyp-ref")
        scored = score(m.name, hyps, raw_refs, rouge_order=order, rouge_exception_db=args.rouge_exception_db,
                       names=Names(hyp_name, f"references {ref_path}"))
        r = scored.rouge
        scores = {k: r[k] for k in ("rouge1", "rouge2", "rougeL")}
        scores.update(rouge_order=order, exception_db=r["exception_db"], rouge_implementation=r["implementation"])
        return scores, hyps, scored.summary()
    scored = score(m.name, hyps, refs, raw_refs=raw_refs, target_lang=manifest["target_lang"],
                   names=Names(hyp_name, "tokenized references", raw_refs=f"references {ref_path}"))
    scores = {"bleu_tok_ci": scored.bleu["bleu"], "sacrebleu": scored.sacrebleu["bleu"],
              "sacrebleu_signature": scored.sacrebleu["signature"], "tokenized_bleu_details": scored.bleu}
    return scores, scored.detokenized, scored.summary()


def average_checkpoints(cfg, run, avg_last):
    """Average the run's last ``avg_last`` (or the config's) epoch/update checkpoints into
    ``run/eval``; returns (checkpoint, the files averaged)."""
    ev = cfg["eval"]
    n_avg = avg_last or ev.get("avg_last", 5)
    eval_dir = run / "eval"
    eval_dir.mkdir(exist_ok=True)
    checkpoint = eval_dir / f"checkpoint_avg{n_avg}.pt"
    try:
        # eval/ is this run folder's own: each rescoring replaces its average
        averaged = average(run / "checkpoints", n_avg, ev.get("avg_by", "epoch") == "update", checkpoint,
                           overwrite=True)
    except AverageError as e:
        raise StudyEvalError(f"{run.name}: cannot average: {e}") from e
    return checkpoint, averaged


def scored_checkpoint(cfg, run, avg_last):
    """(the checkpoint a run is scored on, the files it comes from): to convergence its best checkpoint
    by dev loss, as it is; on a fixed budget the average of its last checkpoints."""
    if protocol(cfg) == TO_CONVERGENCE:
        try:
            best = best_checkpoint(run)
        except ConvergenceError as e:
            raise StudyEvalError(str(e)) from e
        (run / "eval").mkdir(exist_ok=True)  # the decoding's output, as beside an average
        return best, [best]
    return average_checkpoints(cfg, run, avg_last)


def evaluate_run(cfg, run, seed, family, manifest, metric, args, fingerprint, device_name, log):
    """Average (or take the best checkpoint), decode every test set, score; returns (record, {subset:
    hypotheses})."""
    from man_recipes.data.subword import read_subword

    checkpoint, averaged = scored_checkpoint(cfg, run, args.avg_last)
    device = "cpu" if args.device == "cpu" else "gpu"
    tgt = manifest["target_lang"]
    results, hypotheses = {}, {}
    for subset, release_name in manifest["test_sets"].items():
        sample, data = test_sample(cfg, manifest, subset), args.data
        if sample is not None:
            data = sampled_split(args.data, subset, manifest["source_lang"], tgt, sample,
                                 run / "eval" / f"{subset}-sample")
            release_name += "; " + describe(len(sample), manifest["counts"][subset])
        # ROUGE reads the release's references only: decoded from the sources alone (no target length check)
        cmd, ids, hyps, refs = decode(cfg, data, checkpoint, subset, device, args.precision, args.batch_size,
                                      run / "eval" / f"generate-{subset}.txt", sources_only=experiment_metric(metric).raw_references_only,
                                      subword=read_subword(args.data))  # a test sample's folder has no record
        ref_path, raw_refs = read_references(args.data, manifest, subset, sample)
        if len(raw_refs) != len(ids) or ids != list(range(len(ids))):
            raise StudyEvalError(f"{run.name} {subset}: {len(ids)} hypotheses for {len(raw_refs)} references "
                                 f"in {ref_path}")
        scores, kept, line = score_test_set(metric, hyps, refs, raw_refs, ref_path, cfg, manifest, args,
                                            f"hypotheses of {run.name} {subset}")
        hypotheses[subset] = kept
        results[subset] = {"name": release_name, "n_sentences": len(hyps), **scores,
                           **({"sample": {"n": len(sample), "of": manifest["counts"][subset], "seed": SAMPLE_SEED}}
                              if sample is not None else {}),
                           "generate_command": [str(c) for c in cmd]}
        log(f"      {run.name} {release_name}: {line}")
    train_seconds, attempts = epoch_seconds(run / "train.log")
    run_json = run / "run.json"
    run_info = json.loads(run_json.read_text()) if run_json.is_file() else {}
    curve = valid_curve(run / "train.log")
    mask_curve = train_curve(run / "train.log", "mask_mean")  # calibration only: did its mask stay below 1
    record = {"family": family, "seed": seed, "fingerprint": fingerprint,
              "config": os.path.relpath(cfg["_path"], REPO), "name": cfg["name"], "arch": cfg["arch"],
              "fairseq_args": list(args.fairseq_args), "train_command": run_info.get("command"),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": git_commit(), "device": device_name,
              "threads": os.environ.get("OMP_NUM_THREADS", "unset"), "loadavg_at_end": os.getloadavg(),
              "params": model_params(run / "train.log"), "train_seconds": round(train_seconds, 1),
              "train_attempts": attempts, "updates": curve[-1][0] if curve else None,
              "epochs": epochs_ended(run / "train.log"), "averaged_checkpoints": [Path(c).name for c in averaged],
              "valid_curve": curve, "train_curve": train_curve(run / "train.log"),
              **({"mask_mean_curve": mask_curve} if mask_curve else {}), "test_sets": results}
    try:
        record.update(record_fields(cfg, run, checkpoint))
    except ConvergenceError as e:
        raise StudyEvalError(str(e)) from e
    return record, hypotheses
