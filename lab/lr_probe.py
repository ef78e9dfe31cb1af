"""Learning-rate stability probe (``python -m lab.lr_probe CONFIG``).

Trains a recipe config's model with its optimiser and its *peak* learning rate, reached after a
short warm-up, for a few hundred updates on real text, and reports whether the loss falls and the
gradient norm stays finite, with a loss-curve PNG. It answers one question cheaply: does this
model train, or diverge, at the paper's learning rate? It is not a reproduction run.

What differs from the config (and why):

* ``--warmup-updates`` (default 40 instead of 8000) so the peak lr is reached within the probe;
  the inverse-sqrt schedule then decays it as in the real run (``lr * sqrt(warmup / step)``).
  Reaching the peak on a barely trained model is harsher than the real schedule.
* ``--max-tokens`` (default 1536) and ``--update-freq 1``: on CPU a small batch keeps a probe to
  minutes; a batch 10-100x smaller than the paper's is noisier, so a probe that trains here is
  a conservative sign. ``--paper-batch`` keeps the config's batch (for a GPU).
* ``--disable-validation --no-save``: nothing but the training curve is needed.
* ``--norm pre|post|config``: force pre-norm (the authors' MAN code) or post-norm (fairseq's
  default) to compare the two at the same learning rate.
* ``--time-limit MINUTES``: on a slow, shared CPU, stop after a wall-clock budget and judge the
  updates logged so far (the report and probe.json say so).

The verdict: *trains* when the run finishes, every logged gnorm and loss is finite, the mean loss
of the last logged window is at least ``--min-drop`` below the first window's, and it has not
climbed back more than 1 above the lowest window (a late blow-up). Otherwise *diverges* (non-finite
values, fairseq stopping on NaN/Inf gradients, or the loss rising) or *stalls* (finite, but not
falling). Any other failure of fairseq-train (a missing ``--data`` folder, a bad option, a crash) is
no verdict: it is reported as an error with the end of fairseq's log, exit code 2.

The output folder (``--out``) may be a user's: the probe writes only its own entries there
(:data:`OUTPUTS`, recorded in the folder's :data:`~man_recipes.workdir.MARKER`) and
replaces one it did not write, or an existing ``--png``, only with ``--overwrite``. Both are
checked before anything is binarized or trained.
"""

import argparse
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from man_recipes.config import REPO, ConfigError, load_config
from lab.bounds import MAX_SECONDS, MAX_UPDATES, batch_tokens, updates
from man_recipes.options import number
from man_recipes.training.launch import split_fairseq_args, train_args
from man_recipes.tools import tool_env
from man_recipes.workdir import MARKER, created
from man_recipes.logging_setup import quiet_logging
from man_recipes.interrupt import child_process, one_line_on_ctrl_c, run_child

DEFAULT_TEXT = REPO.parent / "shared" / "data" / "iwslt14-sample" / "valid"
WINDOW = 3  # logged points averaged at the start / end of the curve
TAIL_LINES = 15  # lines of fairseq's log shown with an error
OUTPUTS = ("train.log", "probe.json", "loss.png", "checkpoints", "data-bin")  # what a probe writes in --out


class ProbeError(Exception):
    """A user's mistake (a path, an option): one line ``ERROR: ...``, exit status 2."""


def check_out(out, overwrite, analyse=False):
    """Refuse, before any work, an ``--out`` that is not a folder or that holds entries a probe
    would write but did not (no mention in its marker), unless ``overwrite``. ``analyse`` reads
    train.log and rewrites only probe.json and loss.png."""
    if out.exists() and not out.is_dir():
        raise ProbeError(f"--out {out} exists and is not a folder")
    marker = out / MARKER
    ours = set(marker.read_text().split()) if marker.is_file() else set()
    written = ("probe.json", "loss.png") if analyse else OUTPUTS
    clash = [name for name in written if (out / name).exists() and name not in ours]
    if clash and not overwrite:
        raise ProbeError(f"--out {out} holds {', '.join(clash)}, not written there by an lr probe; "
                         "choose another folder or pass --overwrite to replace them")


def mark(out, *names):
    """Record in ``out``'s marker that the probe writes these entries (before writing them)."""
    (out / MARKER).touch()
    created(out, *names)


