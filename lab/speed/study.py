"""``scripts/speed.sh [study] EXPERIMENT``: each family's real cost where users pay it, on a study's own data
against its Transformer: fairseq-train's words/s (``wps`` of each ``--log-interval``) and peak memory
(``ru_maxrss`` from ``os.wait4``; on a GPU torch's peak CUDA memory, :mod:`.cuda_peak`), fairseq-generate's
sentences/s on a fixed test sample with the study's trained checkpoint (else a one-update model). Each
repeat runs every family in turn, the Transformer first, with ``OMP_NUM_THREADS`` the thread count measured;
one record per setting (``RESULTS/speed/<experiment>-threads<T>.json``, ``-cuda-<precision>`` on a GPU),
the tables rebuilt from the records alone (:mod:`.records`). Method: results/speed/README.md.
"""

import argparse
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.speed import records
from lab.speed.cuda_peak import PEAK_LINE
from man_recipes.interrupt import child_process, one_line_on_ctrl_c
from man_recipes.logging_setup import quiet_logging
from man_recipes.paths import output_folder_problem
from man_recipes.config import REPO, ConfigError, load_config
from man_recipes.data.dataprep import PrepError
from man_recipes.data.manifest import read_manifest
from man_recipes.data.subword import read_subword
from man_recipes.evaluation.decode import EvaluateError, generate_args, read_generate_output
from man_recipes.evaluation.fixed_sample import SAMPLE_SEED, sample_ids, sampled_split
from lab.bounds import repeats, updates
from man_recipes.options import MAX_BATCH_SENTENCES, MAX_SEEDS, batch_size, number, precision_list, thread_counts
from man_recipes.tools import tool_env
from man_recipes.training.fairseq_log import LogError, train_intervals
from man_recipes.training.launch import launch_command, split_fairseq_args
from man_recipes.studies.experiments import EXPERIMENTS, FAMILY_LABELS, parse_families, prepare_line

SEED = 1  # every family's training: the same shuffling, so the same batches
CPU_FP32 = {"device": "cpu", "precision": "fp32", "threads": 1}
WARMUP_INTERVALS = 1  # logged intervals left out of words/s: the first updates are slow
TRANSLATED_RE = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([0-9.]+)s "
                           r"\(([0-9.]+) sentences/s, ([0-9.]+) tokens/s\)")


class SpeedError(RuntimeError):
    pass


def log(msg):
    print(f"[speed {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def thread_env(threads):
    """The fairseq tools' environment with ``threads`` threads for torch (OpenMP, MKL)."""
    return tool_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def run_measured(cmd, log_path, env):
    """(exit code, output, peak resident MiB of that process, wall seconds) of ``cmd``, its output in
    ``log_path`` (written by the tool itself: relaying its lines would take CPU from the process measured)."""
    if shutil.which(cmd[0], path=env["PATH"]) is None:
        raise SpeedError(f"{cmd[0]} not found on PATH")
    start = time.monotonic()
    with open(log_path, "w") as out, child_process(cmd, env=env, stdout=out, stderr=subprocess.STDOUT) as proc:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return proc.returncode, Path(log_path).read_text(errors="replace"), usage.ru_maxrss / 1024, time.monotonic() - start


def failure(what, rc, text, log_path):
    said = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "no output")
    return SpeedError(f"{what} failed (exit code {rc}): {said[-300:]} (its output: {log_path})")


def train_command(cfg, data, save_dir, extra, setting=None):
    """fairseq-train as ``scripts/train.sh`` runs it; on a GPU through :mod:`.cuda_peak` (plus its peak CUDA memory)."""
    setting = setting or CPU_FP32
    cmd = launch_command(cfg, save_dir, nproc=1, device="gpu" if setting["device"] == "cuda" else "cpu",
                         precision=setting["precision"], data=data, extra=extra)
    if setting["device"] == "cuda":
        cmd = [sys.executable, "-m", "lab.speed.cuda_peak"] + cmd[1:]
    return cmd


def cuda_peak_mib(text, log_path):
    found = [line for line in text.splitlines() if line.startswith(PEAK_LINE)]
    if not found or not found[-1][len(PEAK_LINE):].endswith(" MiB"):
        raise SpeedError(f"{log_path}: no peak CUDA memory line ({PEAK_LINE.strip()!r} ... MiB): did it run on a GPU?")
    return float(found[-1][len(PEAK_LINE):-len(" MiB")])


