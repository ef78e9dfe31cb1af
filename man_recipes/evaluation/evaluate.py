"""Evaluate a finished run (``scripts/evaluate.sh RUN``).

The steps of :mod:`.steps`:

1. average the last N checkpoints,
2. decode the test set with fairseq-generate and the config's beam / length penalty /
   max length / trigram blocking,
3. score with the config's metric,
4. record: write ``RUN/results.json`` and ``RUN/results.md`` (:mod:`.result_files`).

A failed evaluation never leaves an earlier result looking current (:mod:`.result_files`).
What can be checked before the minutes of decoding is checked first: the config, the data
subset, the raw references' line count, whether ROUGE can run. Errors are one ``ERROR: ...``
line with exit status 2.
"""

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import sys
from importlib.util import find_spec
from pathlib import Path

import yaml

from man_recipes.config import ConfigError, validate
from man_recipes.data.subword import SubwordEvidenceError, read_subword
from man_recipes.options import PRECISION_HELP, PRECISIONS, batch_size, number, resolve_precision, visible_gpus
from man_recipes.evaluation import result_files
from man_recipes.evaluation.run_checkpoint import check_run_model, load_state, training_progress
from man_recipes.evaluation.steps import AverageError, CheckpointsNotFound, EvaluateError, Names, average, decode, score
from man_recipes import rouge155, scoring, textfile
from man_recipes.paths import output_folder_problem
from man_recipes.logging_setup import quiet_logging
from man_recipes.metrics import metric as metric_named
from man_recipes.interrupt import EXIT_INTERRUPTED, interrupted_line, one_line_on_ctrl_c


def subset_size(data, subset, src, tgt):
    """Number of sentences in the binarized ``subset`` (None if it cannot be read)."""
    logger = logging.getLogger("fairseq.data.data_utils")
    level = logger.level
    logger.setLevel(logging.WARNING)  # its "loaded N examples" on stderr would precede an ERROR line
    try:
        from fairseq.data import data_utils

        dataset = data_utils.load_indexed_dataset(str(Path(data) / f"{subset}.{src}-{tgt}.{src}"), None)
        return len(dataset) if dataset is not None else None
    except Exception:
        return None
    finally:
        logger.setLevel(level)


def data_fingerprint(data, subset, src, tgt):
    """SHA-256 of the dictionaries and of the evaluated subset's binarized files, so a result
    can be traced to the exact data it was computed on."""
    out = {}
    names = [f"dict.{src}.txt", f"dict.{tgt}.txt"] + [
        f"{subset}.{src}-{tgt}.{lang}.{ext}" for lang in (src, tgt) for ext in ("idx", "bin")]
    for name in dict.fromkeys(names):
        path = Path(data) / name
        if path.is_file():
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            out[name] = digest.hexdigest()
    return out




def raw_reference_file(data, subset, tgt):
    """The references as released, which data-prep writes beside the binarized data (line i =
    sentence id i): ``DATA/<subset>.raw.<tgt>``. sacreBLEU reads them, and so does ROUGE: the
    summarization papers score against the release's references, not fairseq's target lines (BPE
    undone, but an unseen character comes back as ``<unk>``)."""
    return Path(data) / f"{subset}.raw.{tgt}"


def read_raw_references(path, subset=None, rouge=False):
    """The lines of ``path``, refused (:class:`~.scoring.ScoreInputError`) when blank (for ``rouge``:
    when one line is) or, given the binarized ``subset`` as (name, number of sentences), not one per
    sentence."""
    lines, name = textfile.read_lines(path), f"references {path}"  # UTF-8 or an error naming the line
    sentences = [(subset[0], range(subset[1]))] if subset else []
    scoring.check_aligned(sentences + [(name, lines)], references=name, blank_reference_lines=not rouge)
    return lines