def binarize(text_prefix, src, tgt, dest):
    """fairseq-preprocess ``text_prefix.{src,tgt}`` as the train split with a joined dictionary into
    ``dest`` (the probe's own folder), reused while it was made from the same text."""
    dest = Path(dest)
    stamp = dest / ".text"  # which text (and version of it) the binaries are of
    texts = [Path(f"{text_prefix}.{lang}").resolve() for lang in (src, tgt)]
    source = "".join(f"{t} {t.stat().st_size} {t.stat().st_mtime_ns}\n" for t in texts)
    if stamp.is_file() and stamp.read_text() == source and (dest / f"train.{src}-{tgt}.{src}.bin").is_file():
        return dest
    # the probe's own (see check_out), or replaced with --overwrite
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    cmd = ["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt, "--trainpref",
           str(text_prefix), "--destdir", str(dest), "--joined-dictionary", "--workers", "1"]
    print("+ " + " ".join(cmd), flush=True)
    proc = run_child(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=tool_env())
    if proc.returncode != 0:
        raise ProbeError(f"fairseq-preprocess failed on --text {text_prefix} (exit {proc.returncode}): "
                         + (proc.stdout.strip().splitlines() or [""])[-1])
    stamp.write_text(source)
    return dest


def probe_config(cfg, norm):
    """The config with pre- or post-norm forced in both encoder and decoder (``norm='config'``: as is)."""
    cfg = dict(cfg)
    model = dict(cfg.get("model") or {})
    if norm in ("pre", "post"):
        for side in ("encoder", "decoder"):
            model[f"{side}-normalize-before"] = norm == "pre"
        if str(cfg.get("arch", "")).startswith("transformer_man"):
            model["man-norm"] = norm  # the MAN translation archs are pre-norm without the flags
    cfg["model"] = model
    return cfg


def probe_args(cfg, data, save_dir, updates, warmup, max_tokens, device, log_interval, lr=None, extra=()):
    """fairseq-train argv for the probe (the config's command with the probe's overrides last)."""
    passthrough = [str(e) for e in extra]
    extra = ["--max-update", updates, "--warmup-updates", warmup, "--update-freq", 1,
             "--log-format", "json", "--log-interval", log_interval,
             "--disable-validation", "--no-save", "--num-workers", 0]
    if max_tokens:
        extra += ["--max-tokens", max_tokens]
    if lr is not None:
        extra += ["--lr", lr]
    # fp32 on GPU too: the probe tests the optimiser at the peak lr, not fp16 loss scaling
    return train_args(cfg, save_dir, world_size=1, device="cpu" if device == "cpu" else "gpu",
                      precision="fp32", data=data, extra=[str(e) for e in extra] + list(passthrough))


def parse_log(lines):
    """The ``train_inner`` JSON records of a fairseq-train log (``--log-format json``)."""
    records = []
    for line in lines:
        if "train_inner" not in line or "{" not in line:
            continue
        try:
            rec = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        records.append({key: float(rec[key]) for key in ("num_updates", "loss", "gnorm", "lr")
                        if key in rec})
    return records


