"""The benchmark's Markdown report: header (machine, versions, method) and the ratio table."""

import datetime
import os
import platform
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from man_fairseq.provenance import cpu_model
from lab.speed.cases import BASELINE_ARCH, CALIBRATED_CRITERION, LS_CRITERION, Case, baseline_key, case_key
from man_fairseq.tables import markdown_table

PRECISION = {
    "fp32": "fp32",
    "fp16": "fp16 (whole model cast and fp32 master weights with loss scaling, as fairseq-train --fp16)",
    "bf16": "bf16 (whole model cast and fp32 master weights, as fairseq-train --bf16)",
}
COLUMNS = ["case", "model", "backend", "params", "train tok/s", "ratio", "peak train mem", "ratio", "decode sent/s",
           "ratio", "target", "met", "kernels (train / decode)", "compiled graphs"]
ALIGN = "lllrrrrrrrlllr"

Run = Tuple[Case, str, str, str]  # (case, width, arch, backend)


@dataclass
class Settings:
    """What every measurement ran with, the device's defaults resolved: the workers' spec and the report's header."""
    device: str
    dtype: str
    backend: str  # --backend as given (the report's title)
    backends: List[str]
    widths: List[str]
    threads: int
    seed: int
    clock: str
    dict_size: Optional[int]  # None: the width's own (DEFAULT_DICT_SIZE)
    iters: int
    warmup: int
    max_tokens: int
    len_mean: float
    len_std: float
    len_max: int
    beam: int
    decode_sentences: int
    decode_len: int
    decode_iters: int
    decode_warmup: int
    memory_iters: int
    model_args: str  # --model-args as given (the report quotes it)
    model_options: List[str]  # the same, split into fairseq options
    defaults_used: List[str]  # the device's defaults taken, as the report lists them


@dataclass
class ReportInput:
    """The settings and what the runs gave: everything ``render`` puts in the report."""
    settings: Settings
    runs: List[Run]
    results: Dict[str, dict]  # by baseline_key / case_key
    skipped: List[str]
    load_before: Tuple[float, float, float]  # os.getloadavg() before the first worker
    elapsed: float  # seconds
    commit: str


def fmt_ratio(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.3f}×"


def mib(x: Optional[int]) -> str:
    return "—" if x is None else f"{x / 2**20:.0f} MiB"


def kernels(r: dict) -> str:
    return f"{' '.join(r.get('train_kernels', [])) or '—'} / {' '.join(r.get('decode_kernels', [])) or '—'}"


def header(report: ReportInput) -> List[str]:
    """Title, machine and versions, and how each number was measured."""
    import fairseq
    import torch

    s = report.settings
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dev = cpu_model() if s.device == "cpu" else torch.cuda.get_device_name(0)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    accel = (f"CUDA {torch.version.cuda}, cuDNN {cudnn}, " if s.device == "cuda" else "")
    lines = [
        f"## Benchmark: width {','.join(s.widths)}, {s.device} ({dev}), {PRECISION[s.dtype]}, "
        f"attention backend {s.backend}",
        "",
        f"- date {now}; commit {report.commit} (at the start); {os.cpu_count()} CPU cores, torch threads {s.threads}; "
        f"torch {torch.__version__}, {accel}fairseq {fairseq.__version__}, Python {platform.python_version()}",
        f"- load average before the run {report.load_before[0]:.2f} (1 min); total run time {report.elapsed:.0f}s",
        "- clock: " + ("wall time" if s.clock == "wall" else
                       "CPU time of the benchmark process (time.process_time), not wall time"),
        f"- training: {s.warmup} warm-up + {s.iters} timed iterations per model, --max-tokens {s.max_tokens}, "
        f"random sentences of length ~{s.len_mean:g}±{s.len_std:g} batched by length as "
        f"fairseq-train does; tokens/s = target tokens (fairseq's ntokens) per second, median over the "
        f"timed iterations; fairseq Adam; label-smoothed CE 0.1 (calibration: its own criterion). "
        f"All models of a width run in one process and take turns on every batch, so load changes "
        f"on the machine hit them alike",
    ]
    if s.model_args:
        lines.append(f"- model options for every model, baseline included: `{s.model_args}`")
    mem_method = ("peak RSS (VmHWM, reset through /proc/self/clear_refs after the model is built) minus the RSS "
                  "just before the first update, i.e. gradients + Adam state + activations + allocator slack"
                  if s.device == "cpu" else
                  "torch.cuda.max_memory_allocated minus the memory allocated before the first update")
    lines.append(f"- peak memory: {mem_method}; each model in its own process, {s.memory_iters} training "
                 f"step(s) on the largest batch of the set")
    lines.append(f"- decoding: fairseq SequenceGenerator, beam {s.beam}, {s.decode_sentences} source sentences, "
                 f"every hypothesis forced to {s.decode_len} tokens (min_len = max_len_b), median of "
                 f"{s.decode_iters} timed calls after {s.decode_warmup} warm-up")
    if s.defaults_used:
        lines.append(f"- defaults chosen for this device (override for steadier numbers): {', '.join(s.defaults_used)}")
    first = next((r for r in report.results.values() if "batch_tokens" in r), None)
    if first is not None:
        bt = first["batch_tokens"]
        lines.append(f"- batches (identical for every model): {len(bt)} batches, mean {statistics.mean(bt):.0f} target "
                     f"tokens, mean {statistics.mean(first['batch_sentences']):.0f} sentences, mean source pad "
                     f"fraction {statistics.mean(first['batch_pad_fraction']):.3f}")
    return lines


def error_row(first: List[str], error: str) -> List[Optional[str]]:
    """The cells of a model that failed: its first cells, the error, the rest left blank."""
    return first + [f"error: {error}"] + [None] * (len(COLUMNS) - len(first) - 1)


