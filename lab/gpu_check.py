"""``make gpu-check``: check this checkout on a user's GPU and write one Markdown report.

Three checks, each with its own log in the output folder:

1. ``pytest tests/gpu``: every backend against the explicit path (fp32 with TF32 off, fp16, bf16),
   flex recompiles, ``fairseq-train --fp16/--bf16`` and ``fairseq-generate`` per family, n-gram
   blocking on CUDA (fairseq's kernel where built, else the fixed fallback) against the CPU rule;
2. a short benchmark of every family's paper config against the Transformer's (``scripts/speed.sh
   synthetic``, base width, backends auto and flex) in the recipes' precision (``--fp16`` by default: the
   whole model cast, as fairseq does);
3. if ``data-bin/multi30k.de-en`` exists, a few hundred ``fairseq-train --bf16`` updates of every
   config of the Multi30k CPU study (``configs/multi30k-cpu/``); the training loss must be finite
   and fall.

The report (``gpu-check.md``) lists the device, driver, torch / CUDA / cuDNN versions, the commit,
pass / fail per check and the speed ratios. Without CUDA it says so and exits 2; ``--cpu-dry-run``
runs what a CPU can (the environment, ``pytest tests/gpu``, which then skips) and writes the report.
"""

import argparse
import datetime
import math
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from lab.bounds import MAX_SECONDS, updates
from lab.speed import records as speed_records
from man_recipes.logging_setup import quiet_logging
from man_recipes.provenance import git_commit
from man_recipes.tables import markdown_table
from man_recipes.training import fairseq_log
from man_recipes.config import CONFIG_DIR, REPO, load_config
from man_recipes.training.launch import train_args
from man_recipes.interrupt import one_line_on_ctrl_c, run_child
from man_recipes.options import number

PASS, FAIL, SKIPPED = "pass", "FAIL", "skipped"
MULTI30K_DATA = REPO / "data-bin" / "multi30k.de-en"
# the Multi30k CPU preset's model size, every family alike
# every paper family at base width (scripts/speed.sh synthetic), one repeat, one batch of 4096 tokens an update
BENCHMARK_ARGS = ["--device", "cuda", "--width", "base", "--backend", "auto,flex", "--threads", "1", "--repeats", "1",
                  "--updates", "30", "--log-interval", "10", "--decode-sentences", "64"]
BENCHMARK_FAIRSEQ_ARGS = ["--update-freq", "1", "--max-tokens", "4096"]  # after '--': over every config
NO_CUDA = ("no CUDA device: torch.cuda.is_available() is False (torch {torch}, built for CUDA {cuda}). "
           "make gpu-check needs a GPU; --cpu-dry-run checks only the report on this machine.")


@dataclass
class Check:
    name: str
    status: str
    summary: str
    details: List[str] = field(default_factory=list)  # Markdown lines


def command_output(cmd, cwd=REPO) -> Optional[str]:
    try:
        out = run_child(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> Dict[str, str]:
    import fairseq
    import torch

    cuda = torch.cuda.is_available()
    commit = git_commit(full=True)
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "device": ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) if cuda
        else "no CUDA device",
        "driver": command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) or "unknown",
        "torch": torch.__version__,
        "CUDA (torch build)": str(torch.version.cuda),
        "cuDNN": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "none",
        "bf16 supported": str(cuda and torch.cuda.is_bf16_supported()),
        "fairseq": fairseq.__version__,
        "Python": platform.python_version(),
    }
    if cuda:
        major, minor = torch.cuda.get_device_capability(0)
        env["compute capability"] = f"{major}.{minor}"
    return env


