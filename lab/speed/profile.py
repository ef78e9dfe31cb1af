"""``scripts/speed.sh profile EXPERIMENT``: where one training update of each family goes, on a study's real
batches: by op (``torch.profiler`` tables, CPU or GPU) and, ``--passes``, calibration's update by phase.

Each family's study config is built as fairseq-train builds it (:func:`.model.build`) on the same first
training batches (seed 1), the families taking turns on every batch; an update is forward, loss and
backward (no optimizer step, no data loading). ``core`` is fairseq's Transformer with every attention
replaced by the plugin's core and no bias (the study's localness config with ``--localness-layers ""``):
against it a family's ratio is its method's cost. ``man-nobias`` is MAN with its DMAN sublayer a plain
self-attention: against it MAN's ratio is its bias's cost, against the Transformer its layers' (``DERIVED``).
On CUDA the model is cast to ``--precision`` as ``--bf16``/``--fp16`` cast it (the whole model; no loss
scale, which changes no op).

``--passes`` times calibration's parts against the Transformer's: the calibrated pass forward, the
perturbation pass forward (the decoder again, on the detached encoder output), then each term's backward
on its own; the two terms share no graph, so the two backwards write the gradients one joint
``backward()`` writes (tests/test_calibration_passes.py). Record: the study's (:mod:`.records`), its runs
each batch's phases, ``RESULTS/speed/EXPERIMENT-calibration-passes.json``, written whole or not at all.
"""

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

from lab.speed import records
from lab.speed.model import build, config_argv
from man_recipes.config import REPO, load_config
from man_recipes.options import number, workers
from man_recipes.paths import output_folder_problem
from man_recipes.studies.experiments import EXPERIMENTS, missing_data
from man_recipes.tables import markdown_table

CORE = "core"
# Families made from a study config with other options: (config, extra fairseq arguments, what it is).
DERIVED = {
    CORE: ("localness", ["--localness-layers", ""], "the localness config with no localness: the core, no bias"),
    "man-nobias": ("man", ["--encoder-sublayers", "san,san,ffn"],
                   "MAN with its DMAN sublayer a plain self-attention: what MAN would cost if its bias were free"),
    "man-sdpa": ("man", ["--attention-backend", "sdpa"], "MAN with DMAN through PyTorch's math kernel"),
}
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")
PHASES = {"calibration": ["calibrated forward", "perturbation forward", "calibrated backward", "perturbation backward"],
          "transformer": ["forward", "backward"]}


def family_config(experiment, family):
    """(config, extra fairseq arguments) of a family name, the ``DERIVED`` ones included."""
    configs = EXPERIMENTS[experiment]["configs"]
    if family in DERIVED:
        base, extra, _ = DERIVED[family]
        return load_config(configs / f"{base}.yaml"), list(extra)
    return load_config(configs / f"{family}.yaml"), []


class EpochTooShort(ValueError):
    """The training split makes fewer batches than asked for (``batches``: how many it makes)."""

    def __init__(self, batches):
        super().__init__(batches)
        self.batches = batches


def batches(task, model, fs_cfg, count):
    """The first ``count`` training batches of epoch 1, in fairseq-train's order (seed 1);
    :class:`EpochTooShort` when the epoch has fewer."""
    from fairseq import utils

    task.load_dataset("train", combine=False, epoch=1)
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=fs_cfg.dataset.max_tokens, max_sentences=fs_cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, required_batch_size_multiple=fs_cfg.dataset.required_batch_size_multiple,
        seed=fs_cfg.common.seed, num_workers=0, epoch=1).next_epoch_itr(shuffle=True)
    if count > len(itr):  # its next() would end in StopIteration
        raise EpochTooShort(len(itr))
    return [next(itr) for _ in range(count)]


def calibration_update(model, criterion, sample, sync=lambda: None):
    """One calibrated update's forward and backward, each term apart: {phase: seconds} (``sync``: the device's)."""
    t0 = time.perf_counter()
    _, loss, _, encoder_out = criterion.calibrated_pass(model, sample)
    sync()
    t1 = time.perf_counter()
    objective = criterion.perturbation_loss(model, sample, encoder_out, True)[0]
    sync()
    t2 = time.perf_counter()
    loss.backward()
    sync()
    t3 = time.perf_counter()
    objective.backward()
    sync()
    return dict(zip(PHASES["calibration"], (t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3)))


def plain_update(model, criterion, sample, sync=lambda: None):
    t0 = time.perf_counter()
    loss, _, _ = criterion(model, sample)
    sync()
    t1 = time.perf_counter()
    loss.backward()
    sync()
    return dict(zip(PHASES["transformer"], (t1 - t0, time.perf_counter() - t1)))