def score_decoded(cfg, data, subset, hyps, refs, eval_dir, rouge_order=None, rouge_implementation="rouge155",
                  rouge_exception_db=None):
    """The config's metric (:func:`.metric.score`) on the decoded ``hyps`` and fairseq's target lines
    ``refs`` of ``subset`` (None when decoded from the sources alone; written to ``eval_dir``, named in
    errors), as results.json's (scores, details).
    sacreBLEU (every BLEU metric) and ROUGE read the references data-prep writes beside the data
    (:func:`raw_reference_file`). Written: ``eval_dir/SUBSET.ref`` (the references tokenized BLEU or
    ROUGE scored against) and ``SUBSET.detok.hyp`` (the hypotheses sacreBLEU scored)."""
    ev, tgt = cfg["eval"], cfg.get("target_lang")
    raw_file, detok_file = raw_reference_file(data, subset, tgt), eval_dir / f"{subset}.detok.hyp"
    # Without them (an older data folder, a subset data-prep writes none for) sacreBLEU falls back to
    # detokenized target lines, ROUGE to the target lines, and results.json says so.
    raw_refs = read_raw_references(raw_file) if raw_file.is_file() else None
    names = Names(f"hypotheses {eval_dir / f'{subset}.hyp'}", f"references {eval_dir / f'{subset}.ref'}",
                  detok_hyps=f"hypotheses {detok_file}", raw_refs=f"references {raw_file}")
    rouge_refs, m = None, metric_named(ev["metric"])
    if m.raw_references_only:
        rouge_refs = f"fairseq-generate's target lines ({raw_file} not found)"
        if raw_refs is not None:
            refs, names, rouge_refs = raw_refs, dataclasses.replace(names, refs=names.raw_refs), f"raw references {raw_file}"
        raw_refs = None
    (eval_dir / f"{subset}.ref").write_text("\n".join(refs) + "\n")  # what BLEU or ROUGE scored against
    scored = score(ev["metric"], hyps, refs, raw_refs=raw_refs, target_lang=tgt,
                   rouge_order=rouge_order or ev.get("rouge_order", "hyp-ref"),
                   rouge_implementation=rouge_implementation, rouge_exception_db=rouge_exception_db, names=names,
                   keep_detokenized=lambda lines: detok_file.write_text("\n".join(lines) + "\n"))
    details = {"metric": scored.metric}
    if m.is_rouge:
        r = scored.rouge
        details.update(rouge_order=scored.rouge_order, rouge=r, rouge_implementation=r["implementation"],
                       rouge_exception_db=r.get("exception_db"),  # rouge155 only
                       rouge_references=rouge_refs)
        return {k: r[k] for k in ("rouge1", "rouge2", "rougeL")}, details
    details["bleu"] = scored.bleu
    if m.compound_split:
        details["bleu_tokenized_no_compound_split"] = scored.bleu_no_compound_split
    if not m.sacrebleu:
        return {"bleu": scored.bleu["bleu"]}, details
    details.update(sacrebleu_references=f"raw references {raw_file}" if raw_refs is not None else
                   "Moses-detokenized tokenized references (raw references not found)",
                   sacrebleu=scored.sacrebleu, **{m.signature: scored.sacrebleu["signature"]})
    return {"bleu": scored.bleu["bleu"], "sacrebleu": scored.sacrebleu["bleu"]}, details


def check_before_decoding(cfg, data, subset, rouge_implementation):
    """What can stop the scoring, checked before the checkpoints are averaged and the test set
    decoded (minutes): the binarized subset, the raw references' line count, whether ROUGE runs.
    Returns the subset's number of sentences (None when it cannot be read)."""
    src, tgt = cfg.get("source_lang"), cfg.get("target_lang")
    folder = Path(str(data).split(os.pathsep)[0])
    if not folder.is_dir():
        raise EvaluateError(f"data folder {folder} not found (config `data`, run.json or --data)")
    try:
        read_subword(data)  # how the hypotheses are joined back into text: a folder that disagrees is refused
    except SubwordEvidenceError as e:
        raise EvaluateError(str(e)) from e
    total = None
    if src:
        names = [f"{subset}.{src}-{tgt}.{src}.idx", f"{subset}.{tgt}-{src}.{src}.idx"]
        if not any((folder / n).is_file() for n in names):
            raise EvaluateError(f"{folder} has no binarized `{subset}` subset ({names[0]} not found); "
                                "check --subset and --data")
        total = subset_size(data, subset, src, tgt)
    m = metric_named(cfg["eval"]["metric"])
    if raw_reference_file(data, subset, tgt).is_file():
        read_raw_references(raw_reference_file(data, subset, tgt),
                            None if total is None else (f"the binarized {subset} set in {folder}", total),
                            rouge=m.is_rouge)
    if m.is_rouge and rouge_implementation == "rouge155":
        try:
            rouge155.release_dir()
            rouge155.check_perl()
        except rouge155.Rouge155Unavailable as e:
            raise EvaluateError(f"cannot score ROUGE with ROUGE-1.5.5: {e} Install it and rerun, or pass "
                                "--rouge-implementation rouge-score for numbers that are not ROUGE-1.5.5's") from e
    if m.is_rouge and rouge_implementation == "rouge-score" and find_spec("rouge_score") is None:
        raise EvaluateError("--rouge-implementation rouge-score needs the rouge-score package: pip install rouge-score")
    return total