def measure_training(cfg, args, setting, work, tag):
    """One fairseq-train of ``args.updates`` updates: {command, wps, wpb, num_updates, peak_rss_mib, seconds}
    (and peak_cuda_mib on a GPU)."""
    extra = ["--seed", SEED, "--max-update", args.updates, "--max-epoch", 0, "--log-interval", args.log_interval,
             "--log-format", "simple", "--no-save", "--disable-validation"] + list(args.fairseq_args)
    cmd = train_command(cfg, args.data, work / tag / "checkpoints", extra, setting)
    (work / tag).mkdir(parents=True)
    log_path = work / tag / "train.log"
    rc, text, peak, seconds = run_measured(cmd, log_path, thread_env(setting["threads"]))
    if rc != 0:
        raise failure(f"training {tag}", rc, text, log_path)
    rows = train_intervals(log_path)
    if len(rows) <= WARMUP_INTERVALS:
        raise LogError(f"{log_path}: {len(rows)} progress line(s), need more than {WARMUP_INTERVALS} (warm-up): "
                       "more --updates or a smaller --log-interval")
    train = {"command": [str(c) for c in cmd], "num_updates": [r["num_updates"] for r in rows],
             "wps": [r["wps"] for r in rows], "wpb": [r["wpb"] for r in rows],
             "peak_rss_mib": round(peak, 1), "seconds": round(seconds, 1)}
    if setting["device"] == "cuda":
        train["peak_cuda_mib"] = cuda_peak_mib(text, log_path)
    return train


def measure_decoding(cfg, sample_data, subset, checkpoint, n, args, setting, work, tag):
    """One fairseq-generate of the test sample: {command, sentences, tokens, seconds, sentences_per_s, ...}."""
    cmd = ["fairseq-generate"] + generate_args(cfg, sample_data, checkpoint, subset, setting["device"],
                                               setting["precision"], args.batch_size,
                                               read_subword(args.data))  # the sample's folder has no record
    log_path = work / tag / "generate.txt"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rc, text, peak, seconds = run_measured(cmd, log_path, thread_env(setting["threads"]))
    if rc != 0:
        raise failure(f"decoding {tag}", rc, text, log_path)
    ids, _, _ = read_generate_output(text)
    said = TRANSLATED_RE.findall(text)
    if len(ids) != n or not said:
        raise SpeedError(f"decoding {tag}: {len(ids)} hypotheses for {n} sentences"
                         + ("" if said else ", and no 'Translated N sentences' line") + f" (its output: {log_path})")
    sentences, tokens, gen_seconds, per_s, _ = said[-1]
    return {"command": [str(c) for c in cmd], "sentences": int(sentences.replace(",", "")),
            "tokens": int(tokens.replace(",", "")), "generate_seconds": float(gen_seconds),
            "sentences_per_s": float(per_s), "peak_rss_mib": round(peak, 1), "seconds": round(seconds, 1)}


def checkpoints(families, cfgs, args, work, setting):
    """{family: {path, trained, ...}}: the study's trained checkpoint of each family, else a model
    trained for one update in ``work`` (so that fairseq-generate has a checkpoint to load)."""
    found = {}
    for fam in families:
        run = args.runs_dir / f"{fam}-seed{args.checkpoint_seed}" if args.runs_dir else None
        trained = run / "checkpoints" / "checkpoint_last.pt" if run else None
        if trained and trained.is_file():
            stat = trained.stat()
            found[fam] = {"path": str(trained), "trained": True, "seed": args.checkpoint_seed,
                          "finished": (run / ".train.done").is_file(),
                          "bytes": stat.st_size, "modified": datetime.datetime.fromtimestamp(
                              stat.st_mtime, datetime.timezone.utc).isoformat(timespec="seconds")}
            if args.fairseq_args:  # training takes them, the study's checkpoint was trained without them
                log(f"note: {fam} decodes the study's checkpoint {trained}, not a model of the options after '--'")
            continue
        log(f"no trained checkpoint of {fam} ({trained or 'no runs'}): decoding a model trained for one update")
        save = work / f"untrained-{fam}"
        extra = ["--seed", SEED, "--max-update", 1, "--max-epoch", 0, "--disable-validation",
                 "--no-epoch-checkpoints"] + list(args.fairseq_args)
        save.mkdir(parents=True)
        rc, text, _, _ = run_measured(train_command(cfgs[fam], args.data, save, extra, setting), save / "train.log",
                                      thread_env(setting["threads"]))
        if rc != 0 or not (save / "checkpoint_last.pt").is_file():
            raise failure(f"the one-update model of {fam}", rc, text, save / "train.log")
        found[fam] = {"path": str(save / "checkpoint_last.pt"), "trained": False, "missing": str(trained or "no runs"),
                      "instead": "a model trained for one update (seed 1) in the measurement's temporary folder"}
    return found


