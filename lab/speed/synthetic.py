"""Command line of ``scripts/benchmark.py``: parse, plan the runs, spawn the workers, report."""

import argparse
import json
import os
import shlex
import time
from pathlib import Path
from typing import Dict, List, Tuple

from lab.speed.cases import (ATTENTION_BACKENDS, BASELINE_ARCH, CASES, DEFAULT_DICT_SIZE, LS_CRITERION,
                                     TINY_OVERRIDES, baseline_key, case_key)
from lab.speed.model import USER_DIR
from lab.speed.report import ReportInput, Run, Settings, render
from man_fairseq.provenance import git_commit
from lab.speed.workers import log, spawn


def registered(user_dir: str):
    """Arch and criterion names registered by fairseq + the plugin, as the CLI sees them."""
    from argparse import Namespace

    from fairseq import utils
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY

    utils.import_user_module(Namespace(user_dir=user_dir))
    return set(ARCH_MODEL_REGISTRY), set(CRITERION_REGISTRY)


def build_parser(description="", epilog="") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=epilog)
    p.add_argument("--cases", default="all",
                   help=f"comma-separated subset of {','.join(CASES)} (default: all that are registered)")
    p.add_argument("--width", default="base",
                   help="model width(s), comma-separated: small, base, big; baselines: small=transformer_iwslt_de_en, "
                        "base=transformer_wmt_en_de, big=transformer_vaswani_wmt_en_de_big; tiny = base archs "
                        "shrunk (smoke test, alone)")
    p.add_argument("--backend", default="auto",
                   help=f"comma-separated --attention-backend values for the families "
                        f"({','.join(ATTENTION_BACKENDS)}); each is a group with its own baseline run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="fp16/bf16: the whole model and criterion cast to half with fairseq's FP16Optimizer "
                        "(fp32 master weights; fp16 with dynamic loss scaling), as fairseq-train --fp16/--bf16 "
                        "and the recipes train; decoding with the cast model, as fairseq-generate --fp16/--bf16")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed training iterations per model (default: 2 on CPU, 20 on CUDA)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up iterations (default: 1 CPU, 5 CUDA)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per training batch as fairseq's --max-tokens (default: 1024 CPU, 4096 CUDA)")
    p.add_argument("--dict-size", type=int, default=None,
                   help="joined dictionary size incl. specials (default: 10000 small, 37000 base/big)")
    p.add_argument("--len-mean", type=float, default=25.0, help="mean sentence length in tokens (incl. EOS)")
    p.add_argument("--len-std", type=float, default=10.0, help="std of the sentence length")
    p.add_argument("--len-max", type=int, default=100, help="length clip")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--decode-sentences", type=int, default=None,
                   help="source sentences in the decoding batch (default: 8 CPU, 64 CUDA)")
    p.add_argument("--decode-len", type=int, default=None,
                   help="decoded length (max_len_b = min_len; default: 10 CPU, 40 CUDA)")
    p.add_argument("--decode-iters", type=int, default=None, help="timed decoding calls (default 2 CPU, 5 CUDA)")
    p.add_argument("--decode-warmup", type=int, default=1)
    p.add_argument("--memory-iters", type=int, default=1,
                   help="training steps on the largest batch for the peak-memory measurement (0: skip memory)")
    p.add_argument("--clock", choices=["wall", "process"], default="wall",
                   help="time base of the rates: wall clock, or the CPU time of the benchmark process "
                        "(for a shared, loaded CPU machine; use it with --threads 1; CPU only)")
    p.add_argument("--model-args", default="",
                   help="extra fairseq model options for every model, baseline included, as one string "
                        "(e.g. the Multi30k CPU width: \"--encoder-embed-dim 256 --decoder-embed-dim 256 "
                        "--encoder-layers 3 --decoder-layers 3\")")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", default=None, help="also write the Markdown report to this file")
    p.add_argument("--json", default=None, help="also write the raw per-model measurements as JSON")
    return p