def verdict(records, completed, min_drop):
    """('trains' | 'diverges' | 'stalls', reason) for the logged curve."""
    if not records:
        return "diverges", "no training record was logged"
    nonfinite = [r for r in records if not (math.isfinite(r["loss"]) and math.isfinite(r["gnorm"]))]
    if nonfinite:
        return "diverges", f"non-finite loss/gnorm at update {int(nonfinite[0]['num_updates'])}"
    if not completed:
        return "diverges", "fairseq-train stopped on non-finite gradients (FloatingPointError in the log)"
    losses = [r["loss"] for r in records]
    w = min(WINDOW, max(1, len(losses) // 3))
    first = sum(losses[:w]) / w
    last = sum(losses[-w:]) / w
    lowest = min(sum(losses[i:i + w]) / w for i in range(len(losses) - w + 1))
    if last > lowest + 1.0:
        return "diverges", f"loss climbed back from {lowest:.2f} to {last:.2f}"
    if first - last < min_drop:
        return "stalls", f"loss {first:.2f} -> {last:.2f}, less than {min_drop} lower"
    return "trains", f"loss {first:.2f} -> {last:.2f}, gnorm finite (max {max(r['gnorm'] for r in records):.2f})"


def plot(runs, png, title):
    """One loss curve (and gnorm) per probe run in ``runs`` = [(label, records)]."""
    from man_recipes.logging_setup import pyplot

    plt = pyplot()
    fig, (ax_loss, ax_gnorm) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, records in runs:
        steps = [r["num_updates"] for r in records]
        ax_loss.plot(steps, [r["loss"] for r in records], marker=".", label=label)
        ax_gnorm.plot(steps, [r["gnorm"] for r in records], marker=".", label=label)
    ax_loss.set_xlabel("update")
    ax_loss.set_ylabel("train loss (label-smoothed, bits)")
    ax_gnorm.set_xlabel("update")
    ax_gnorm.set_ylabel("gradient norm (before clipping)")
    ax_gnorm.set_yscale("log")
    for ax in (ax_loss, ax_gnorm):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _stopped_on_nonfinite(lines):
    """fairseq's own report of NaN/Inf gradients (or fp16 loss scale underflow): a divergence."""
    return any("FloatingPointError" in line for line in lines)


def training_error(lines, records, rc, time_limited, updates):
    """Why this fairseq-train run cannot be judged (a failure that is not divergence), or None."""
    if _stopped_on_nonfinite(lines) or any(not (math.isfinite(r["loss"]) and math.isfinite(r["gnorm"]))
                                           for r in records):
        return None  # divergence: the verdict says so
    crashed = any("Traceback (most recent call last)" in line for line in lines)
    if time_limited:
        # stopped by --time-limit (rc is the kill signal's): judge what it logged unless it crashed
        if crashed:
            return "fairseq-train crashed"
    elif rc not in (0, None):
        return f"fairseq-train failed with exit code {rc}"
    elif records and records[-1]["num_updates"] < updates:
        return f"fairseq-train stopped at update {int(records[-1]['num_updates'])} of {updates} without an error"
    if not records:
        return "no training record was logged (is --log-interval larger than --updates?)"
    return None


def log_tail(lines, n=TAIL_LINES):
    """The last ``n`` non-blank lines of a log (where fairseq's error is)."""
    return "".join([line if line.endswith("\n") else line + "\n" for line in lines if line.strip()][-n:])


def finish(args, cfg, out, lines, rc, wall, time_limited, cmd):
    """Verdict, probe.json and loss.png from the fairseq-train log lines of one probe.

    Returns 0 (trains), 1 (diverges or stalls) or 2 (an error: no verdict, nothing plotted).
    """
    records = parse_log(lines)
    error = training_error(lines, records, rc, time_limited, args.updates)
    if error:
        label, reason = "error", error
    else:
        label, reason = verdict(records, not _stopped_on_nonfinite(lines), args.min_drop)
    peak = float(cfg["train"]["lr"] if args.lr is None else args.lr)
    max_tokens = None if args.paper_batch else args.max_tokens
    result = {
        "config": cfg["name"], "norm": args.norm, "device": args.device, "peak_lr": peak,
        "warmup_updates": args.warmup, "updates": args.updates,
        "updates_logged": int(records[-1]["num_updates"]) if records else 0,
        "time_limited": time_limited, "max_tokens": max_tokens or int(cfg["train"]["max-tokens"]),
        "exit_code": rc, "verdict": label, "reason": reason, "wall_seconds": round(wall, 1),
        "records": records, "command": cmd,
    }
    mark(out, "probe.json", "loss.png")
    (out / "probe.json").write_text(json.dumps(result, indent=2) + "\n")
    if error:
        print(f"lr_probe: ERROR - {error}; this is not a verdict on {cfg['name']}. "
              f"The end of fairseq's log ({out / 'train.log'}):\n{log_tail(lines)}", file=sys.stderr, flush=True)
        return 2
    try:
        plot([(f"{cfg['name']} {args.norm}-norm: {label}", records)], out / "loss.png",
             f"lr probe: {cfg['arch']}, peak lr {peak:g} after {args.warmup} warm-up updates, "
             f"{result['max_tokens']} tokens/batch")
    except ImportError:
        print("matplotlib is not installed: no loss.png (probe.json has the curve)", file=sys.stderr)
    stop = f", stopped by the time limit at update {result['updates_logged']}" if time_limited else ""
    print(f"{cfg['name']} ({args.norm}-norm, peak lr {peak:g}): {label.upper()} - {reason}; "
          f"{wall:.0f}s{stop}; {out}", flush=True)
    return 0 if label == "trains" else 1


def run_probe(args):
    cfg = probe_config(load_config(args.config), args.norm)
    out = Path(args.out or REPO / "runs" / "lr-probe" / f"{cfg['name']}-{args.norm}").resolve()
    check_out(out, args.overwrite, args.analyse)
    if args.analyse:
        # judge an earlier probe's log again (e.g. one stopped by hand on a slow machine)
        log = out / "train.log"
        if not log.is_file():
            raise ProbeError(f"--analyse: no {log} to analyse")
        prev = json.loads((out / "probe.json").read_text()) if (out / "probe.json").is_file() else {}
        # the earlier run's settings; a log without probe.json was stopped by hand: judge what it logged
        args.updates = prev.get("updates", args.updates)
        args.warmup = prev.get("warmup_updates", args.warmup)
        return finish(args, cfg, out, log.read_text().splitlines(True), prev.get("exit_code"),
                      prev.get("wall_seconds", 0.0), prev.get("time_limited", True), prev.get("command", []))
    src, tgt = cfg.get("source_lang") or "de", cfg.get("target_lang") or "en"
    if args.data and not Path(args.data).is_dir():  # fairseq-train would fail on it, after the output is marked
        raise ProbeError(f"--data {args.data}: no such folder (a binarized data-bin)")
    for lang in () if args.data else (src, tgt):
        if not Path(f"{args.text}.{lang}").is_file():
            raise ProbeError(f"--text: {args.text}.{lang} not found (pass --text PREFIX or --data DATA_BIN)")
    out.mkdir(parents=True, exist_ok=True)
    mark(out, "train.log", "checkpoints", "data-bin")
    data = args.data or binarize(args.text, src, tgt, out / "data-bin")
    max_tokens = None if args.paper_batch else args.max_tokens
    argv = probe_args(cfg, data, out / "checkpoints", args.updates, args.warmup, max_tokens,
                      args.device, args.log_interval, args.lr, args.fairseq_extra)
    cmd = ["fairseq-train"] + argv
    print("+ " + " ".join(cmd), flush=True)
    env = tool_env()
    start = time.time()
    lines = []
    timer = None
    limited = threading.Event()
    try:
        with open(out / "train.log", "w") as log, \
                child_process(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              bufsize=1) as proc:
            if args.time_limit:
                def stop():
                    limited.set()
                    proc.terminate()

                timer = threading.Timer(args.time_limit * 60, stop)
                timer.start()
            for line in proc.stdout:
                lines.append(line)
                log.write(line)
                log.flush()
                if "train_inner" in line:  # progress: one line per logged window
                    rec = parse_log([line])
                    if rec:
                        r = rec[0]
                        print(f"update {int(r['num_updates'])}: loss {r['loss']:.3f} gnorm {r['gnorm']:.3f} "
                              f"lr {r['lr']:.2e} ({time.time() - start:.0f}s)", flush=True)
            rc = proc.wait()
    finally:
        if timer is not None:  # a Ctrl-C must not wait for it
            timer.cancel()
    return finish(args, cfg, out, lines, rc, time.time() - start, limited.is_set(), cmd)


def plot_only(args):
    if Path(args.png).exists() and not args.overwrite:
        raise ProbeError(f"--png {args.png} exists; pass --overwrite to replace it, or choose a new file")
    runs = []
    for path in args.plot:
        res = json.loads(Path(path).read_text())
        runs.append((f"{res['config']} {res['norm']}-norm: {res['verdict']}", res["records"]))
    plot(runs, args.png, args.title)
    print(args.png)
    return 0


@one_line_on_ctrl_c("python -m lab.lr_probe")
def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(prog="python -m lab.lr_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", help="configs/<row>.yaml (or a row name)")
    p.add_argument("--norm", choices=["pre", "post", "config"], default="config",
                   help="force pre-/post-norm in encoder and decoder (default: as the config says)")
    p.add_argument("--updates", type=updates("--updates"), default=300)
    p.add_argument("--warmup", type=number("--warmup", low=0, high=MAX_UPDATES, ceiling="the ceiling of a measurement's "
                                           "training run"), default=40, help="warm-up updates to the peak lr")
    p.add_argument("--max-tokens", type=batch_tokens("--max-tokens"), default=1536, help="tokens per batch (one process)")
    p.add_argument("--paper-batch", action="store_true", help="keep the config's max-tokens")
    p.add_argument("--lr", type=number("--lr", low=0, low_open=True, integer=False), default=None, help="peak lr (default: the config's)")
    p.add_argument("--min-drop", type=number("--min-drop", integer=False), default=1.0,
                   help="how much the loss (bits) must fall, first window to last, to count as training")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--log-interval", type=updates("--log-interval"), default=10)
    p.add_argument("--time-limit", type=number("--time-limit", low=0, low_open=True, integer=False, high=MAX_SECONDS // 60,
                                               ceiling="a day"), default=None, metavar="MINUTES",
                   help="stop training after this many minutes and judge the updates logged so far "
                        "(for a slow, shared CPU); the report says where it stopped")
    p.add_argument("--analyse", action="store_true",
                   help="judge the existing train.log of this probe's output folder again (no training)")
    p.add_argument("--text", default=str(DEFAULT_TEXT),
                   help="BPE'd parallel text prefix (PREFIX.<src>, PREFIX.<tgt>); binarized once into "
                        "--out/data-bin")
    p.add_argument("--data", default=None, help="an existing binarized directory (skips --text)")
    p.add_argument("--out", default=None, help="default: runs/lr-probe/<row>-<norm>")
    p.add_argument("--plot", nargs="+", default=None, metavar="PROBE_JSON",
                   help="only draw the curves of finished probes (probe.json files) into --png")
    p.add_argument("--png", default="lr-probe.png")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files in --out that a probe did not write there, or an existing --png")
    p.add_argument("--title", default="lr probe")
    p.epilog = "Options after '--' go to fairseq-train last (e.g. a smaller model for a smoke test)."
    argv, fairseq_extra = split_fairseq_args(argv)
    args = p.parse_args(argv)
    args.fairseq_extra = fairseq_extra
    if not args.plot and not args.config:
        p.error("a config is required (or --plot)")
    try:
        return plot_only(args) if args.plot else run_probe(args)
    except (ProbeError, ConfigError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