def time_updates(built, samples, warmup, sync, split_calibration):
    """{family: [{phase: seconds} per timed batch]}: every batch, the families in turn (a drift of the
    machine hits them alike), each from the same random state."""
    import torch

    times = {fam: [] for fam in built}
    for i, sample in enumerate(samples):
        for fam, (_, model, criterion, _) in built.items():
            torch.manual_seed(i)
            model.train()
            model.zero_grad(set_to_none=True)
            sync()
            update = calibration_update if split_calibration and fam == "calibration" else plain_update
            phases = update(model, criterion, sample, sync)
            if i >= warmup:
                times[fam].append(phases)
    return times


def op_table(model, criterion, samples, device, n_batches, row_limit, sync):
    """The profiler's ops of ``samples``' updates: (table, host syncs per update)."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for sample in samples:
            plain_update(model, criterion, sample)
            model.zero_grad(set_to_none=True)
        sync()
    events = prof.key_averages()
    return (events.table(sort_by="self_device_time_total" if device == "cuda" else "self_cpu_time_total",
                         row_limit=row_limit, max_name_column_width=60),
            {e.key: e.count / n_batches for e in events if e.key in SYNC_OPS})


def profile_markdown(record, built, times, tables):
    ms = {fam: [sum(b.values()) * 1000 for b in times[fam]] for fam in built}
    base = statistics.median(ms["transformer"]) if "transformer" in ms else None
    device = record["gpu"] or f"CPU, {record['threads']} thread(s)"
    lines = [f"# One training update per family: {record['experiment']}, {device} {record['precision']}", "",
             f"`{record['command']}`, commit {record['commit']}, {record['cpu']}, {record['date']}; "
             f"{record['settings']['batches']} profiled updates after {record['settings']['warmup']} warm-up ones, "
             "the same batches for every family (forward, loss, backward; no optimizer step).", ""]
    rows = [[fam, f"{sum(p.numel() for p in built[fam][1].parameters()):,}",
             f"{statistics.median(m):.1f} ({min(m):.1f}-{max(m):.1f})",
             f"{base / statistics.median(m):.2f}×" if base else "—",
             ", ".join(f"{k.removeprefix('aten::')} {v:g}" for k, v in sorted(tables[fam][1].items())) or "0"]
            for fam, m in ms.items()]
    lines += markdown_table(["family", "parameters", "ms per update (median; min-max)", "× Transformer's speed",
                             "host syncs per update"], rows, "lrrrl")
    for fam in built:
        lines += ["", f"## {fam}", "", "```", tables[fam][0].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def passes_markdown(record):
    """Median seconds per batch of each phase, and its share of the Transformer's forward + backward."""
    med = {fam: {ph: statistics.median(r["phases"][ph] for r in record["runs"] if r["family"] == fam)
                 for ph in PHASES[fam]} for fam in PHASES}
    base, total = sum(med["transformer"].values()), sum(med["calibration"].values())
    lines = [f"Calibration's training update by part, {record['experiment']}: median seconds over "
             f"{record['settings']['batches']} real batches (after {record['settings']['warmup']} warm-up), "
             f"{record['threads']} thread(s), "
             f"{record['cpu']}, commit {record['commit']}, load average {record['loadavg_before'][0]:.2f} before, "
             f"{record['loadavg_after'][0]:.2f} after; forward and backward only (no optimizer step).", ""]
    lines += markdown_table(["model", "part", "seconds", "× Transformer's forward + backward"],
                            [[fam, ph, f"{med[fam][ph]:.3f}", f"{med[fam][ph] / base:.2f}"]
                             for fam in ("transformer", "calibration") for ph in PHASES[fam]]
                            + [["calibration", "**all**", f"{total:.3f}", f"**{total / base:.2f}**"]], "llrr")
    return "\n".join(lines) + "\n"