def gpu_name():
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def measure(experiment, families, cfgs, args, setting, sample, ckpts, work):
    """The record of one setting (a thread count; on a GPU, a precision): every family in every repeat,
    the Transformer first."""
    subset, sample_data, ids = sample
    record = records.new_record(
        experiment, setting, args.command, args.data, {f: cfgs[f]["_path"] for f in families},
        {"repeats": args.repeats, "updates": args.updates, "log_interval": args.log_interval,
         "warmup_intervals": WARMUP_INTERVALS, "seed": SEED, "test_set": subset, "decode_sentences": len(ids),
         "sample_seed": SAMPLE_SEED, "batch_size": args.batch_size, "fairseq_args": list(args.fairseq_args),
         "skip_decoding": args.skip_decoding, "checkpoint_seed": args.checkpoint_seed},
        gpu_name() if setting["device"] == "cuda" else None)
    record.update(checkpoints=ckpts, runs=[])
    name = records.setting_name(record)
    for repeat in range(1, args.repeats + 1):
        for fam in families:
            tag = f"{records.setting_tag(record)}-repeat{repeat}-{fam}"
            loadavg = list(os.getloadavg())
            train = measure_training(cfgs[fam], args, setting, work, tag)
            decode = None if args.skip_decoding else measure_decoding(
                cfgs[fam], sample_data, subset, ckpts[fam]["path"], len(ids), args, setting, work, tag)
            record["runs"].append({"repeat": repeat, "family": fam, "loadavg": loadavg, "train": train,
                                   "decode": decode})
            values = records.run_values(record["runs"][-1], WARMUP_INTERVALS)
            log(f"{name}, repeat {repeat}/{args.repeats}, {fam}: training {values['train']:,.0f} words/s, peak "
                f"{values['memory']:,.0f} MiB" + ("" if decode is None else f"; decoding {values['decode']:.1f} "
                                                                              "sentences/s")
                + ("" if decode is None or ckpts[fam]["trained"] else " (untrained model)"))
    return records.finish(record)


def write_table(study, records_dir, update_docs):
    recs = records.read_records(records_dir, study["name"])
    if not recs:
        raise SpeedError(f"no speed record of {study['name']} in {records_dir}: measure first "
                         f"({study['command']})")
    md = records_dir / f"{study['name']}.md"
    md.write_text(records.to_markdown(study["name"], recs, study["labels"], study["title"]))
    log(f"wrote {md}")
    if update_docs:
        page = REPO / records.PAGE
        text = page.read_text(encoding="utf-8")
        page.write_text(records.replace_page_block(
            text, records.page_block(records_dir, FAMILY_LABELS), page), encoding="utf-8")
        log(f"rebuilt the speed table of {page} from {records_dir}")
    return md


