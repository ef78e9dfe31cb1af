"""Multi30k reproduction of every family against the Transformer (``scripts/reproduce.sh multi30k``).

For each family (``configs/multi30k/<family>.yaml``) and seed: train with the recipe launcher
(:mod:`launch`, one process), average the last epoch checkpoints, decode every test set of the
data-bin (``multi30k.json`` of data-prep/prepare-multi30k.sh) with fairseq-generate, and score:
tokenized BLEU (case-insensitive, the config's ``bleu_ci``) and detokenized sacreBLEU with its
signature. Each family's hypotheses are compared with the Transformer's of the same seed by
sacreBLEU's paired bootstrap resampling (``sacrebleu.significance.PairedTest``, test_type ``bs``,
the same 13a BLEU). Writes ``RESULTS/multi30k.md``, ``RESULTS/multi30k.json`` and
``RESULTS/multi30k-valid-loss.png`` (validation loss of every run).

Re-running skips finished runs (``RUN/.train.done``, ``RUN/results.json``); an interrupted
training resumes from its ``checkpoint_last.pt`` (fairseq's own restore).

``--time-updates N`` instead measures, per family, seconds per update over N updates at the
config's width and batch and extrapolates one epoch (``RESULTS/multi30k-timing-<device>.json``).
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .config import CONFIG_DIR, REPO, load_config

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
EXPERIMENTS = {"multi30k": {"configs": CONFIG_DIR / "multi30k", "data": REPO / "data-bin" / "multi30k.de-en"}}


class ReproduceError(RuntimeError):
    pass


def log(msg):
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------- train log

VALID_RE = re.compile(r"valid on 'valid' subset \| loss ([0-9.]+) .*?\| num_updates (\d+)")
PARAMS_RE = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")
# "wall" is cumulative; "train_wall" (also on the line) is per interval: match ", wall=" exactly
INNER_RE = re.compile(r"epoch (\d+):\s+(\d+) / (\d+) .*?num_updates=(\d+).*?, wall=([0-9.]+)")


def valid_curve(train_log):
    """[(num_updates, valid loss)] from a fairseq-train log (a resumed run appends: last wins)."""
    points = {}
    if Path(train_log).is_file():
        for m in VALID_RE.finditer(Path(train_log).read_text(errors="replace")):
            points[int(m.group(2))] = float(m.group(1))
    return sorted(points.items())


def model_params(train_log):
    m = PARAMS_RE.findall(Path(train_log).read_text(errors="replace")) if Path(train_log).is_file() else []
    if not m:
        raise ReproduceError(f"{train_log}: no 'num. model params' line (did fairseq-train start?)")
    return int(m[-1].replace(",", ""))


def seconds_per_update(train_log):
    """(seconds per update, updates per epoch) from the progress lines of a simple-format log.

    Measured between the first and the last progress line, so model building, data loading and
    the first (slow) updates are left out.
    """
    rows = [(int(u), float(w), int(size)) for _, _, size, u, w in INNER_RE.findall(Path(train_log).read_text(errors="replace"))]
    if len(rows) < 2:
        raise ReproduceError(f"{train_log}: need two progress lines to time updates (lower --log-interval?)")
    (u0, w0, size), (u1, w1, _) = rows[0], rows[-1]
    if u1 <= u0:
        raise ReproduceError(f"{train_log}: progress lines do not advance")
    return (w1 - w0) / (u1 - u0), size


# ------------------------------------------------------------------------------------ runs

def git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def device_name(device):
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)} (1 GPU)"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {cpu}, {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"


def read_manifest(data):
    manifest = Path(data) / "multi30k.json"
    if not manifest.is_file():
        raise ReproduceError(f"{data}: no multi30k.json; prepare the data first: "
                             f"data-prep/prepare-multi30k.sh [--from FOLDER] --dest {data}")
    return json.loads(manifest.read_text())


def train_run(cfg, run, seed, args):
    """Train one (family, seed) run unless it finished; an interrupted one resumes."""
    from . import launch

    done = run / ".train.done"
    if done.is_file():
        log(f"skip  training {run.name} (finished; delete {done} to retrain)")
        return
    run.mkdir(parents=True, exist_ok=True)
    resumed = (run / "checkpoints" / "checkpoint_last.pt").is_file()
    log(f"{'resume' if resumed else 'start'} training {run.name}")
    argv = [cfg["_path"], "--run-dir", str(run), "--data", str(args.data), "--gpus", "1",
            "--precision", args.precision] + (["--cpu"] if args.device == "cpu" else [])
    argv += ["--", "--seed", str(seed)] + list(args.fairseq_args)
    t0 = time.time()
    rc = launch.main(argv)
    elapsed = time.time() - t0
    timing_file = run / "timing.json"
    timing = json.loads(timing_file.read_text()) if timing_file.is_file() else {"train_seconds": 0.0, "attempts": 0}
    timing["train_seconds"] += elapsed  # a resumed run adds its time to the interrupted part's
    timing["attempts"] += 1
    timing_file.write_text(json.dumps(timing, indent=1) + "\n")
    if rc != 0:
        raise ReproduceError(f"training {run.name} failed (exit {rc}); log: {run / 'train.log'}. "
                             "Run the same command again to resume it.")
    done.write_text(datetime.datetime.now(datetime.timezone.utc).isoformat() + "\n")


def evaluate_run(cfg, run, seed, family, test_sets, args):
    """Average the last checkpoints, decode every test set, score; writes RUN/results.json."""
    from . import scoring
    from .evaluate import _run, generate_args, read_generate_output
    from man_fairseq.cli.average_checkpoints import AverageError, last_n_checkpoints
    from man_fairseq.cli.average_checkpoints import main as average_main

    out_file = run / "results.json"
    if out_file.is_file():
        res = json.loads(out_file.read_text())
        if set(res.get("test_sets", {})) == set(test_sets):
            log(f"skip  evaluation {run.name} (done)")
            return res
    ev = cfg["eval"]
    n_avg = args.avg_last or ev.get("avg_last", 5)
    by_update = ev.get("avg_by", "epoch") == "update"
    eval_dir = run / "eval"
    eval_dir.mkdir(exist_ok=True)
    ckpt_dir = run / "checkpoints"
    checkpoint = eval_dir / f"checkpoint_avg{n_avg}.pt"
    try:
        averaged = last_n_checkpoints(str(ckpt_dir), n_avg, by_update)
        average_main(["--inputs", str(ckpt_dir), "--num-update-checkpoints" if by_update else
                      "--num-epoch-checkpoints", str(n_avg), "--output", str(checkpoint)])
    except AverageError as e:
        raise ReproduceError(f"{run.name}: cannot average: {e}") from e
    device = "cpu" if args.device == "cpu" else "gpu"
    tgt = cfg["target_lang"]
    results = {}
    for subset, release_name in test_sets.items():
        cmd = ["fairseq-generate"] + generate_args(cfg, args.data, checkpoint, subset, device, args.precision,
                                                   args.batch_size)
        ids, hyps, refs = read_generate_output(_run(cmd, eval_dir / f"generate-{subset}.txt"))
        raw_refs = (Path(args.data) / f"{subset}.raw.{tgt}").read_text(encoding="utf-8").splitlines()
        if len(raw_refs) != len(ids) or ids != list(range(len(ids))):
            raise ReproduceError(f"{run.name} {subset}: {len(ids)} hypotheses for {len(raw_refs)} references")
        detok = scoring.moses_detokenize(hyps, tgt)
        (eval_dir / f"{subset}.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        (eval_dir / f"{subset}.ref").write_text("\n".join(refs) + "\n", encoding="utf-8")
        (eval_dir / f"{subset}.detok.hyp").write_text("\n".join(detok) + "\n", encoding="utf-8")
        tok_bleu = scoring.tokenized_bleu(hyps, refs, lowercase=True)
        sacre = scoring.sacrebleu_detok(detok, raw_refs)
        results[subset] = {"name": release_name, "n_sentences": len(hyps), "bleu_tok_ci": tok_bleu["bleu"],
                           "sacrebleu": sacre["bleu"], "sacrebleu_signature": sacre["signature"],
                           "tokenized_bleu_details": tok_bleu, "detok_hyp_file": str(eval_dir / f"{subset}.detok.hyp"),
                           "generate_command": cmd}
        log(f"      {run.name} {release_name}: sacreBLEU {sacre['bleu']:.2f}, tokenized BLEU {tok_bleu['bleu']:.2f}")
    timing = json.loads((run / "timing.json").read_text()) if (run / "timing.json").is_file() else {}
    curve = valid_curve(run / "train.log")
    res = {"family": family, "seed": seed, "config": cfg["_path"], "name": cfg["name"], "arch": cfg["arch"],
           "params": model_params(run / "train.log"), "train_seconds": timing.get("train_seconds"),
           "updates": curve[-1][0] if curve else None, "averaged": averaged, "checkpoint": str(checkpoint),
           "valid_curve": curve, "test_sets": results}
    out_file.write_text(json.dumps(res, indent=1) + "\n")
    return res


# ---------------------------------------------------------------------------- significance

def paired_bootstrap(baseline_hyps, system_hyps, refs, n_samples=1000):
    """sacreBLEU's paired bootstrap (Koehn 2004) of ``system`` against ``baseline``: p-value, signature.

    Same as ``sacrebleu REF -i BASELINE SYSTEM --paired-bs`` (13a BLEU, 1000 resamples, seed
    SACREBLEU_SEED, default 12345).
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if not (len(baseline_hyps) == len(system_hyps) == len(refs)):
        raise ReproduceError(f"paired bootstrap: {len(baseline_hyps)} / {len(system_hyps)} hypotheses, {len(refs)} references")
    test = PairedTest([("baseline", list(baseline_hyps)), ("system", list(system_hyps))],
                      {"BLEU": BLEU()}, references=[list(refs)], test_type="bs", n_samples=n_samples)
    signatures, scores = test()
    (metric,) = [k for k in scores if k != "System"]
    base, system = scores[metric]
    return {"p_value": float(system.p_value), "baseline_bleu": round(base.score, 2), "system_bleu": round(system.score, 2),
            "system_mean": round(float(system.mean), 2), "system_ci95": round(float(system.ci), 2),
            "signature": str(signatures[metric])}