def comma_list(value: str) -> List[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def check_args(p: argparse.ArgumentParser, args) -> Tuple[List[str], List[str], List[str]]:
    """The model options, widths and backends of ``args``; a usage error (exit 2) for what cannot run."""
    try:
        model_options = shlex.split(args.model_args)
    except ValueError as e:
        p.error(f"--model-args: {e}")
    if model_options and not model_options[0].startswith("--"):
        p.error(f"--model-args: expected fairseq options starting with --, got {model_options[0]!r}")
    widths = comma_list(args.width)
    bad = [w for w in widths if w not in BASELINE_ARCH]
    if bad or not widths:
        p.error(f"--width: unknown {bad or args.width!r}; choose from {', '.join(BASELINE_ARCH)}")
    if "tiny" in widths and len(widths) > 1:
        p.error("--width tiny is a smoke test: run it alone")
    backends = comma_list(args.backend)
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
    return model_options, widths, backends


def resolve_settings(p: argparse.ArgumentParser, args) -> Settings:
    """The checked arguments with the device's defaults filled in (and listed, for the report)."""
    model_options, widths, backends = check_args(p, args)
    cuda = args.device == "cuda"
    defaults_used = []

    def default(name, cpu_value, cuda_value):
        value = getattr(args, name)
        if value is None:
            value = cuda_value if cuda else cpu_value
            defaults_used.append(f"--{name.replace('_', '-')} {value}")
        return value

    # CPU defaults keep a base-width run of all cases to a few minutes on an idle 2-core machine;
    # they are few iterations, so the report lists them and more give steadier numbers
    s = Settings(
        device=args.device, dtype=args.dtype, backend=args.backend, backends=backends, widths=widths,
        threads=args.threads or os.cpu_count() or 1, seed=args.seed, clock=args.clock, dict_size=args.dict_size,
        iters=default("iters", 2, 20), warmup=default("warmup", 1, 5), max_tokens=default("max_tokens", 1024, 4096),
        len_mean=args.len_mean, len_std=args.len_std, len_max=args.len_max, beam=args.beam,
        decode_sentences=default("decode_sentences", 8, 64), decode_len=default("decode_len", 10, 40),
        decode_iters=default("decode_iters", 2, 5), decode_warmup=args.decode_warmup,
        memory_iters=args.memory_iters, model_args=args.model_args, model_options=model_options,
        defaults_used=defaults_used,
    )
    if widths == ["tiny"]:
        # smoke-test width: short sentences, small batches
        s.max_tokens = args.max_tokens or 256
        s.len_mean, s.len_std = 8.0, 3.0
        s.decode_len = args.decode_len or 5
        s.defaults_used = [d for d in defaults_used if not d.startswith(("--max-tokens", "--decode-len"))] + [
            f"--decode-len {s.decode_len} (tiny)",
            f"--max-tokens {s.max_tokens} (tiny)", "sentence length 8±3 (tiny)"]
    return s


def plan_runs(p: argparse.ArgumentParser, cases: str, s: Settings) -> Tuple[List[Run], List[str]]:
    """The (case, width, arch, backend) runs to measure, and the cases skipped with the reason."""
    archs, criterions = registered(USER_DIR)
    wanted = list(CASES) if cases == "all" else comma_list(cases)
    unknown = [c for c in wanted if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    skipped = []
    runs = []
    for requested in s.widths:
        for name in wanted:
            case = CASES[name]
            width = case.width(requested)
            if any(r[0] is case and r[1] == width for r in runs):
                continue  # a case pinned to one width runs once
            arch = case.arch(width)
            if arch not in archs:
                msg = f"{name}: arch {arch} is not registered (yet) — skipped"
                log(msg)
                skipped.append(msg)
                continue
            if case.criterion not in criterions:
                msg = f"{name}: criterion {case.criterion} is not registered (yet) — skipped"
                log(msg)
                skipped.append(msg)
                continue
            for backend in s.backends:
                runs.append((case, width, arch, backend))
    return runs, skipped


def common_spec(s: Settings, width: str) -> dict:
    """The worker spec that every model of a width shares."""
    return {
        "dict_size": s.dict_size or DEFAULT_DICT_SIZE[width],
        "device": s.device, "dtype": s.dtype, "threads": s.threads, "seed": s.seed,
        "iters": s.iters, "warmup": s.warmup, "max_tokens": s.max_tokens,
        "len_mean": s.len_mean, "len_std": s.len_std, "len_max": s.len_max,
        "beam": s.beam, "decode_sentences": s.decode_sentences, "decode_len": s.decode_len,
        "decode_iters": s.decode_iters, "decode_warmup": s.decode_warmup,
        "memory_iters": s.memory_iters, "clock": s.clock,
    }


def model_spec(s: Settings, key, label, arch, width, extra, criterion) -> dict:
    return {"key": key, "label": label, "arch": arch, "criterion": criterion,
            "extra_args": (TINY_OVERRIDES if width == "tiny" else []) + s.model_options + extra}


def group_runs(runs: List[Run], s: Settings) -> Dict[tuple, List[dict]]:
    """One group per (width, backend): the baseline of that width and the cases compared with it."""
    groups: Dict[tuple, List[dict]] = {}
    for case, width, arch, backend in runs:
        group = groups.setdefault((width, backend), [
            model_spec(s, baseline_key(width, backend), f"baseline {BASELINE_ARCH[width]}", BASELINE_ARCH[width],
                       width, [], LS_CRITERION)])
        group.append(model_spec(s, case_key(case.name, width, backend), f"{case.name} {arch} [{backend}]", arch,
                                width, case.extra_args + ["--attention-backend", backend], case.criterion))
    return groups


def measure_group(s: Settings, width: str, models: List[dict], results: Dict[str, dict]):
    """Time the group's models in one worker, then each model's peak memory in a worker of its own."""
    timing = spawn(dict(common_spec(s, width), mode="timing", models=models))
    for m in models:
        results[m["key"]] = dict(timing.get(m["key"], {"error": timing.get("error", "no result")}))
    if s.memory_iters > 0:
        for i, m in enumerate(models):
            log(f"width {width}: peak memory [{i + 1}/{len(models)}] {m['label']} (own process)")
            mem = spawn(dict(common_spec(s, width), mode="memory", models=[m]))
            if "error" in mem:
                results[m["key"]].setdefault("memory_error", mem["error"])
            else:
                results[m["key"]].update({k: v for k, v in mem.items() if k != "params"})


def log_group(models: List[dict], results: Dict[str, dict]):
    for m in models:
        r = results[m["key"]]
        if "error" in r:
            log(f"  {m['label']}: FAILED: {r['error']}")
        else:
            mem = f"{r['train_peak_bytes'] / 2**20:.0f} MiB peak" if "train_peak_bytes" in r else "no memory"
            log(f"  {m['label']}: {r['params'] / 1e6:.2f}M params, {r['train_tok_s']:.0f} tok/s train, "
                f"{mem}, {r['decode_sent_s']:.2f} sent/s decode")


def write_outputs(report: str, results: Dict[str, dict], output, json_path):
    print(report)
    if output:
        Path(output).write_text(report)
        log(f"wrote {output}")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1))


def main(argv=None, description="", epilog=""):
    from man_fairseq.logging_setup import quiet_logging

    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = build_parser(description, epilog)
    args = p.parse_args(argv)
    settings = resolve_settings(p, args)
    runs, skipped = plan_runs(p, args.cases, settings)
    groups = group_runs(runs, settings)
    results: Dict[str, dict] = {}
    started = time.time()
    load_before = os.getloadavg()
    commit = git_commit()  # the code measured: the tree may change while a long run goes on
    for (width, backend), models in groups.items():
        log(f"width {width}, backend {backend}: timing {len(models)} models interleaved batch by batch: "
            + ", ".join(m["label"] for m in models))
        measure_group(settings, width, models, results)
        log_group(models, results)
    report = render(ReportInput(settings=settings, runs=runs, results=results, skipped=skipped,
                                load_before=load_before, elapsed=time.time() - started, commit=commit))
    write_outputs(report, results, args.output, args.json)
    return 0