def parse(argv, prog):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--passes", action="store_true", help="calibration's update by phase against the Transformer's")
    p.add_argument("--families", default="transformer,core,man",
                   help="comma-separated study families, and "
                        + "; ".join(f"'{name}' ({what})" for name, (_, _, what) in DERIVED.items())
                        + " (default: transformer,core,man; --passes: transformer,calibration)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="on CUDA: the model's dtype (the CPU profiles fp32)")
    p.add_argument("--batches", type=number("--batches", low=1), default=None,
                   help="timed updates (default 3; --passes: 20)")
    p.add_argument("--warmup", type=number("--warmup", low=0), default=2, help="untimed updates first")
    p.add_argument("--threads", type=workers("--threads"), default=1)
    p.add_argument("--cudnn-attention", choices=("on", "off"), default="on",
                   help="on CUDA, off: torch.backends.cuda.enable_cudnn_sdp(False), so that SDPA never takes "
                        "cuDNN's kernel (which builds a graph for every new shape; default %(default)s: torch's choice)")
    p.add_argument("--rows", type=number("--rows", low=1), default=25, help="ops per table")
    p.add_argument("--data", default=None, help="binarized data (default: the study's data-bin)")
    p.add_argument("--output", default=None, help="the Markdown file to write (never replaced); --passes: the record "
                                                  "(default: results/speed/EXPERIMENT-calibration-passes.json)")
    p.add_argument("--force", action="store_true", help="--passes: replace an existing record")
    args = p.parse_args(argv)
    configs = EXPERIMENTS[args.experiment]["configs"]
    if args.passes and args.families != p.get_default("families"):
        p.error("--families: --passes compares calibration with the Transformer")
    args.families = list(PHASES) if args.passes else [f for f in args.families.split(",") if f]
    for fam in args.families:
        if fam not in DERIVED and not (configs / f"{fam}.yaml").is_file():
            p.error(f"--passes: {args.experiment} has no config {fam}.yaml" if args.passes else
                    f"--families: {args.experiment} has no config {fam}.yaml (and the other names are "
                    f"{', '.join(DERIVED)})")
        if fam in DERIVED and not (configs / f"{DERIVED[fam][0]}.yaml").is_file():
            p.error(f"--families: '{fam}' is built from {args.experiment}'s {DERIVED[fam][0]}.yaml, "
                    "which it does not have")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device")
    if args.device == "cpu" and args.precision != "fp32":
        p.error("--precision: the CPU profiles fp32 only")
    if args.device == "cpu" and args.cudnn_attention == "off":
        p.error("--cudnn-attention: a CUDA option (the CPU has no cuDNN attention)")
    if args.passes and args.device != "cpu":
        p.error("--passes: timed on the CPU")
    args.data = Path(args.data or EXPERIMENTS[args.experiment]["data"])
    if problem := missing_data(args.experiment, args.data):
        p.error(problem)
    if args.passes:
        args.output = Path(args.output or REPO / "results" / "speed" / f"{args.experiment}-calibration-passes.json")
        if args.output.is_dir():
            p.error(f"--output: {args.output} is a folder")
        if args.output.exists() and not args.force:
            p.error(f"--output: {args.output} exists; pass --force to replace it")
    elif args.output is None:
        p.error("--output: the Markdown file to write")
    elif Path(args.output).exists():
        p.error(f"--output: {args.output} exists; it is not replaced")
    args.output, args.batches = Path(args.output), args.batches or (20 if args.passes else 3)
    if problem := output_folder_problem(args.output.absolute().parent):  # found before profiling, not after it
        p.error(f"--output {args.output}: {problem}")
    return args


def main(argv=None, prog="scripts/speed.sh profile"):
    import fairseq  # noqa: F401  (its import sets the root logger to DEBUG, which quiet_logging undoes)
    import torch
    from fairseq import utils

    from man_recipes.logging_setup import quiet_logging

    quiet_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv, prog)
    torch.set_num_threads(args.threads)
    if args.cudnn_attention == "off":
        torch.backends.cuda.enable_cudnn_sdp(False)
    built, configs = {}, {}
    for fam in args.families:
        print(f"[profile] {fam} ...", file=sys.stderr, flush=True)
        cfg, extra = family_config(args.experiment, fam)
        built[fam], configs[fam] = build(config_argv(cfg, str(args.data), extra)), cfg["_path"]
    cuda = args.device == "cuda"
    # the study's record (the code measured, the machine before): --passes adds each batch's phases as its runs
    record = records.new_record(args.experiment, {"threads": args.threads, "device": args.device,
                                                  "precision": args.precision}, f"{prog} " + shlex.join(argv),
                                args.data, configs, {"batches": args.batches, "warmup": args.warmup, "seed": 1,
                                 "cudnn_attention": args.cudnn_attention},
                                torch.cuda.get_device_name() if cuda else None)
    first = next(iter(built.values()))
    try:
        samples = batches(first[0], first[1], first[3], args.warmup + args.batches)
    except EpochTooShort as e:  # the same batches every family: what one epoch holds is the ceiling
        print(f"{prog}: error: --warmup {args.warmup} + --batches {args.batches} updates: {args.data}'s training "
              f"split makes {e.batches} batches in an epoch; ask for at most {e.batches}", file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        samples = [utils.move_to_cuda(s) for s in samples]
        for fam, (task, model, criterion, fs_cfg) in built.items():
            model = model.cuda()
            built[fam] = (task, {"bf16": model.bfloat16, "fp16": model.half}.get(args.precision, lambda: model)(),
                          criterion, fs_cfg)
    times = time_updates(built, samples, args.warmup, sync, args.passes)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.passes:
        record["runs"] = [{"batch": i + 1, "family": fam, "target_tokens": int(samples[args.warmup + i]["ntokens"]),
                           "phases": phases} for fam in PHASES for i, phases in enumerate(times[fam])]
        records.finish(record)
        records.write_json(args.output, record)
        print(passes_markdown(record))
        print(f"record: {args.output}", file=sys.stderr)
        return 0
    tables = {fam: op_table(model, criterion, samples[args.warmup:], args.device, args.batches, args.rows, sync)
              for fam, (_, model, criterion, _) in built.items()}
    args.output.write_text(profile_markdown(record, built, times, tables))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0