def resolve_rouge_options(args, metric):
    """The ROUGE options at their defaults where not given; one given where nothing reads it (a BLEU
    config, or the database with rouge-score) is an error: it would change nothing."""
    given = [flag for flag, value in (("--rouge-order", args.rouge_order),
                                      ("--rouge-implementation", args.rouge_implementation),
                                      ("--rouge-exception-db", args.rouge_exception_db)) if value is not None]
    if not metric_named(metric).is_rouge and given:
        raise EvaluateError(f"{' and '.join(given)}: the run's config scores {metric}, not ROUGE")
    args.rouge_implementation = args.rouge_implementation or "rouge155"
    if args.rouge_implementation != "rouge155" and args.rouge_exception_db is not None:
        raise EvaluateError("--rouge-exception-db: read by ROUGE-1.5.5 only, not by --rouge-implementation "
                            f"{args.rouge_implementation}")
    if args.rouge_implementation == "rouge155":
        args.rouge_exception_db = args.rouge_exception_db or rouge155.DEFAULT_EXCEPTION_DB


def build_parser():
    p = argparse.ArgumentParser(prog="scripts/evaluate.sh",
                                description="Average the last N checkpoints of RUN, decode, score.")
    p.add_argument("run", help="run directory written by scripts/train.sh (holds config.yaml)")
    p.add_argument("--avg-last", type=number("--avg-last", low=1), default=None, help="override eval.avg_last")
    p.add_argument("--subset", default=None,
                   help="override eval.gen_subset (default test); another subset's scores go to "
                        "RUN/results.SUBSET.json and .md, beside the test set's")
    p.add_argument("--force", action="store_true",
                   help="replace a result file that holds the scores of another subset (default: refused)")
    p.add_argument("--data", default=None, help="override the data-bin directory")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--precision", choices=PRECISIONS, default=None, help=PRECISION_HELP)
    p.add_argument("--batch-size", type=batch_size(), default=128)
    p.add_argument("--rouge-order", choices=sorted(scoring.ROUGE_ORDERS), default=None,
                   help="which file takes files2rouge's first slot: hyp-ref (default, or eval.rouge_order: "
                        "as the MAN authors and fairseq's BART README call it) or ref-hyp (files2rouge's "
                        "documented order); changes ROUGE-L only")
    p.add_argument("--rouge-implementation", choices=scoring.ROUGE_IMPLEMENTATIONS, default=None,
                   help="rouge155 (default): ROUGE-1.5.5 as files2rouge runs it, needs Perl's XML::Parser; "
                        "rouge-score: Google's reimplementation (ROUGE-L as its rougeLsum), not the papers' numbers")
    p.add_argument("--rouge-exception-db", choices=sorted(rouge155.EXCEPTION_DBS), default=None,
                   help="ROUGE-1.5.5's WordNet exception database: files2rouge (default: empty, as files2rouge ships "
                        "it, so as the papers' numbers) or wordnet (its 5,930 irregular forms; a little higher)")
    p.add_argument("--checkpoint", default=None,
                   help="evaluate this checkpoint file instead of averaging (e.g. RUN/checkpoints/checkpoint_last.pt)")
    return p


