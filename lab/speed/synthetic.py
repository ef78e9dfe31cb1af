"""``scripts/speed.sh synthetic``: every family against fairseq's Transformer of the same width, on the same
random batches at the papers' widths: training tokens/s, peak training memory, beam-search sentences/s,
each family's ratio and the project's target (method: docs/benchmarks.md, "Synthetic batches").

All models of a (width, backend) group take turns on every batch in one worker process, then each
model's peak memory is measured in a process of its own (:mod:`.workers`).
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from lab.speed.model import USER_DIR
from lab.speed.workers import log, spawn
from man_fairseq.modules.attention_backend import ATTENTION_BACKENDS
from man_fairseq.provenance import cpu_model, git_commit
from man_fairseq.tables import markdown_table

# fairseq's Transformer of each width (the baseline) and the dictionary size of the paper's parameter
# counts (IWSLT14 10k joint BPE, WMT14 En-De 37k); "tiny" is a smoke test: the base archs shrunk
BASELINE_ARCH = {"tiny": "transformer_wmt_en_de", "small": "transformer_iwslt_de_en", "base": "transformer_wmt_en_de",
                 "big": "transformer_vaswani_wmt_en_de_big"}
DEFAULT_DICT_SIZE = {"tiny": 1000, "small": 10000, "base": 37000, "big": 37000}
TINY_OVERRIDES = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--encoder-layers", "3", "--decoder-layers", "3"]
ARCH_WIDTH_SUFFIX = {"tiny": "base", "small": "small", "base": "base", "big": "big"}
LS_CRITERION, CALIBRATED_CRITERION = "label_smoothed_cross_entropy", "calibrated_label_smoothed_cross_entropy"
PRECISION = {"fp32": "fp32",
             "fp16": "fp16 (whole model cast and fp32 master weights with loss scaling, as fairseq-train --fp16)",
             "bf16": "bf16 (whole model cast and fp32 master weights, as fairseq-train --bf16)"}
COLUMNS = ["case", "model", "backend", "params", "train tok/s", "ratio", "peak train mem", "ratio", "decode sent/s",
           "ratio", "target", "met", "kernels (train / decode)", "compiled graphs"]


@dataclass
class Case:
    name: str
    family_arch: str  # arch name with "{w}" for the width suffix (small|base|big)
    extra_args: List[str] = field(default_factory=list)
    criterion: str = LS_CRITERION
    targets: Dict[str, float] = field(default_factory=dict)  # ratios on CPU at base width: train, decode >= x
    gpu_targets: Dict[str, float] = field(default_factory=dict)  # on CUDA, every width: train/decode >= x, mem <= x
    fixed_width: Optional[str] = None  # a case pinned to one width (man_small)

    def width(self, requested):
        return self.fixed_width if self.fixed_width and requested != "tiny" else requested

    def arch(self, width):
        return self.family_arch.format(w=ARCH_WIDTH_SUFFIX[width])


CASES = {c.name: c for c in [
    Case("man", "transformer_man_{w}", targets={"train": 0.85, "decode": 0.85},
         gpu_targets={"train": 0.95, "mem": 1.1, "decode": 0.95}),
    Case("man_small", "transformer_man_{w}", fixed_width="small", gpu_targets={"train": 0.95, "mem": 1.1, "decode": 0.95}),
    # default options: query-specific window, encoder layers 0,1,2
    Case("localness", "transformer_localness_{w}", targets={"train": 0.95}, gpu_targets={"train": 0.97, "decode": 0.95}),
    Case("diffwin", "transformer_diffwin_{w}", ["--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw"], targets={"train": 0.87},
         gpu_targets={"train": 0.90, "decode": 0.95}),
    # two decoder passes per update: ~1.5x the cost per update expected; no training target
    Case("calibration", "transformer_calibrated_{w}", criterion=CALIBRATED_CRITERION, gpu_targets={"decode": 0.95}),
]}


def baseline_key(width, backend):
    return f"baseline:{width}@{backend}"


def case_key(name, width, backend):
    return f"{name}:{width}@{backend}"


def add_arguments(p):
    a = p.add_argument
    a("--cases", default="all", help=f"comma-separated subset of {','.join(CASES)} (default: all that are registered)")
    a("--width", default="base", help="comma-separated: small, base, big (baselines " + ", ".join(
        f"{w}={arch}" for w, arch in BASELINE_ARCH.items() if w != "tiny") + "); tiny: base archs shrunk (alone)")
    a("--backend", default="auto", help=f"comma-separated --attention-backend values ({','.join(ATTENTION_BACKENDS)}); "
                                         "each is a group with its own baseline run")
    a("--device", choices=["cpu", "cuda"], default="cpu")
    a("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
      help="fp16/bf16: as fairseq-train --fp16/--bf16 (the whole model cast, fp32 master weights in FP16Optimizer)")
    a("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    a("--iters", type=int, default=None, help="timed training iterations per model (default: 2 CPU, 20 CUDA)")
    a("--warmup", type=int, default=None, help="untimed warm-up iterations (default: 1 CPU, 5 CUDA)")
    a("--max-tokens", type=int, default=None, help="tokens per training batch (default: 1024 CPU, 4096 CUDA)")
    a("--dict-size", type=int, default=None, help="joined dictionary size incl. specials (default: 10000 small, 37000 "
                                                  "base/big)")
    a("--len-mean", type=float, default=25.0, help="mean sentence length in tokens (incl. EOS)")
    a("--len-std", type=float, default=10.0, help="std of the sentence length")
    a("--len-max", type=int, default=100, help="length clip")
    a("--beam", type=int, default=4)
    a("--decode-sentences", type=int, default=None, help="sentences in the decoding batch (default: 8 CPU, 64 CUDA)")
    a("--decode-len", type=int, default=None, help="decoded length (max_len_b = min_len; default: 10 CPU, 40 CUDA)")
    a("--decode-iters", type=int, default=None, help="timed decoding calls (default 2 CPU, 5 CUDA)")
    a("--decode-warmup", type=int, default=1)
    a("--memory-iters", type=int, default=1, help="training steps on the largest batch for the peak memory (0: skip)")
    a("--clock", choices=["wall", "process"], default="wall",
      help="time base of the rates: wall clock, or this process's CPU time (a loaded CPU; with --threads 1)")
    a("--model-args", default="", help="extra fairseq model options for every model, baseline included, as one "
                                       "string (e.g. \"--encoder-layers 3 --decoder-layers 3\")")
    a("--seed", type=int, default=1)
    a("--output", default=None, help="also write the Markdown report to this file")
    a("--json", default=None, help="also write the raw per-model measurements as JSON")


def comma_list(value):
    return [v.strip() for v in value.split(",") if v.strip()]


def settings(p, args):
    """The worker spec of ``args`` with the device's defaults filled in (listed for the report); a usage
    error (exit 2) for what cannot run."""
    try:
        model_options = shlex.split(args.model_args)
    except ValueError as e:
        p.error(f"--model-args: {e}")
    if model_options and not model_options[0].startswith("--"):
        p.error(f"--model-args: expected fairseq options starting with --, got {model_options[0]!r}")
    widths, backends = comma_list(args.width), comma_list(args.backend)
    bad = [w for w in widths if w not in BASELINE_ARCH]
    if bad or not widths:
        p.error(f"--width: unknown {bad or args.width!r}; choose from {', '.join(BASELINE_ARCH)}")
    if "tiny" in widths and len(widths) > 1:
        p.error("--width tiny is a smoke test: run it alone")
    bad = [b for b in backends if b not in ATTENTION_BACKENDS]
    if bad or not backends:
        p.error(f"--backend: unknown {bad or args.backend!r}; choose from {', '.join(ATTENTION_BACKENDS)}")
    cuda = args.device == "cuda"
    if cuda:
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch.cuda.is_available() is False")
    if args.dtype == "fp16" and not cuda:
        p.error("--dtype fp16 is only supported with --device cuda (on CPU: bf16)")
    if args.clock == "process" and cuda:
        p.error("--clock process measures CPU time; use --clock wall with --device cuda")
    s = dict(vars(args), widths=widths, backends=backends, model_options=model_options, defaults_used=[],
             threads=args.threads or os.cpu_count() or 1)
    # CPU defaults keep a base-width run of all cases to a few minutes on an idle 2-core machine
    for name, cpu_value, cuda_value in (("iters", 2, 20), ("warmup", 1, 5), ("max_tokens", 1024, 4096),
                                        ("decode_sentences", 8, 64), ("decode_len", 10, 40), ("decode_iters", 2, 5)):
        if s[name] is None:
            s[name] = cuda_value if cuda else cpu_value
            s["defaults_used"].append(f"--{name.replace('_', '-')} {s[name]}")
    if widths == ["tiny"]:  # short sentences, small batches
        s.update(max_tokens=args.max_tokens or 256, len_mean=8.0, len_std=3.0, decode_len=args.decode_len or 5)
        s["defaults_used"] = [d for d in s["defaults_used"] if not d.startswith(("--max-tokens", "--decode-len"))] + [
            f"--decode-len {s['decode_len']} (tiny)", f"--max-tokens {s['max_tokens']} (tiny)", "sentence length 8±3 (tiny)"]
    return s


def plan_runs(p, wanted, s):
    """The (case, width, arch, backend) runs to measure, and the cases skipped with the reason."""
    from argparse import Namespace

    from fairseq import utils
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY

    utils.import_user_module(Namespace(user_dir=USER_DIR))
    wanted = list(CASES) if wanted == "all" else comma_list(wanted)
    if unknown := [c for c in wanted if c not in CASES]:
        p.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    runs, skipped = [], []
    for requested in s["widths"]:
        for case in (CASES[name] for name in wanted):
            width = case.width(requested)
            arch = case.arch(width)
            if any(r[0] is case and r[1] == width for r in runs):
                continue  # a case pinned to one width runs once
            missing = (f"arch {arch}" if arch not in ARCH_MODEL_REGISTRY else f"criterion {case.criterion}"
                       if case.criterion not in CRITERION_REGISTRY else None)
            if missing:
                skipped.append(f"{case.name}: {missing} is not registered (yet) — skipped")
                log(skipped[-1])
                continue
            runs += [(case, width, arch, backend) for backend in s["backends"]]
    return runs, skipped


def measure(s, runs):
    """Each (width, backend) group: the baseline and its cases timed in one worker, then each model's peak
    memory in a worker of its own. {key: result}"""
    groups, results = {}, {}
    for case, width, arch, backend in runs:
        groups.setdefault((width, backend), [(baseline_key(width, backend), f"baseline {BASELINE_ARCH[width]}",
                                              BASELINE_ARCH[width], [], LS_CRITERION)]).append(
            (case_key(case.name, width, backend), f"{case.name} {arch} [{backend}]", arch,
             case.extra_args + ["--attention-backend", backend], case.criterion))
    for (width, backend), group in groups.items():
        models = [{"key": k, "label": label, "arch": arch, "criterion": crit,
                   "extra_args": (TINY_OVERRIDES if width == "tiny" else []) + s["model_options"] + extra}
                  for k, label, arch, extra, crit in group]
        log(f"width {width}, backend {backend}: timing {len(models)} models interleaved batch by batch: "
            + ", ".join(m["label"] for m in models))
        spec = dict(s, dict_size=s["dict_size"] or DEFAULT_DICT_SIZE[width])
        timing = spawn(dict(spec, mode="timing", models=models))
        for i, m in enumerate(models):
            r = results[m["key"]] = dict(timing.get(m["key"], {"error": timing.get("error", "no result")}))
            if s["memory_iters"] > 0:
                log(f"width {width}: peak memory [{i + 1}/{len(models)}] {m['label']} (own process)")
                mem = spawn(dict(spec, mode="memory", models=[m]))
                if "error" in mem:
                    r.setdefault("memory_error", mem["error"])
                else:
                    r.update({k: v for k, v in mem.items() if k != "params"})
        for m in models:
            r = results[m["key"]]
            log(f"  {m['label']}: FAILED: {r['error']}" if "error" in r else
                f"  {m['label']}: {r['params'] / 1e6:.2f}M params, {r['train_tok_s']:.0f} tok/s train, "
                + (f"{r['train_peak_bytes'] / 2**20:.0f} MiB peak" if "train_peak_bytes" in r else "no memory")
                + f", {r['decode_sent_s']:.2f} sent/s decode")
    return results


def header(s, results, load_before, elapsed, commit):
    """Title, machine and versions, and how each number was measured."""
    import fairseq
    import torch

    cuda = s["device"] == "cuda"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    lines = [
        f"## Benchmark: width {','.join(s['widths'])}, {s['device']} "
        f"({torch.cuda.get_device_name(0) if cuda else cpu_model()}), {PRECISION[s['dtype']]}, attention backend "
        f"{s['backend']}", "",
        f"- date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; commit {commit} (at the start); "
        f"{os.cpu_count()} CPU cores, torch threads {s['threads']}; torch {torch.__version__}, "
        f"{f'CUDA {torch.version.cuda}, cuDNN {cudnn}, ' if cuda else ''}fairseq {fairseq.__version__}, "
        f"Python {platform.python_version()}",
        f"- load average before the run {load_before[0]:.2f} (1 min); total run time {elapsed:.0f}s",
        "- clock: " + ("wall time" if s["clock"] == "wall" else
                       "CPU time of the benchmark process (time.process_time), not wall time"),
        f"- training: {s['warmup']} warm-up + {s['iters']} timed iterations per model, --max-tokens {s['max_tokens']}, "
        f"random sentences of length ~{s['len_mean']:g}±{s['len_std']:g} batched by length as fairseq-train does; "
        "tokens/s = target tokens (fairseq's ntokens) per second, median over the timed iterations; fairseq Adam; "
        "label-smoothed CE 0.1 (calibration: its own criterion). All models of a width run in one process and take "
        "turns on every batch, so load changes on the machine hit them alike"]
    if s["model_args"]:
        lines.append(f"- model options for every model, baseline included: `{s['model_args']}`")
    lines += [
        "- peak memory: " + ("torch.cuda.max_memory_allocated minus the memory allocated before the first update"
                             if cuda else "peak RSS (VmHWM, reset through /proc/self/clear_refs after the model is "
                             "built) minus the RSS just before the first update, i.e. gradients + Adam state + "
                             "activations + allocator slack")
        + f"; each model in its own process, {s['memory_iters']} training step(s) on the largest batch of the set",
        f"- decoding: fairseq SequenceGenerator, beam {s['beam']}, {s['decode_sentences']} source sentences, every "
        f"hypothesis forced to {s['decode_len']} tokens (min_len = max_len_b), median of {s['decode_iters']} timed "
        f"calls after {s['decode_warmup']} warm-up"]
    if s["defaults_used"]:
        lines.append(f"- defaults chosen for this device (override for steadier numbers): {', '.join(s['defaults_used'])}")
    if first := next((r for r in results.values() if "batch_tokens" in r), None):
        bt = first["batch_tokens"]
        lines.append(f"- batches (identical for every model): {len(bt)} batches, mean {statistics.mean(bt):.0f} target "
                     f"tokens, mean {statistics.mean(first['batch_sentences']):.0f} sentences, mean source pad "
                     f"fraction {statistics.mean(first['batch_pad_fraction']):.3f}")
    return lines


def target_cells(case, width, device, ratios):
    """The target and met cells: the project's ratio targets for this device and width, and whether they hold."""
    targets = case.gpu_targets if device == "cuda" else (case.targets if width == "base" else {})
    target, ok = ("(CPU targets are for base width)" if case.targets and device != "cuda" else "none"), ""
    if targets:
        kinds = [k for k in ("train", "mem", "decode") if k in targets]
        target = "; ".join(f"mem ≤ {targets[k]:.2f}×" if k == "mem" else f"{k} ≥ {targets[k]:.2f}×" for k in kinds)
        met = [(ratios[k] is not None and ratios[k] <= targets[k]) if k == "mem" else ratios[k] >= targets[k]
               for k in kinds]
        ok = "yes" if all(met) else "**no**"
    if case.criterion == CALIBRATED_CRITERION:
        target = f"{target}; cost per update {1 / ratios['train']:.2f}× (≈1.5× expected)"
    return target, ok


