"""Where one training update of each family goes, on a study's real batches: ``torch.profiler``
tables, on the CPU or a GPU.

``python -m man_fairseq.recipes.studies.profile_update EXPERIMENT --families transformer,man``
builds each family's study config as ``fairseq-train`` would (:func:`.calibration_passes.build`),
reads the same first training batches (seed 1), runs ``--warmup`` untimed updates (forward, loss,
backward; no optimizer step), then times ``--batches`` updates (device synchronised) and profiles
them. On CUDA the model is cast to ``--precision`` as fairseq's ``--bf16``/``--fp16`` do
(``model.half()``: the whole model, not autocast; no loss scale, which changes no op).

Besides the study's families, ``core`` is fairseq's Transformer of the study with every attention
replaced by the plugin's attention core and no bias (the study's localness config with
``--localness-layers ""``): against it a family's ratio is its method's cost, against
``transformer`` also the difference between the plugin's core and fairseq's ``MultiheadAttention``.

Writes one Markdown file (``--output``): per family the milliseconds per update, the top ops by
self time on the device (CUDA kernels on a GPU, CPU ops on the CPU) and the host ops that wait for
the device (``item``, ``nonzero``, ...). Nothing is timed in the tests; the tables are for reading.
"""

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

from man_fairseq.logging_setup import quiet_logging
from man_fairseq.provenance import cpu_model, git_commit
from man_fairseq.tables import markdown_table
from man_fairseq.recipes.config import load_config
from man_fairseq.recipes.options import number
from lab.speed.passes import batches, build
from man_fairseq.recipes.studies.experiments import EXPERIMENTS, missing_data

CORE = "core"
CORE_ARGS = ["--localness-layers", ""]  # the localness config with no localness: the core, no bias
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")


def family_config(experiment, family):
    """(config, extra fairseq arguments) of a family name, ``core`` included."""
    configs = EXPERIMENTS[experiment]["configs"]
    if family == CORE:
        return load_config(configs / "localness.yaml"), CORE_ARGS
    return load_config(configs / f"{family}.yaml"), []


def profile_family(experiment, family, data, device, precision, n_batches, warmup, row_limit):
    """{ms_per_update: [...], table: str, syncs_per_update: {op: n}, parameters: int}."""
    import torch
    from fairseq import utils

    cfg, extra = family_config(experiment, family)
    task, model, criterion, fs_cfg = build(cfg, str(data), extra=extra)
    samples = batches(task, model, fs_cfg, warmup + n_batches)
    if device == "cuda":
        model = model.cuda()
        model = {"bf16": model.bfloat16, "fp16": model.half}.get(precision, lambda: model)()
        samples = [utils.move_to_cuda(s) for s in samples]
    model.train()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def update(sample):
        loss, _, _ = criterion(model, sample)
        loss.backward()
        model.zero_grad(set_to_none=True)

    for sample in samples[:warmup]:
        update(sample)
    times = []
    for sample in samples[warmup:]:
        sync()
        start = time.perf_counter()
        update(sample)
        sync()
        times.append((time.perf_counter() - start) * 1000)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for sample in samples[warmup:]:
            update(sample)
        sync()
    sort = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    syncs = {e.key: e.count / n_batches for e in events if e.key in SYNC_OPS}
    return {
        "ms_per_update": times,
        "syncs_per_update": syncs,
        "parameters": sum(p.numel() for p in model.parameters()),
        "table": events.table(sort_by=sort, row_limit=row_limit, max_name_column_width=60),
    }


def to_markdown(meta, results):
    base = statistics.median(results["transformer"]["ms_per_update"]) if "transformer" in results else None
    lines = [f"# One training update per family: {meta['experiment']}, {meta['device']} {meta['precision']}", "",
             f"`{meta['command']}`, commit {meta['commit']}, {meta['cpu']}, {meta['date']}; "
             f"{meta['batches']} profiled updates after {meta['warmup']} warm-up ones, the same batches "
             "for every family (forward, loss, backward; no optimizer step).", ""]
    rows = []
    for fam, r in results.items():
        ms = r["ms_per_update"]
        ratio = f"{base / statistics.median(ms):.2f}×" if base else "—"
        syncs = ", ".join(f"{k.removeprefix('aten::')} {v:g}" for k, v in sorted(r["syncs_per_update"].items())) or "0"
        rows.append([fam, f"{r['parameters']:,}", f"{statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f})", ratio,
                     syncs])
    lines += markdown_table(["family", "parameters", "ms per update (median; min-max)", "× Transformer's speed",
                             "host syncs per update"], rows, "lrrrl")
    for fam, r in results.items():
        lines += ["", f"## {fam}", "", "```", r["table"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    import fairseq  # noqa: F401  (its import sets the root logger to DEBUG, which quiet_logging undoes)

    quiet_logging()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                prog="python -m man_fairseq.recipes.studies.profile_update")
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--families", default="transformer,core,man",
                   help="comma-separated study families, and 'core' (default: transformer,core,man)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="on CUDA: the model's dtype (the CPU profiles fp32)")
    p.add_argument("--batches", type=number("--batches", low=1), default=3, help="profiled updates")
    p.add_argument("--warmup", type=number("--warmup", low=0), default=2, help="untimed updates first")
    p.add_argument("--threads", type=number("--threads", low=1), default=1)
    p.add_argument("--rows", type=number("--rows", low=1), default=25, help="ops per table")
    p.add_argument("--data", default=None, help="binarized data (default: the study's data-bin)")
    p.add_argument("--output", required=True, help="the Markdown file to write (never replaced)")
    args = p.parse_args(argv)
    import torch

    configs = EXPERIMENTS[args.experiment]["configs"]
    families = [f for f in args.families.split(",") if f]
    for fam in families:
        if fam != CORE and not (configs / f"{fam}.yaml").is_file():
            p.error(f"--families: {args.experiment} has no config {fam}.yaml (and 'core' is the only other name)")
    if CORE in families and not (configs / "localness.yaml").is_file():
        p.error(f"--families: 'core' is built from {args.experiment}'s localness.yaml, which it does not have")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    if args.device == "cpu" and args.precision != "fp32":
        p.error("--precision: the CPU profiles fp32 only")
    data = Path(args.data or EXPERIMENTS[args.experiment]["data"])
    if problem := missing_data(args.experiment, data):
        p.error(problem)
    output = Path(args.output)
    if output.exists():
        p.error(f"--output: {output} exists; it is not replaced")
    torch.set_num_threads(args.threads)
    results = {}
    for fam in families:
        print(f"[profile] {fam} ...", file=sys.stderr, flush=True)
        results[fam] = profile_family(args.experiment, fam, data, args.device, args.precision, args.batches,
                                      args.warmup, args.rows)
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {args.threads} thread(s)"
    meta = {"experiment": args.experiment, "device": device, "precision": args.precision,
            "command": "python -m man_fairseq.recipes.studies.profile_update " + " ".join(sys.argv[1:] if argv is None else argv),
            "commit": git_commit(), "cpu": cpu_model(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "batches": args.batches,
            "warmup": args.warmup}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(to_markdown(meta, results))
    print(f"wrote {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