def run_logged(cmd, log_path: Path, timeout: float) -> int:
    """Run ``cmd`` from the repository with its output in ``log_path``; the exit code (124: timeout)."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(map(str, cmd)) + "\n")
        log.flush()
        try:
            return run_child(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\ntimed out after {timeout:.0f}s\n")
            return 124


def parse_junit(path: Path) -> List[Dict[str, str]]:
    """pytest's --junitxml: one {id, outcome, message} per test (passed/failed/error/skipped)."""
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "").splitlines()[0][:300] if child.get("message") else ""
                break
        results.append({"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "message": message})
    return results


def pytest_check(results: List[Dict[str, str]], returncode: int, log_name: str) -> Check:
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("passed", "failed", "error", "skipped")}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no tests ran"
    bad = [r for r in results if r["outcome"] in ("failed", "error")]
    # pytest's exit code 5 is "no tests collected"; any other non-zero one with no failed test is
    # a crash (an internal error, a timeout) and fails the check too
    if bad or returncode not in (0, 5):
        status = FAIL
    elif counts["passed"]:
        status = PASS
    else:
        status = SKIPPED
    details = [f"- `{r['id']}` **{r['outcome']}**: {r['message']}" for r in bad]
    skipped = sorted({r["message"] for r in results if r["outcome"] == "skipped"})
    if skipped:
        details.append(f"- skip reasons: {'; '.join(skipped)}")
    if status == FAIL and not bad:
        details.append(f"- pytest exited with {returncode} (see `{log_name}`)")
    return Check("pytest tests/gpu", status, summary + f" (log: `{log_name}`)", details)


def run_tests(out: Path, timeout: float) -> Check:
    xml = out / "pytest-gpu.xml"
    code = run_logged([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/gpu",
                       f"--junitxml={xml}"], out / "pytest-gpu.log", timeout)
    results = parse_junit(xml) if xml.exists() else []
    return pytest_check(results, code, "pytest-gpu.log")


def benchmark_check(recs: List[dict], table: str, returncode: int, precision: str, error: str = "") -> Check:
    """Ratios of every family to the Transformer of its record (one per backend), from the synthetic mode's
    records; ``error``: the mode's own line on what failed."""
    def ratio(s):
        return f"{s['median']:.3f}×" if s else "—"

    rows = [[row["family"], rec.get("synthetic", {}).get("backend", "?")]
            + [ratio(row[q + "_ratio"]) for q in ("train", "memory", "decode")]
            for rec in recs for row in speed_records.summarize(rec)[1:]]
    ok = returncode == 0 and bool(rows)
    summary = (f"{precision} (whole model cast, as fairseq-train --{precision}); "
               + ("every model trained and decoded" if ok else f"exit code {returncode}"
                  + ("" if rows else ", no record")))
    details = markdown_table(["family", "backend", "train words/s ratio", "peak memory ratio",
                              "decode sent/s ratio"], rows, "llrrr") + ([f"- {error}"] if error else [])
    if table:
        details += ["", "<details><summary>the benchmark's full table</summary>", "", table.strip(), "", "</details>"]
    return Check("benchmark against fairseq's transformer", PASS if ok else FAIL, summary, details)


def run_benchmark(out: Path, precision: str, timeout: float) -> Check:
    log = out / "benchmark.log"
    code = run_logged([sys.executable, "-m", "lab.speed", "synthetic", *BENCHMARK_ARGS, "--precision", precision,
                       "--results-dir", out, "--", *BENCHMARK_FAIRSEQ_ARGS], log, timeout)
    folder = out / "speed" / "synthetic"
    recs = [speed_records.read_record(p) for p in sorted(folder.glob("*.json"))]
    tables = "\n".join(p.read_text() for p in sorted(folder.glob("*.md")))
    said = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("ERROR: ")]
    return benchmark_check(recs, tables, code, precision, said[-1] if said else "")


def training_row(family: str, log_text: str, returncode: int, seconds: float, updates: int) -> Dict[str, object]:
    """One family's short training run judged: finite losses that fell, all updates done."""
    inner = fairseq_log.train_inner_losses(log_text)
    valid = fairseq_log.valid_losses(log_text)
    finite = bool(inner) and all(math.isfinite(x) for x in inner + valid)
    fell = finite and len(inner) >= 2 and inner[-1] < inner[0]
    problems = []
    if returncode != 0:
        problems.append(f"exit code {returncode}")
    if not inner:
        problems.append("no training loss logged")
    elif not finite:
        problems.append("non-finite loss")
    elif not fell:
        problems.append("training loss did not fall")
    return {"family": family, "ok": not problems, "problems": problems, "first": inner[0] if inner else None,
            "last": inner[-1] if inner else None, "valid": valid[-1] if valid else None,
            "seconds": seconds, "updates_per_s": updates / seconds if seconds > 0 and returncode == 0 else None}


def training_check(rows: List[Dict[str, object]], updates: int) -> Check:
    def num(x, fmt):
        return "—" if x is None else format(x, fmt)

    lines = markdown_table(
        ["config", "result", "first → last train loss", "last valid loss", "updates/s (wall, incl. start-up)"],
        [[r["family"], "ok" if r["ok"] else "**" + "; ".join(r["problems"]) + "**",
          f"{num(r['first'], '.3f')} → {num(r['last'], '.3f')}", num(r["valid"], ".3f"), num(r["updates_per_s"], ".2f")]
         for r in rows], "lllrr")
    ok = bool(rows) and all(r["ok"] for r in rows)
    summary = (f"{updates} `--bf16` updates per configs/multi30k-cpu config (d=256, 3+3 layers, pre-norm): "
               + ("losses finite and falling" if ok else "failures below"))
    return Check("Multi30k --bf16 training", PASS if ok else FAIL, summary, lines)