def add_significance(runs, data, tgt, n_samples):
    """Each non-baseline run gets, per test set, the paired bootstrap against the same seed's Transformer."""
    base = {r["seed"]: r for r in runs if r["family"] == BASELINE}
    for r in runs:
        if r["family"] == BASELINE:
            continue
        b = base.get(r["seed"])
        for subset, res in r["test_sets"].items():
            if b is None or subset not in b["test_sets"]:
                res["paired_bootstrap"] = None
                continue
            refs = (Path(data) / f"{subset}.raw.{tgt}").read_text(encoding="utf-8").splitlines()
            hyp = Path(res["detok_hyp_file"]).read_text(encoding="utf-8").splitlines()
            bl = Path(b["test_sets"][subset]["detok_hyp_file"]).read_text(encoding="utf-8").splitlines()
            res["paired_bootstrap"] = paired_bootstrap(bl, hyp, refs, n_samples)


# ----------------------------------------------------------------------------------- table

def mean_std(values):
    """(mean, sample standard deviation or None for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return mean, std


def _pm(values):
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f} (1 seed)"


def _params(n):
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def summarize(runs, families):
    """Per family and test set: mean/std of both BLEUs, delta to the Transformer, p-values."""
    summary = {}
    base = [r for r in runs if r["family"] == BASELINE]
    for fam in families:
        fr = sorted((r for r in runs if r["family"] == fam), key=lambda r: r["seed"])
        if not fr:
            continue
        entry = {"label": FAMILY_LABELS.get(fam, fam), "arch": fr[0]["arch"], "seeds": [r["seed"] for r in fr],
                 "params": fr[0]["params"], "train_minutes": [round(r["train_seconds"] / 60, 2) for r in fr
                                                              if r.get("train_seconds") is not None],
                 "updates": [r["updates"] for r in fr], "test_sets": {}}
        for subset in fr[0]["test_sets"]:
            sac = [r["test_sets"][subset]["sacrebleu"] for r in fr]
            tok = [r["test_sets"][subset]["bleu_tok_ci"] for r in fr]
            s = {"name": fr[0]["test_sets"][subset]["name"], "sacrebleu": sac, "bleu_tok_ci": tok,
                 "sacrebleu_mean_std": mean_std(sac), "bleu_tok_ci_mean_std": mean_std(tok)}
            bsac = [r["test_sets"][subset]["sacrebleu"] for r in base if subset in r["test_sets"]]
            s["delta_sacrebleu_vs_transformer"] = round(mean_std(sac)[0] - mean_std(bsac)[0], 2) if bsac else None
            if fam != BASELINE:
                s["p_values"] = [(r["test_sets"][subset].get("paired_bootstrap") or {}).get("p_value") for r in fr]
            entry["test_sets"][subset] = s
        summary[fam] = entry
    return summary


def to_markdown(summary, meta):
    lines = ["# Multi30k De→En: every family against the Transformer", "",
             f"- date: {meta['date']}; commit: `{meta['commit']}`; device: {meta['device']}",
             f"- seeds: {', '.join(map(str, meta['seeds']))}; data: `{meta['data']}` "
             f"(train/valid/test pairs: {meta['counts']}{'; NON-STANDARD splits' if meta['nonstandard'] else ''})",
             f"- configs: `configs/multi30k/` (same width class and training budget for every family); "
             f"extra fairseq options: `{' '.join(meta['fairseq_args']) or 'none'}`",
             f"- command: `{meta['command']}`", ""]
    for subset, release in meta["test_sets"].items():
        lines += [f"## {release}", "",
                  "| family | params | train min (mean) | sacreBLEU | Δ vs Transformer | tok. BLEU (ci) | "
                  "paired bootstrap p (per seed) | seeds p<0.05 |",
                  "|---|---|---|---|---|---|---|---|"]
        for fam, e in summary.items():
            s = e["test_sets"].get(subset)
            if s is None:
                continue
            minutes = f"{sum(e['train_minutes']) / len(e['train_minutes']):.1f}" if e["train_minutes"] else "–"
            delta = "–" if s["delta_sacrebleu_vs_transformer"] is None else f"{s['delta_sacrebleu_vs_transformer']:+.2f}"
            if fam == BASELINE:
                pcol, sig, delta = "baseline", "baseline", "0 (baseline)"
            else:
                ps = s.get("p_values") or []
                pcol = ", ".join("–" if p is None else f"{p:.3f}" for p in ps) or "–"
                known = [p for p in ps if p is not None]
                sig = f"{sum(p < 0.05 for p in known)}/{len(known)}" if known else "–"
            lines.append(f"| {e['label']} | {_params(e['params'])} | {minutes} | {_pm(s['sacrebleu'])} | {delta} | "
                         f"{_pm(s['bleu_tok_ci'])} | {pcol} | {sig} |")
        lines.append("")
    lines += ["sacreBLEU: detokenized hypotheses against the raw references, signature "
              f"`{meta['sacrebleu_signature']}`. Tokenized BLEU: case-insensitive multi-bleu formula on the "
              "Moses-tokenized text (BPE removed). Mean ± sample standard deviation over seeds. Paired bootstrap: "
              f"sacreBLEU's (`{meta['bootstrap_signature']}`), each run against the Transformer of the same "
              "seed on the same test set; p is the probability of the observed difference under no difference. "
              "Train minutes: wall time of fairseq-train including validation and checkpointing.", "",
              f"Validation loss of every run: `{meta['png']}`.", ""]
    return "\n".join(lines)


def plot_curves(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    colors = plt.get_cmap("tab10")
    styles = ["-", "--", ":", "-."]
    fams = [f for f in FAMILIES if any(r["family"] == f for r in runs)]
    fams += sorted({r["family"] for r in runs} - set(fams))
    for i, fam in enumerate(fams):
        for r in sorted((r for r in runs if r["family"] == fam), key=lambda r: r["seed"]):
            if not r["valid_curve"]:
                continue
            x, y = zip(*r["valid_curve"])
            ax.plot(x, y, styles[(r["seed"] - 1) % len(styles)], color=colors(i % 10), marker="." if len(x) < 30 else None,
                    label=f"{FAMILY_LABELS.get(fam, fam)} seed {r['seed']}")
    ax.set_xlabel("updates")
    ax.set_ylabel("validation loss (label-smoothed CE, base 2)")
    ax.set_title("Multi30k De→En: validation loss of every run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    tmp = Path(str(path) + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


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

def main(argv=None):
    p = argparse.ArgumentParser(
        prog="scripts/reproduce.sh",
        description="Train every family and the Transformer on Multi30k for several seeds, average, decode, "
                    "score (sacreBLEU + tokenized BLEU), paired bootstrap against the Transformer, table + PNG.")
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--seeds", type=int, default=3, help="seeds 1..N per family (default 3)")
    p.add_argument("--families", default=",".join(FAMILIES),
                   help=f"comma-separated subset of {','.join(FAMILIES)} (the Transformer is always run: "
                        "it is the baseline of the significance test)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when visible, else cpu")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp16", help="GPU precision (CPU: fp32)")
    p.add_argument("--data", default=None, help="binarized data (default data-bin/multi30k.de-en)")
    p.add_argument("--runs-dir", default=None, help="default runs/multi30k")
    p.add_argument("--results-dir", default=str(REPO / "results"))
    p.add_argument("--avg-last", type=int, default=None, help="override eval.avg_last (epoch checkpoints averaged)")
    p.add_argument("--batch-size", type=int, default=128, help="fairseq-generate sentences per batch")
    p.add_argument("--bootstrap-samples", type=int, default=1000)
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
    if args.device is None:
        from .launch import visible_gpus

        args.device = "cuda" if visible_gpus() > 0 else "cpu"
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        p.error(f"unknown families {unknown}; choose from {FAMILIES}")
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
        runs = []
        for seed in range(1, args.seeds + 1):
            for fam in families:
                run = args.runs_dir / f"{fam}-seed{seed}"
                train_run(cfgs[fam], run, seed, args)
                runs.append(evaluate_run(cfgs[fam], run, seed, fam, manifest["test_sets"], args))
        log("paired bootstrap against the Transformer of the same seed")
        add_significance(runs, args.data, manifest["target_lang"], args.bootstrap_samples)
        summary = summarize(runs, families)
        png = results_dir / f"{args.experiment}-valid-loss.png"
        plot_curves(runs, png)
        first = next(iter(runs[0]["test_sets"].values()))
        boot = next((s["paired_bootstrap"]["signature"] for r in runs for s in r["test_sets"].values()
                     if s.get("paired_bootstrap")), "–")
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "commit": git_commit(), "device": device_name(args.device), "seeds": list(range(1, args.seeds + 1)),
                "data": str(args.data), "counts": "/".join(str(manifest["counts"].get(k)) for k in ("train", "valid", "test")),
                "nonstandard": manifest.get("nonstandard", False), "fairseq_args": args.fairseq_args,
                "command": "scripts/reproduce.sh " + " ".join(argv + (["--"] + fairseq_args if fairseq_args else [])),
                "test_sets": manifest["test_sets"], "sacrebleu_signature": first["sacrebleu_signature"],
                "bootstrap_signature": boot, "png": str(png)}
        (results_dir / f"{args.experiment}.md").write_text(to_markdown(summary, meta))
        (results_dir / f"{args.experiment}.json").write_text(
            json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1) + "\n")
        log(f"wrote {results_dir / (args.experiment + '.md')}, .json and {png.name}")
        print((results_dir / f"{args.experiment}.md").read_text())
    except ReproduceError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