def measure_parser(prog="scripts/speed.sh", description=None):
    """The options of every measurement on fairseq-train and fairseq-generate (this mode's and the synthetic
    mode's); the study mode adds its experiment and data (:func:`parser`)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=description or "Measure each family of a study against its Transformer on the study's real "
                    "batches: training words/s, peak training memory, decoding sentences/s, interleaved, on each "
                    "thread count; write one record per thread count and rebuild the table from the records.")
    p.add_argument("--families", default=None,
                   help="comma-separated subset of the study's families (default: all it has configs for, those "
                        "kept only to be measured included: cnndm-cpu's man-nobias, MAN's floor, and sman2; the "
                        "Transformer is always measured, first: it is every ratio's baseline)")
    p.add_argument("--threads", type=thread_counts, default=None,
                   help="thread counts, e.g. 1,2 (default 1,2 on the CPU; on a GPU one count, default 1)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: train (and decode) on the GPU, one record per --precision")
    p.add_argument("--precision", type=precision_list, default=None,
                   help="on a GPU: comma-separated bf16, fp16, fp32 (default bf16,fp16; fairseq's --bf16/--fp16 "
                        "cast the whole model); the CPU measures fp32")
    p.add_argument("--skip-decoding", action="store_true",
                   help="training only (decoding needs a trained checkpoint to say much, see the table's †)")
    p.add_argument("--repeats", type=repeats("--repeats"), default=3)
    p.add_argument("--updates", type=updates("--updates"), default=60, help="training updates per run")
    p.add_argument("--log-interval", type=updates("--log-interval"), default=10,
                   help="updates per logged interval (the first is warm-up; default %(default)s)")
    p.add_argument("--decode-sentences", type=number("--decode-sentences", low=1, high=MAX_BATCH_SENTENCES,
                                                     ceiling="more than any test set holds"), default=200,
                   help="test pairs decoded per run (a fixed sample of the first test set)")
    p.add_argument("--batch-size", type=batch_size(), default=128,
                   help="fairseq-generate sentences per batch (the studies' default)")
    p.add_argument("--results-dir", default=str(REPO / "results"), help="records go to RESULTS/speed/")
    p.add_argument("--force", action="store_true", help="replace the records of the settings measured")
    p.add_argument("--table-only", action="store_true", help="only rebuild the table from the records")
    p.epilog = "Options after '--' go to every fairseq-train run unchanged (they override the configs)."
    return p


def parser():
    p = measure_parser()
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--data", default=None, help="binarized data (default: the study's data-bin)")
    p.add_argument("--runs-dir", default=None, help="the study's runs, for trained checkpoints (default runs/EXPERIMENT)")
    p.add_argument("--checkpoint-seed", type=number("--checkpoint-seed", low=1, high=MAX_SEEDS,
                                                    ceiling="reproduce.sh's seeds"), default=1,
                   help="decode the study's runs of this seed (RUNS/FAMILY-seedS; default %(default)s)")
    p.add_argument("--update-docs", "--update-readme", dest="update_docs", action="store_true",
                   help=f"also rebuild the real-batch speed table of {records.PAGE} from every record in "
                        "RESULTS/speed/ (--update-readme: the old spelling, from when the table was in the README)")
    return p


def settings(args, p):
    """[{device, precision, threads}] to measure, one record each; a decoding option set with
    --skip-decoding is refused (it would change nothing)."""
    if args.skip_decoding:
        unread = [f"--{d.replace('_', '-')} {getattr(args, d)}" for d in ("decode_sentences", "batch_size",
                                                                           "checkpoint_seed")
                  if d in vars(args) and getattr(args, d) != p.get_default(d)]
        if unread:
            p.error(f"{', '.join(unread)}: nothing is decoded with --skip-decoding")
    if args.device == "cpu":
        if args.precision not in (None, ["fp32"]):
            p.error("--precision: the CPU measures fp32 only (fairseq's --fp16/--bf16 need a GPU)")
        return [dict(CPU_FP32, threads=t) for t in args.threads or [1, 2]]
    threads = args.threads or [1]
    if len(threads) != 1:
        p.error("--threads: one thread count on a GPU (its records are one per --precision)")
    if gpu_name() is None:  # fairseq-train would quietly train on the CPU under a cuda record
        p.error("--device cuda: torch sees no CUDA device here")
    return [{"device": "cuda", "precision": prec, "threads": threads[0]} for prec in args.precision or ["bf16", "fp16"]]


def parse(p, argv):
    """(args, the fairseq options after '--') with the checks every mode shares; usage errors exit 2."""
    full = list(sys.argv[1:] if argv is None else argv)
    ours, fairseq_args = split_fairseq_args(full)
    args = p.parse_args(ours)
    args.fairseq_args, args.command = fairseq_args, f"{p.prog} " + shlex.join(str(a) for a in full)
    if args.updates < (WARMUP_INTERVALS + 1) * args.log_interval:
        p.error(f"--updates {args.updates} with --log-interval {args.log_interval}: need at least "
                f"{(WARMUP_INTERVALS + 1) * args.log_interval} updates (the first interval is warm-up)")
    args.settings = settings(args, p)
    for folder in (Path(args.results_dir).resolve(), Path(args.results_dir).resolve() / "speed"):
        if folder.exists() and not folder.is_dir():
            p.error(f"--results-dir: {folder} is a file, not a folder")
        if problem := output_folder_problem(folder):  # found before the measurement, not after it
            p.error(f"--results-dir: {problem}")
    return args


@one_line_on_ctrl_c("scripts/speed.sh")  # its parser's prog: one line under speed.sh and python -m alike
def main(argv=None):
    quiet_logging()
    p = parser()
    args = parse(p, argv)
    exp = EXPERIMENTS[args.experiment]
    try:
        families = parse_families(args.experiment, args.families, speed=True)[1]
    except ValueError as e:
        p.error(str(e))
    args.data = Path(args.data or exp["data"]).resolve()
    args.runs_dir = Path(args.runs_dir or REPO / "runs" / args.experiment).resolve()
    return measure_and_tabulate(args, experiment_study(args.experiment, families, args.data),
                                Path(args.results_dir).resolve() / "speed")


def experiment_study(experiment, families=None, data=None):
    """What :func:`run_study` measures of a study of scripts/reproduce.sh: its name, title, labels, dataset,
    the command that prepares ``data`` and {family: config}, the Transformer first."""
    exp = EXPERIMENTS[experiment]
    return {"name": experiment, "title": exp["title"], "labels": FAMILY_LABELS, "dataset": exp["dataset"],
            "command": f"scripts/speed.sh {experiment}", "prepare": prepare_line(experiment, data),
            "configs": {f: exp["configs"] / f"{f}.yaml" for f in families or []}}


def measure_and_tabulate(args, study, records_dir):
    """Measure (unless --table-only), rebuild the table and print it: 0, or 2 with one line saying what failed."""
    try:
        if not args.table_only:
            run_study(args, study, records_dir)
        md = write_table(study, records_dir, getattr(args, "update_docs", False))
        print(md.read_text())
    except (SpeedError, LogError, PrepError, ConfigError, EvaluateError, records.SpeedRecordError, OSError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    return 0


def run_study(args, study, records_dir):
    """Measure every setting, writing each one's record as it completes. ``study``: its name, dataset, the
    command that prepares its data, and {family: config path}, the Transformer first; ``study["model"]``,
    when given, {family: model options over its config}."""
    targets = [records.record_path(records_dir, study["name"], s["threads"], s["device"], s["precision"])
               for s in args.settings]
    for path in targets:  # before any work: nothing measured for an hour is then refused
        if path.exists():
            try:
                old = records.read_record(path)
            except records.SpeedRecordError as e:  # a file of another kind is never replaced
                raise SpeedError(f"{e}; not replaced") from e
            if not args.force:
                raise SpeedError(f"{path} exists (measured {old.get('date')} on {old.get('cpu')}); pass --force "
                                 "to replace it")
    manifest = read_manifest(args.data, study["dataset"], study["prepare"])
    cfgs = {f: load_config(path) for f, path in study["configs"].items()}
    for fam, options in study.get("model", {}).items():
        cfgs[fam]["model"] = dict(cfgs[fam].get("model") or {}, **options)
    families = list(cfgs)
    records_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="man-fairseq-speed-"))
    try:
        subset = next(iter(manifest["test_sets"]))
        ids = sample_ids(manifest["counts"][subset], args.decode_sentences)
        sample_data = sampled_split(args.data, subset, manifest["source_lang"], manifest["target_lang"], ids,
                                    work / "sample")
        ckpts = {} if args.skip_decoding else checkpoints(families, cfgs, args, work, args.settings[0])
        for setting, target in zip(args.settings, targets):
            record = measure(study["name"], families, cfgs, args, setting, (subset, sample_data, ids), ckpts, work)
            record.update(study.get("record", {}))
            records.write_json(target, record)
            log(f"wrote {target}")
            write_table(study, records_dir, False)  # the table never lags its records
    except BaseException:
        log(f"stopped; the logs of its runs are kept in {work}")
        raise
    shutil.rmtree(work)


if __name__ == "__main__":
    sys.exit(main())