def run_training(out: Path, updates: int, timeout: float) -> Check:
    if not MULTI30K_DATA.is_dir():
        return Check("Multi30k --bf16 training", SKIPPED,
                     f"`{MULTI30K_DATA.relative_to(REPO)}` not found (data-prep/prepare-multi30k.sh makes it)")
    rows = []
    for path in sorted((CONFIG_DIR / "multi30k-cpu").glob("*.yaml")):
        cfg = load_config(path)
        family = path.stem
        extra = ["--max-update", str(updates), "--log-interval", "25", "--no-save"]
        cmd = [sys.executable, "-m", "fairseq_cli.train"] + train_args(cfg, out / f"train-{family}", device="gpu", precision="bf16",
                                             extra=extra)
        start = time.time()
        code = run_logged(cmd, out / f"train-{family}.log", timeout)
        rows.append(training_row(family, (out / f"train-{family}.log").read_text(errors="replace"), code,
                                 time.time() - start, updates))
    return training_check(rows, updates)


def render(env: Dict[str, str], checks: List[Check], note: str = "") -> str:
    overall = FAIL if any(c.status == FAIL for c in checks) else PASS
    lines = [f"# man-fairseq GPU check: {overall}", ""]
    if note:
        lines += [note, ""]
    lines += markdown_table([None, None], [[k, f"{v}"] for k, v in env.items()]) + [""]
    lines += markdown_table(["check", "result", "summary"], [[c.name, c.status, c.summary] for c in checks]) + [""]
    for c in checks:
        if c.details:
            lines += [f"## {c.name}", ""] + c.details + [""]
    return "\n".join(lines)


@one_line_on_ctrl_c("python -m lab.gpu_check")
def main(argv=None) -> int:
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(prog="python -m lab.gpu_check", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="output folder (default gpu-check-<UTC date-time>; must not exist)")
    p.add_argument("--precision", choices=["fp16", "bf16"], default="fp16",
                   help="the benchmark's precision (the recipes train --fp16 by default)")
    p.add_argument("--updates", type=updates("--updates"), default=300, help="Multi30k --bf16 updates per config")
    p.add_argument("--skip", default="", help="comma-separated checks not to run: tests, benchmark, training")
    p.add_argument("--timeout", type=number("--timeout", low=0, low_open=True, integer=False, high=MAX_SECONDS,
                                            ceiling="a day"), default=7200,
                   help="seconds per command (pytest tests/gpu compiles flex kernels; its GPU run time is unmeasured)")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="without a GPU: the environment and pytest tests/gpu (which skips), then the report")
    args = p.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = skip - {"tests", "benchmark", "training"}
    if unknown:
        p.error(f"--skip: unknown {sorted(unknown)}")
    if args.updates < 2:
        p.error("--updates must be at least 2 (the loss must be seen to fall)")

    import torch

    if not torch.cuda.is_available() and not args.cpu_dry_run:
        print(NO_CUDA.format(torch=torch.__version__, cuda=torch.version.cuda), file=sys.stderr)
        return 2
    out = Path(args.out or f"gpu-check-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}")
    if out.exists():
        p.error(f"--out {out} exists; give a new folder (nothing is overwritten)")
    out.mkdir(parents=True)
    out = out.resolve()

    checks, note = [], ""
    if args.cpu_dry_run:
        note = ("**CPU dry run: no GPU was used.** Only the environment and the collection of "
                "`tests/gpu` are real; the benchmark and the training were not run.")
    if "tests" not in skip:
        checks.append(run_tests(out, args.timeout))
    if "benchmark" not in skip:
        checks.append(Check("benchmark against fairseq's transformer", SKIPPED, "CPU dry run") if args.cpu_dry_run
                      else run_benchmark(out, args.precision, args.timeout))
    if "training" not in skip:
        checks.append(Check("Multi30k --bf16 training", SKIPPED, "CPU dry run") if args.cpu_dry_run
                      else run_training(out, args.updates, args.timeout))
    report = render(environment(), checks, note)
    (out / "gpu-check.md").write_text(report)
    print(report)
    print(f"report: {out / 'gpu-check.md'} (attach it, and the logs next to it, to a bug report)", file=sys.stderr)
    return 1 if any(c.status == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
