"""Multi30k studies of every family against the Transformer (``scripts/reproduce.sh EXPERIMENT``).

Experiments: ``multi30k`` (the papers' small width, ``configs/multi30k/``) and ``multi30k-cpu``
(a 2-core-CPU preset, ``configs/multi30k-cpu/``), both on the data-bin of
data-prep/prepare-multi30k.sh. For each family and seed: train with the recipe launcher
(:mod:`launch`, one process), average the last epoch checkpoints, decode every test set with
fairseq-generate, score tokenized BLEU (case-insensitive) and detokenized sacreBLEU, and write
the run's record (:mod:`study_records`) under ``RESULTS/<experiment>/``. The table
(:mod:`study_table`: ``RESULTS/<experiment>.md``, ``.json``, ``-valid-loss.png``, with sacreBLEU's
paired bootstrap against the same seed's Transformer) is rebuilt from the records alone, so a
study can advance run by run across machines.

A rerun does not retrain a run whose record matches today's config (its fingerprint); an
interrupted training resumes from its ``checkpoint_last.pt`` (fairseq's own restore); a run folder
of another config is refused; ``--force`` retrains and rescores the selected runs from scratch.
``--table-only`` rebuilds the table from the records without training anything.

``--time-updates N`` instead measures, per family, seconds per update over N updates at the
config's width and batch and extrapolates one epoch (``RESULTS/<experiment>-timing-<device>.json``).
"""

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..cli.plotting import quiet_logging
from ..provenance import cpu_model, git_commit
from .config import CONFIG_DIR, REPO, load_config
from .fairseq_log import LogError, epoch_seconds, model_params, seconds_per_update, valid_curve
from .study_records import RecordError, option_flags, record_fingerprint

FAMILIES = ["transformer", "man", "sman2", "localness", "diffwin", "calibration"]
BASELINE = "transformer"
FAMILY_LABELS = {
    "transformer": "Transformer (small)",
    "man": "MAN (small, DMAN enc.)",
    "sman2": "SMAN2 (b=4)",
    "localness": "Localness (query window)",
    "diffwin": "Diffwin Enc(AW)-Cr(AW,Seg)-Dec(MW)",
    "calibration": "Calibration (anneal)",
}
MULTI30K_DATA = REPO / "data-bin" / "multi30k.de-en"
EXPERIMENTS = {
    "multi30k": {"configs": CONFIG_DIR / "multi30k", "data": MULTI30K_DATA,
                 "title": "Multi30k De→En, papers' small width: every family against the Transformer"},
    "multi30k-cpu": {"configs": CONFIG_DIR / "multi30k-cpu", "data": MULTI30K_DATA, "device": "cpu",
                     "title": "Multi30k De→En on a 2-core CPU (d=256, 3+3 layers): every family against the Transformer"},
}


class ReproduceError(RuntimeError):
    pass


def log(msg):
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def device_name(device):
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)} (1 GPU)"
    return f"CPU: {cpu_model()}, {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"


def read_manifest(data):
    manifest = Path(data) / "multi30k.json"
    if not manifest.is_file():
        raise ReproduceError(f"{data}: no multi30k.json; prepare the data first: "
                             f"data-prep/prepare-multi30k.sh [--from FOLDER] --dest {data}")
    return json.loads(manifest.read_text())


def prepare_run_dir(run, fingerprint, force):
    """Make ``run`` ready to train the run of ``fingerprint``; True when it already finished.

    A run folder remembers its fingerprint (``.fingerprint``). One of another config is never
    resumed (fairseq would continue its checkpoints under the new options): it is an error, and
    ``--force`` starts it afresh, removing only a folder the launcher made (``run.json``).
    """
    done, stamp = run / ".train.done", run / ".fingerprint"
    if run.exists() and any(run.iterdir()):
        same = stamp.is_file() and stamp.read_text().strip() == fingerprint
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
        elif done.is_file():
            return True
    run.mkdir(parents=True, exist_ok=True)
    stamp.write_text(fingerprint + "\n")
    return False