def table(runs, results, device):
    """The ratio table (each group's baseline row first), its notes and the ratios by both clocks."""
    rows, shown, notes, clocks = [], set(), [], []
    fmt = lambda x: "—" if x is None else f"{x:.3f}×"  # noqa: E731
    mib = lambda r: "—" if r.get("train_peak_bytes") is None else f"{r['train_peak_bytes'] / 2**20:.0f} MiB"  # noqa: E731
    kernels = lambda r: (f"{' '.join(r.get('train_kernels', [])) or '—'} / "  # noqa: E731
                         f"{' '.join(r.get('decode_kernels', [])) or '—'}")
    failed = lambda first, error: first + [f"error: {error}"] + [None] * (len(COLUMNS) - len(first) - 1)  # noqa: E731
    for case, width, arch, backend in runs:
        base = results.get(baseline_key(width, backend), {"error": "not run"})
        if baseline_key(width, backend) not in shown:
            shown.add(baseline_key(width, backend))
            first = [f"baseline ({width})", BASELINE_ARCH[width], "fairseq"]
            rows.append(failed(first, base["error"]) if "error" in base else first + [
                f"{base['params'] / 1e6:.2f}M", f"{base['train_tok_s']:.0f}", "1", mib(base), "1",
                f"{base['decode_sent_s']:.2f}", "1", None, None, kernels(base), f"{base.get('compiled_graphs', 0)}"])
        r = results.get(case_key(case.name, width, backend), {"error": "not run"})
        model = arch + ("" if not case.extra_args else " " + " ".join(case.extra_args)) + (
            "" if case.criterion == LS_CRITERION else f" (criterion {case.criterion})")
        if "error" in r or "error" in base:
            rows.append(failed([case.name, model, backend], r.get("error") or base.get("error")))
            continue
        ratios = {"train": r["train_tok_s"] / base["train_tok_s"], "decode": r["decode_sent_s"] / base["decode_sent_s"],
                  "mem": r["train_peak_bytes"] / base["train_peak_bytes"]
                  if r.get("train_peak_bytes") and base.get("train_peak_bytes") else None}
        target, ok = target_cells(case, width, device, ratios)
        new = [f"- calibration: extra parameters over {BASELINE_ARCH[width]}: {(r['params'] - base['params']) / 1e6:+.2f}M "
               "(paper: about 6M at base width)"] if case.criterion == CALIBRATED_CRITERION else []
        for who, res in ((case.name, r), (f"baseline ({width})", base)):
            if res.get("skipped_updates"):
                new.append(f"- {who} ({backend}): {res['skipped_updates']} update(s) skipped after an fp16 overflow "
                           "(the loss scaler settling), as fairseq-train skips them")
            if "memory_error" in res:
                new.append(f"- {who}: peak memory not measured: {res['memory_error']}")
        notes += [n for n in new if n not in notes]
        clocks.append(f"- {case.name} ({width}, {backend}): training ratio "
                      f"{r['train_tok_s_wall'] / base['train_tok_s_wall']:.3f}× wall / "
                      f"{r['train_tok_s_cpu'] / base['train_tok_s_cpu']:.3f}× process CPU time; decoding ratio "
                      f"{r['decode_sent_s_wall'] / base['decode_sent_s_wall']:.3f}× wall / "
                      f"{r['decode_sent_s_cpu'] / base['decode_sent_s_cpu']:.3f}× process CPU time")
        rows.append([case.name, model, backend, f"{r['params'] / 1e6:.2f}M", f"{r['train_tok_s']:.0f}",
                     fmt(ratios["train"]), mib(r), fmt(ratios["mem"]), f"{r['decode_sent_s']:.2f}",
                     fmt(ratios["decode"]), target, ok, kernels(r), f"{r.get('compiled_graphs', 0)}"])
    return markdown_table(COLUMNS, rows, "lllrrrrrrrlllr"), notes, clocks


def main(argv=None, prog="scripts/speed.sh synthetic"):
    from man_fairseq.logging_setup import quiet_logging

    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    s = settings(p, args)
    runs, skipped = plan_runs(p, args.cases, s)
    started, load_before, commit = time.time(), os.getloadavg(), git_commit()  # the code measured, at the start
    results = measure(s, runs)
    rows, notes, clocks = table(runs, results, s["device"])
    lines = header(s, results, load_before, time.time() - started, commit) + [""] + rows + [""] + notes
    if clocks:
        lines += ["- the same ratios by both clocks (wall time is what a user waits; process CPU time is steadier "
                  "when other jobs share the CPU):"] + ["  " + line for line in clocks]
    lines += [f"- skipped: {line}" for line in skipped] + (
        [] if runs else ["- no case could run (none of the requested archs is registered)"])
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        Path(args.output).write_text(report)
        log(f"wrote {args.output}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0