@one_line_on_ctrl_c("scripts/evaluate.sh")
def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    parser = build_parser()
    args = parser.parse_args(argv)
    args.precision = resolve_precision(parser, args.precision, args.cpu or visible_gpus() == 0)
    run = Path(args.run).resolve()
    if not (run / "config.yaml").is_file():
        print(f"ERROR: {run}: no config.yaml; RUN must be a run folder written by scripts/train.sh", file=sys.stderr)
        return 2
    if problem := output_folder_problem(run):  # its eval/ and results.* are written there, after decoding
        print(f"ERROR: {run}: {problem}; nothing was evaluated", file=sys.stderr)
        return 2
    moved = []  # filled by evaluate() once it knows which result files it writes
    try:
        evaluate(run, args, moved)
    except (EvaluateError, ConfigError, scoring.ScoreInputError, rouge155.Rouge155Unavailable,
            rouge155.Rouge155Failed, textfile.NotUtf8Error, textfile.CorruptFileError, OSError) as e:
        print("ERROR: " + " ".join(str(e).split()) + (f" (the previous result is in {moved[0]})" if moved else ""),
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not moved:
            raise  # the decorator's line
        print(interrupted_line("scripts/evaluate.sh", f"the previous result is in {moved[0]}"), file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def evaluate(run, args, moved):
    """Average, decode, score RUN as ``args`` say, and write its result files (the earlier ones,
    moved aside first, are added to ``moved``)."""
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        run_info = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise ConfigError(f"{run}: config.yaml or run.json is not readable ({e})") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"{run / 'config.yaml'}: top level must be a mapping")
    cfg.setdefault("_path", str(run / "config.yaml"))
    validate(cfg)
    data = args.data or run_info.get("data") or cfg["data"]
    ev = cfg["eval"]
    resolve_rouge_options(args, ev["metric"])
    subset = args.subset or ev.get("gen_subset", "test")
    names = result_files.result_names(subset, ev.get("gen_subset", "test"))  # dev scores beside test scores
    moved += result_files.retire(run, subset, names, args.force)
    if moved:
        print(f"previous result moved aside to {', '.join(p.name for p in moved)} (removed once this "
              "evaluation succeeds)", flush=True)
    n_avg = args.avg_last if args.avg_last is not None else ev.get("avg_last", 5)
    by_update = ev.get("avg_by", "epoch") == "update"
    device = "cpu" if args.cpu or visible_gpus() == 0 else "gpu"
    src, tgt = cfg.get("source_lang"), cfg.get("target_lang")
    result = result_files.config_fields(cfg, run, run_info, data, subset)
    total = check_before_decoding(cfg, data, subset, args.rouge_implementation)
    eval_dir = run / "eval"
    eval_dir.mkdir(exist_ok=True)
    # an earlier decode of this subset must not pass for this one's if decoding fails
    for name in (f"{subset}.hyp", f"{subset}.ref", f"{subset}.detok.hyp"):
        (eval_dir / name).unlink(missing_ok=True)

    ckpt_dir = run / "checkpoints"
    if args.checkpoint:
        checkpoint = Path(args.checkpoint).resolve()
        if not checkpoint.is_file():
            raise EvaluateError(f"--checkpoint {checkpoint}: not found")
        averaged = [str(checkpoint)]
    else:
        checkpoint = eval_dir / f"checkpoint_avg{n_avg}.pt"
        avg_argv = ["--inputs", str(ckpt_dir),
                    "--num-update-checkpoints" if by_update else "--num-epoch-checkpoints", str(n_avg),
                    "--output", str(checkpoint), "--overwrite"]
        print("+ python -m man_recipes.cli.average_checkpoints " + " ".join(avg_argv), flush=True)
        try:
            averaged = average(ckpt_dir, n_avg, by_update, checkpoint, overwrite=True)  # eval/ is ours
        except CheckpointsNotFound as e:
            raise EvaluateError(f"cannot average: {e}; evaluate fewer with --avg-last K, or one file with "
                                f"--checkpoint {ckpt_dir / 'checkpoint_last.pt'}") from e
        except AverageError as e:
            raise EvaluateError(f"cannot average: {e}") from e
    state = load_state(checkpoint)
    check_run_model(state, checkpoint, cfg, run_info, run)
    num_updates, epochs_completed = training_progress(state)
    del state

    generate_log = eval_dir / f"generate-{subset}.txt"
    # ROUGE reads the release's references: decode from the sources alone when data-prep wrote them
    sources_only = (bool(src) and metric_named(cfg["eval"]["metric"]).raw_references_only
                    and raw_reference_file(data, subset, tgt).is_file())
    gen_cmd, ids, hyps, refs = decode(cfg, data, checkpoint, subset, device, args.precision, args.batch_size,
                                      generate_log, total, sources_only=sources_only)
    if ids != list(range(len(ids))) or (total is not None and len(ids) != total):
        # line i of the raw references is sentence i: every sentence must be decoded, once
        raise EvaluateError(f"fairseq-generate decoded {len(ids):,} sentences of `{subset}`"
                            + (f", ids {ids[0]} to {ids[-1]}" if ids else "")
                            + (f", not its {total:,}" if total is not None else ", not sentences 0 to n-1")
                            + f"; see {generate_log}")
    (eval_dir / f"{subset}.hyp").write_text("\n".join(hyps) + "\n")

    scores, details = score_decoded(cfg, data, subset, hyps, refs, eval_dir, args.rouge_order,
                                    args.rouge_implementation, args.rouge_exception_db)

    result.update({
        "n_sentences": len(hyps), "checkpoint": str(checkpoint), "averaged": averaged,
        "generate_command": gen_cmd, "scores": scores, "details": details,
        "data_fingerprint": data_fingerprint(data, subset, src, tgt) if src else {},
        "num_updates": num_updates, "epochs_completed": epochs_completed,
    })
    result_files.write(run, result, names)
    print(json.dumps(scores))


if __name__ == "__main__":
    sys.exit(main())