@contextlib.contextmanager
def run_lock(runs_dir, name):
    """Whether this process owns the (family, seed) run: two scripts/reproduce.sh at once (say one per
    family, as on a 2-core machine) must not train the same run folder; the baseline is in both."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    with open(runs_dir / f".{name}.lock", "a") as f:  # beside the folder: --force removes the folder
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # the lock goes with the file's close, also when the process dies


def train_run(cfg, run, seed, args, fingerprint, force=False):
    """Train one (family, seed) run unless it finished; an interrupted one resumes."""
    from . import launch

    if prepare_run_dir(run, fingerprint, force):
        log(f"skip  training {run.name} (finished, same config)")
        return
    resumed = (run / "checkpoints" / "checkpoint_last.pt").is_file()
    log(f"{'resume' if resumed else 'start'} training {run.name}")
    argv = [cfg["_path"], "--run-dir", str(run), "--data", str(args.data), "--gpus", "1",
            "--precision", args.precision] + (["--cpu"] if args.device == "cpu" else [])
    argv += ["--", "--seed", str(seed)] + list(args.fairseq_args)
    rc = launch.main(argv)
    if rc != 0:
        raise ReproduceError(f"training {run.name} failed (exit {rc}); log: {run / 'train.log'}. "
                             "Run the same command again to resume it.")
    (run / ".train.done").write_text(datetime.datetime.now(datetime.timezone.utc).isoformat() + "\n")


def evaluate_run(cfg, run, seed, family, test_sets, args, fingerprint):
    """Average the last checkpoints, decode every test set, score; returns (record, hypotheses)."""
    from . import scoring
    from .evaluate import _run, generate_args, read_generate_output
    from man_fairseq.cli.average_checkpoints import AverageError, last_n_checkpoints
    from man_fairseq.cli.average_checkpoints import main as average_main

    ev = cfg["eval"]
    n_avg = args.avg_last or ev.get("avg_last", 5)
    by_update = ev.get("avg_by", "epoch") == "update"
    eval_dir = run / "eval"
    eval_dir.mkdir(exist_ok=True)
    ckpt_dir = run / "checkpoints"
    checkpoint = eval_dir / f"checkpoint_avg{n_avg}.pt"
    try:
        averaged = last_n_checkpoints(str(ckpt_dir), n_avg, by_update)
        # eval/ is this run folder's own: each rescoring replaces its average
        average_main(["--inputs", str(ckpt_dir), "--num-update-checkpoints" if by_update else
                      "--num-epoch-checkpoints", str(n_avg), "--output", str(checkpoint), "--overwrite"])
    except AverageError as e:
        raise ReproduceError(f"{run.name}: cannot average: {e}") from e
    device = "cpu" if args.device == "cpu" else "gpu"
    tgt = cfg["target_lang"]
    results, hypotheses = {}, {}
    for subset, release_name in test_sets.items():
        cmd = ["fairseq-generate"] + generate_args(cfg, args.data, checkpoint, subset, device, args.precision,
                                                   args.batch_size)
        ids, hyps, refs = read_generate_output(_run(cmd, eval_dir / f"generate-{subset}.txt"))
        raw_refs = (Path(args.data) / f"{subset}.raw.{tgt}").read_text(encoding="utf-8").splitlines()
        if len(raw_refs) != len(ids) or ids != list(range(len(ids))):
            raise ReproduceError(f"{run.name} {subset}: {len(ids)} hypotheses for {len(raw_refs)} references")
        detok = scoring.moses_detokenize(hyps, tgt)
        tok_bleu = scoring.tokenized_bleu(hyps, refs, lowercase=True)
        sacre = scoring.sacrebleu_detok(detok, raw_refs)
        hypotheses[subset] = detok
        results[subset] = {"name": release_name, "n_sentences": len(hyps), "bleu_tok_ci": tok_bleu["bleu"],
                           "sacrebleu": sacre["bleu"], "sacrebleu_signature": sacre["signature"],
                           "tokenized_bleu_details": tok_bleu,
                           "generate_command": [str(c) for c in cmd]}
        log(f"      {run.name} {release_name}: sacreBLEU {sacre['bleu']:.2f}, tokenized BLEU {tok_bleu['bleu']:.2f}")
    train_seconds, attempts = epoch_seconds(run / "train.log")
    run_json = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    curve = valid_curve(run / "train.log")
    record = {"family": family, "seed": seed, "fingerprint": fingerprint,
              "config": os.path.relpath(cfg["_path"], REPO), "name": cfg["name"], "arch": cfg["arch"],
              "fairseq_args": list(args.fairseq_args), "train_command": run_json.get("command"),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": git_commit(), "device": device_name(args.device),
              "threads": os.environ.get("OMP_NUM_THREADS", "unset"), "loadavg_at_end": os.getloadavg(),
              "params": model_params(run / "train.log"), "train_seconds": round(train_seconds, 1),
              "train_attempts": attempts, "updates": curve[-1][0] if curve else None,
              "epochs": len(curve), "averaged_checkpoints": [Path(c).name for c in averaged],
              "valid_curve": curve, "test_sets": results}
    return record, hypotheses


# ---------------------------------------------------------------------------------- timing

def time_families(families, cfgs, args, on_family=None):
    """Seconds per update over ``args.time_updates`` updates per family, extrapolated to an epoch.

    ``on_family(rows)`` is called after each family, so an interrupted measurement keeps what it has.
    """
    from . import launch

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
        argv = [cfgs[fam]["_path"], "--run-dir", str(run), "--data", str(args.data), "--gpus", "1",
                "--precision", args.precision] + (["--cpu"] if args.device == "cpu" else [])
        argv += ["--", "--seed", "1", "--max-update", str(n), "--log-interval", str(interval),
                 "--no-save", "--disable-validation"] + list(args.fairseq_args)
        log(f"timing {fam}: {n} updates")
        if launch.main(argv) != 0:
            raise ReproduceError(f"timing run {fam} failed; log: {run / 'train.log'}")
        spu, size = seconds_per_update(run / "train.log")
        rows[fam] = {"seconds_per_update": round(spu, 3), "updates_per_epoch": size,
                     "epoch_minutes_extrapolated": round(spu * size / 60, 1),
                     "params": model_params(run / "train.log"), "updates_timed": n, "log_interval": interval}
        log(f"      {fam}: {spu:.2f} s/update x {size} updates/epoch = {spu * size / 60:.1f} min/epoch (extrapolated)")
        if on_family:
            on_family(rows)
    return rows


# ------------------------------------------------------------------------------------ main

def parse_seeds(spec):
    """``"3"`` -> [1, 2, 3]; ``"2,3"`` -> [2, 3]."""
    spec = str(spec).strip()
    if "," not in spec:
        n = int(spec)
        if n < 1:
            raise ValueError("must be >= 1")
        return list(range(1, n + 1))
    seeds = [int(x) for x in spec.split(",") if x.strip()]
    if not seeds or min(seeds) < 1 or len(set(seeds)) != len(seeds):
        raise ValueError(f"a list of distinct seeds >= 1, got {spec!r}")
    return seeds


def build_table(experiment, cfgs, args, manifest, results_dir):
    """Rebuild ``RESULTS/<experiment>.md/.json/-valid-loss.png`` from the records alone."""
    from . import study_table
    from .study_records import partition, read_records

    records_dir = results_dir / experiment
    records = read_records(records_dir)
    expected = {(r["family"], r["seed"]): record_fingerprint(cfgs[r["family"]], args, r["seed"])
                for r in records if r["family"] in cfgs}
    current, stale = partition(records, expected)
    for r in stale:
        log(f"stale record {r['family']}-seed{r['seed']} (fingerprint {r.get('fingerprint')}): not in the table")
    if not current:
        raise ReproduceError(f"no current run record in {records_dir}: nothing to tabulate" + (
            f" ({len(stale)} stale: pass the options they were made with)" if stale else ""))
    tgt = manifest["target_lang"]
    refs = {subset: (Path(args.data) / f"{subset}.raw.{tgt}").read_text(encoding="utf-8").splitlines()
            for subset in manifest["test_sets"]}
    log("paired bootstrap against the Transformer of the same seed")
    boot = study_table.significance(current, records_dir, refs, args.bootstrap_samples)
    summary = study_table.summarize(current, FAMILIES, FAMILY_LABELS, boot)
    png = results_dir / f"{experiment}-valid-loss.png"
    study_table.plot_curves(current, FAMILIES, FAMILY_LABELS, png, EXPERIMENTS[experiment]["title"].split(":")[0])
    first = next(iter(current[0]["test_sets"].values()))
    meta = {"title": EXPERIMENTS[experiment]["title"],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "records": os.path.relpath(records_dir, REPO) if records_dir.is_relative_to(REPO) else str(records_dir),
            "devices": sorted({f"{r['device']} (threads {r.get('threads')})" for r in current}),
            "commits": sorted({r["commit"] for r in current}),
            "configs": os.path.relpath(EXPERIMENTS[experiment]["configs"], REPO), "fairseq_args": args.fairseq_args,
            "command": f"scripts/reproduce.sh {experiment} --seeds 1 --families FAMILY"
                       + option_flags(args, EXPERIMENTS[experiment].get("device"))
                       + (" -- " + " ".join(args.fairseq_args) if args.fairseq_args else ""),
            "test_sets": manifest["test_sets"], "sacrebleu_signature": first["sacrebleu_signature"],
            "bootstrap_signature": next((b["signature"] for b in boot.values()), "–"), "png": png.name}
    (results_dir / f"{experiment}.md").write_text(study_table.to_markdown(summary, meta, stale))
    runs = [dict(r, paired_bootstrap={k[2]: v for k, v in boot.items() if k[:2] == (r["family"], r["seed"])})
            for r in current]
    (results_dir / f"{experiment}.json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "runs": runs,
         "stale": [f"{r['family']}-seed{r['seed']}" for r in stale]}, indent=1) + "\n")
    log(f"wrote {results_dir / (experiment + '.md')}, .json and {png.name}")
    return results_dir / f"{experiment}.md"


def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(
        prog="scripts/reproduce.sh",
        description="Train every family and the Transformer on Multi30k for several seeds, average, decode, "
                    "score (sacreBLEU + tokenized BLEU), write one record per run, and rebuild the table "
                    "(paired bootstrap against the Transformer, PNG) from the records.")
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--seeds", default="3", help="N (seeds 1..N) or a comma-separated list such as 2,3; one seed alone: N, with the comma (default 3)")
    p.add_argument("--families", default=",".join(FAMILIES),
                   help=f"comma-separated subset of {','.join(FAMILIES)} (the Transformer is always run: "
                        "it is the baseline of the significance test)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cpu for multi30k-cpu (its records were made there), else cuda when visible")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp16", help="GPU precision (CPU: fp32)")
    p.add_argument("--data", default=None, help="binarized data (default data-bin/multi30k.de-en)")
    p.add_argument("--runs-dir", default=None, help="default runs/EXPERIMENT")
    p.add_argument("--results-dir", default=str(REPO / "results"))
    p.add_argument("--avg-last", type=int, default=None, help="override eval.avg_last (epoch checkpoints averaged)")
    p.add_argument("--batch-size", type=int, default=128, help="fairseq-generate sentences per batch")
    p.add_argument("--bootstrap-samples", type=int, default=1000)
    p.add_argument("--force", action="store_true",
                   help="retrain and rescore the runs of the --families named (the Transformer only when "
                        "named) even when their record matches today's config")
    p.add_argument("--table-only", action="store_true", help="only rebuild the table from the records")
    p.add_argument("--time-updates", type=int, default=None,
                   help="only measure seconds per update over N updates per family (extrapolated to an epoch)")
    p.epilog = "Options after '--' go to every fairseq-train run unchanged (they override the configs)."
    from .launch import split_fairseq_args

    argv, fairseq_args = split_fairseq_args(argv)
    args = p.parse_args(argv)
    args.fairseq_args = fairseq_args
    exp = EXPERIMENTS[args.experiment]
    args.data = Path(args.data or exp["data"]).resolve()
    args.runs_dir = Path(args.runs_dir or REPO / "runs" / args.experiment).resolve()
    results_dir = Path(args.results_dir).resolve()
    args.device = args.device or exp.get("device")
    if args.device is None:
        from .launch import visible_gpus

        args.device = "cuda" if visible_gpus() > 0 else "cpu"
    for flag, value in (("--avg-last", args.avg_last), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            p.error(f"{flag} {value}: must be >= 1")
    try:
        args.seeds = parse_seeds(args.seeds)
    except ValueError as e:
        p.error(f"--seeds: {e}")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        p.error(f"unknown families {unknown}; choose from {FAMILIES}")
    named = set(families)  # --force applies to these; the baseline runs too, retrained only when named
    families = [BASELINE] + [f for f in FAMILIES if f in families and f != BASELINE]
    try:
        manifest = read_manifest(args.data)
        cfgs = {f: load_config(exp["configs"] / f"{f}.yaml") for f in families}
        results_dir.mkdir(parents=True, exist_ok=True)
        if args.time_updates:
            path = results_dir / f"{args.experiment}-timing-{args.device}.json"

            def write(rows):
                out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "commit": git_commit(), "device": device_name(args.device), "loadavg": os.getloadavg(),
                       "data": str(args.data), "counts": manifest["counts"], "families": rows,
                       "note": "seconds per update measured between the first and last progress line "
                               "(start-up excluded); epoch time = that x updates per epoch, extrapolated, "
                               "training only (no validation, no checkpointing)"}
                path.write_text(json.dumps(out, indent=1) + "\n")
                log(f"wrote {path}")
            time_families(families, cfgs, args, on_family=write)
            return 0
        if not args.table_only:
            from .study_records import matching_record, write_record

            records_dir = results_dir / args.experiment
            for seed in args.seeds:
                for fam in families:
                    fp = record_fingerprint(cfgs[fam], args, seed)
                    force = args.force and fam in named
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
                        train_run(cfgs[fam], run, seed, args, record_fingerprint(cfgs[fam], args, seed, True), force)
                        record, hyps = evaluate_run(cfgs[fam], run, seed, fam, manifest["test_sets"], args, fp)
                        log(f"wrote record {write_record(records_dir, record, hyps)}")
        all_cfgs = {f: load_config(exp["configs"] / f"{f}.yaml") for f in FAMILIES}
        md = build_table(args.experiment, all_cfgs, args, manifest, results_dir)
        print(md.read_text())
    except (ReproduceError, LogError, RecordError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
