"""The benchmark's Markdown report: header (machine, versions, method) and the ratio table."""

import datetime
import os
import platform
import statistics
from typing import Optional

from man_fairseq.provenance import cpu_model
from man_fairseq.bench.cases import BASELINE_ARCH, CALIBRATED_CRITERION, LS_CRITERION, baseline_key, case_key

PRECISION = {
    "fp32": "fp32",
    "fp16": "fp16 (whole model cast and fp32 master weights with loss scaling, as fairseq-train --fp16)",
    "bf16": "bf16 (whole model cast and fp32 master weights, as fairseq-train --bf16)",
}


def fmt_ratio(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.3f}×"


def render(args, widths, runs, results, skipped, defaults_used, threads, iters, warmup, max_tokens,
           decode_sentences, decode_len, decode_iters, header_load, elapsed, commit) -> str:
    import fairseq
    import torch

    lines = []
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dev = cpu_model() if args.device == "cpu" else torch.cuda.get_device_name(0)
    lines.append(f"## Benchmark: width {','.join(widths)}, {args.device} ({dev}), {PRECISION[args.dtype]}, "
                 f"attention backend {args.backend}")
    lines.append("")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    accel = (f"CUDA {torch.version.cuda}, cuDNN {cudnn}, " if args.device == "cuda" else "")
    lines.append(f"- date {now}; commit {commit} (at the start); {os.cpu_count()} CPU cores, torch threads {threads}; "
                 f"torch {torch.__version__}, {accel}fairseq {fairseq.__version__}, Python {platform.python_version()}")
    lines.append(f"- load average before the run {header_load[0]:.2f} (1 min); total run time {elapsed:.0f}s")
    lines.append("- clock: " + ("wall time" if args.clock == "wall" else
                                "CPU time of the benchmark process (time.process_time), not wall time"))
    lines.append(f"- training: {warmup} warm-up + {iters} timed iterations per model, --max-tokens {max_tokens}, "
                 f"random sentences of length ~{args.len_mean:g}±{args.len_std:g} batched by length as "
                 f"fairseq-train does; tokens/s = target tokens (fairseq's ntokens) per second, median over the "
                 f"timed iterations; fairseq Adam; label-smoothed CE 0.1 (calibration: its own criterion). "
                 f"All models of a width run in one process and take turns on every batch, so load changes "
                 f"on the machine hit them alike")
    if getattr(args, "model_args", ""):
        lines.append(f"- model options for every model, baseline included: `{args.model_args}`")
    mem_method = ("peak RSS (VmHWM, reset through /proc/self/clear_refs after the model is built) minus the RSS "
                  "just before the first update, i.e. gradients + Adam state + activations + allocator slack"
                  if args.device == "cpu" else
                  "torch.cuda.max_memory_allocated minus the memory allocated before the first update")
    lines.append(f"- peak memory: {mem_method}; each model in its own process, {args.memory_iters} training "
                 f"step(s) on the largest batch of the set")
    lines.append(f"- decoding: fairseq SequenceGenerator, beam {args.beam}, {decode_sentences} source sentences, "
                 f"every hypothesis forced to {decode_len} tokens (min_len = max_len_b), median of "
                 f"{decode_iters} timed calls after {args.decode_warmup} warm-up")
    if defaults_used:
        lines.append(f"- defaults chosen for this device (override for steadier numbers): {', '.join(defaults_used)}")
    first = next((r for r in results.values() if "batch_tokens" in r), None)
    if first is not None:
        bt = first["batch_tokens"]
        lines.append(f"- batches (identical for every model): {len(bt)} batches, mean {statistics.mean(bt):.0f} target "
                     f"tokens, mean {statistics.mean(first['batch_sentences']):.0f} sentences, mean source pad "
                     f"fraction {statistics.mean(first['batch_pad_fraction']):.3f}")
    lines.append("")
    lines.append("| case | model | backend | params | train tok/s | ratio | peak train mem | ratio | decode sent/s "
                 "| ratio | target | met | kernels (train / decode) | compiled graphs |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|")
    empty = "|" * 12

    def mib(x):
        return "—" if x is None else f"{x / 2**20:.0f} MiB"

    def kernels(r):
        return f"{' '.join(r.get('train_kernels', [])) or '—'} / {' '.join(r.get('decode_kernels', [])) or '—'}"

    shown_baselines = set()
    extra_notes = []
    both_clocks = []
    for case, width, arch, backend in runs:
        base_key = baseline_key(width, backend)
        base = results.get(base_key, {"error": "not run"})
        if base_key not in shown_baselines:
            shown_baselines.add(base_key)
            if "error" in base:
                lines.append(f"| baseline ({width}) | {BASELINE_ARCH[width]} | fairseq | error: {base['error']} {empty}")
            else:
                lines.append(f"| baseline ({width}) | {BASELINE_ARCH[width]} | fairseq | {base['params'] / 1e6:.2f}M | "
                             f"{base['train_tok_s']:.0f} | 1 | {mib(base.get('train_peak_bytes'))} | 1 | "
                             f"{base['decode_sent_s']:.2f} | 1 | | | {kernels(base)} | {base.get('compiled_graphs', 0)} |")
        r = results.get(case_key(case.name, width, backend), {"error": "not run"})
        model = arch + ("" if not case.extra_args else " " + " ".join(case.extra_args))
        if case.criterion != LS_CRITERION:
            model += f" (criterion {case.criterion})"
        if "error" in r or "error" in base:
            lines.append(f"| {case.name} | {model} | {backend} | error: {r.get('error') or base.get('error')} {empty}")
            continue
        tr = r["train_tok_s"] / base["train_tok_s"]
        mr = (r["train_peak_bytes"] / base["train_peak_bytes"]
              if r.get("train_peak_bytes") and base.get("train_peak_bytes") else None)
        dr = r["decode_sent_s"] / base["decode_sent_s"]
        targets = case.gpu_targets if args.device == "cuda" else (case.targets if width == "base" else {})
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
        elif case.targets and args.device != "cuda":
            target, ok = "(CPU targets are for base width)", ""
        else:
            target, ok = "none", ""
        if case.criterion == CALIBRATED_CRITERION:
            target = f"{target}; cost per update {1 / tr:.2f}× (≈1.5× expected)"
            note = (f"- calibration: extra parameters over {BASELINE_ARCH[width]}: "
                    f"{(r['params'] - base['params']) / 1e6:+.2f}M (paper: about 6M at base width)")
            if note not in extra_notes:
                extra_notes.append(note)
        both_clocks.append(
            f"- {case.name} ({width}, {backend}): training ratio {r['train_tok_s_wall'] / base['train_tok_s_wall']:.3f}× wall / "
            f"{r['train_tok_s_cpu'] / base['train_tok_s_cpu']:.3f}× process CPU time; decoding ratio "
            f"{r['decode_sent_s_wall'] / base['decode_sent_s_wall']:.3f}× wall / "
            f"{r['decode_sent_s_cpu'] / base['decode_sent_s_cpu']:.3f}× process CPU time")
        for who, res in ((case.name, r), (f"baseline ({width})", base)):
            skipped_note = (f"- {who} ({backend}): {res.get('skipped_updates')} update(s) skipped after an fp16 "
                            f"overflow (the loss scaler settling), as fairseq-train skips them")
            if res.get("skipped_updates") and skipped_note not in extra_notes:
                extra_notes.append(skipped_note)
            if "memory_error" in res and f"- {who}: peak memory not measured: {res['memory_error']}" not in extra_notes:
                extra_notes.append(f"- {who}: peak memory not measured: {res['memory_error']}")
        lines.append(f"| {case.name} | {model} | {backend} | {r['params'] / 1e6:.2f}M | {r['train_tok_s']:.0f} | "
                     f"{fmt_ratio(tr)} | {mib(r.get('train_peak_bytes'))} | {fmt_ratio(mr)} | {r['decode_sent_s']:.2f} | "
                     f"{fmt_ratio(dr)} | {target} | {ok} | {kernels(r)} | {r.get('compiled_graphs', 0)} |")
    lines.append("")
    lines.extend(extra_notes)
    if both_clocks:
        lines.append("- the same ratios by both clocks (wall time is what a user waits; process CPU time is "
                     "steadier when other jobs share the CPU):")
        lines.extend("  " + line for line in both_clocks)
    for s in skipped:
        lines.append(f"- skipped: {s}")
    if not runs:
        lines.append("- no case could run (none of the requested archs is registered)")
    return "\n".join(lines) + "\n"