def baseline_row(width: str, base: dict) -> List[Optional[str]]:
    first = [f"baseline ({width})", BASELINE_ARCH[width], "fairseq"]
    if "error" in base:
        return error_row(first, base["error"])
    return first + [f"{base['params'] / 1e6:.2f}M", f"{base['train_tok_s']:.0f}", "1", mib(base.get("train_peak_bytes")),
                    "1", f"{base['decode_sent_s']:.2f}", "1", None, None, kernels(base),
                    f"{base.get('compiled_graphs', 0)}"]


def target_cells(case: Case, width: str, device: str, tr: float, mr: Optional[float], dr: float) -> Tuple[str, str]:
    """The target and met cells: the project's ratio targets for this device and width, and whether they hold."""
    targets = case.gpu_targets if device == "cuda" else (case.targets if width == "base" else {})
    if targets:
        parts, met = [], []
        for kind, ratio in (("train", tr), ("mem", mr), ("decode", dr)):
            if kind not in targets:
                continue
            if kind == "mem":
                parts.append(f"mem ≤ {targets[kind]:.2f}×")
                met.append(ratio is not None and ratio <= targets[kind])
            else:
                parts.append(f"{kind} ≥ {targets[kind]:.2f}×")
                met.append(ratio >= targets[kind])
        target, ok = "; ".join(parts), ("yes" if all(met) else "**no**")
    elif case.targets and device != "cuda":
        target, ok = "(CPU targets are for base width)", ""
    else:
        target, ok = "none", ""
    if case.criterion == CALIBRATED_CRITERION:
        target = f"{target}; cost per update {1 / tr:.2f}× (≈1.5× expected)"
    return target, ok


def case_notes(case: Case, width: str, backend: str, r: dict, base: dict) -> List[str]:
    """The notes under the table that a measured case brings (the caller drops repeats)."""
    notes = []
    if case.criterion == CALIBRATED_CRITERION:
        notes.append(f"- calibration: extra parameters over {BASELINE_ARCH[width]}: "
                     f"{(r['params'] - base['params']) / 1e6:+.2f}M (paper: about 6M at base width)")
    for who, res in ((case.name, r), (f"baseline ({width})", base)):
        if res.get("skipped_updates"):
            notes.append(f"- {who} ({backend}): {res.get('skipped_updates')} update(s) skipped after an fp16 "
                         f"overflow (the loss scaler settling), as fairseq-train skips them")
        if "memory_error" in res:
            notes.append(f"- {who}: peak memory not measured: {res['memory_error']}")
    return notes


def both_clocks(case: Case, width: str, backend: str, r: dict, base: dict) -> str:
    return (f"- {case.name} ({width}, {backend}): training ratio "
            f"{r['train_tok_s_wall'] / base['train_tok_s_wall']:.3f}× wall / "
            f"{r['train_tok_s_cpu'] / base['train_tok_s_cpu']:.3f}× process CPU time; decoding ratio "
            f"{r['decode_sent_s_wall'] / base['decode_sent_s_wall']:.3f}× wall / "
            f"{r['decode_sent_s_cpu'] / base['decode_sent_s_cpu']:.3f}× process CPU time")


def table(report: ReportInput) -> Tuple[List[str], List[str], List[str]]:
    """The ratio table (each group's baseline row first), its notes and the ratios by both clocks."""
    rows = []
    shown_baselines, notes, clocks = set(), [], []
    for case, width, arch, backend in report.runs:
        base_key = baseline_key(width, backend)
        base = report.results.get(base_key, {"error": "not run"})
        if base_key not in shown_baselines:
            shown_baselines.add(base_key)
            rows.append(baseline_row(width, base))
        r = report.results.get(case_key(case.name, width, backend), {"error": "not run"})
        model = arch + ("" if not case.extra_args else " " + " ".join(case.extra_args))
        if case.criterion != LS_CRITERION:
            model += f" (criterion {case.criterion})"
        if "error" in r or "error" in base:
            rows.append(error_row([case.name, model, backend], r.get("error") or base.get("error")))
            continue
        tr = r["train_tok_s"] / base["train_tok_s"]
        mr = (r["train_peak_bytes"] / base["train_peak_bytes"]
              if r.get("train_peak_bytes") and base.get("train_peak_bytes") else None)
        dr = r["decode_sent_s"] / base["decode_sent_s"]
        target, ok = target_cells(case, width, report.settings.device, tr, mr, dr)
        for note in case_notes(case, width, backend, r, base):
            if note not in notes:
                notes.append(note)
        clocks.append(both_clocks(case, width, backend, r, base))
        rows.append([case.name, model, backend, f"{r['params'] / 1e6:.2f}M", f"{r['train_tok_s']:.0f}", fmt_ratio(tr),
                     mib(r.get("train_peak_bytes")), fmt_ratio(mr), f"{r['decode_sent_s']:.2f}", fmt_ratio(dr), target,
                     ok, kernels(r), f"{r.get('compiled_graphs', 0)}"])
    return markdown_table(COLUMNS, rows, ALIGN), notes, clocks


def render(report: ReportInput) -> str:
    lines = header(report) + [""]
    rows, notes, clocks = table(report)
    lines += rows + [""] + notes
    if clocks:
        lines.append("- the same ratios by both clocks (wall time is what a user waits; process CPU time is "
                     "steadier when other jobs share the CPU):")
        lines.extend("  " + line for line in clocks)
    lines.extend(f"- skipped: {s}" for s in report.skipped)
    if not report.runs:
        lines.append("- no case could run (none of the requested archs is registered)")
    return "\n".join(lines) + "\n"
