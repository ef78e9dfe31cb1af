"""Where a calibrated model's training update goes, on a study's real batches: calibration's
cost per update with its two passes' shares.

``python -m man_fairseq.recipes.studies.calibration_passes EXPERIMENT`` builds the study's calibration
and Transformer configs exactly as ``fairseq-train`` would (the launcher's arguments, parsed by
fairseq), reads the study's training batches in fairseq's order with seed 1, and times the parts of
each update on the same batches, one model after the other per batch:

* calibration: the calibrated pass forward (``model(**net_input)`` and its loss), the perturbation pass
  forward (``criterion.perturbation_loss``: the decoder again, on the detached encoder output), then
  the backward of each term on its own. The two terms share no graph (the perturbation pass reads
  detached copies of every decoder parameter but theta_m, the calibrated pass reads theta_m detached),
  so the two backwards write the gradients one joint ``backward()`` writes (tests/test_calibration_passes.py);
* the Transformer: forward and its loss, backward.

No optimizer step (the same Adam for both, on 1.09x the parameters) and no data loading are timed.
Threads: ``torch.set_num_threads(--threads)``. Records: ``RESULTS/speed/EXPERIMENT-calibration-passes.json``
(every batch's times) and the Markdown table it prints.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from man_fairseq.logging_setup import quiet_logging
from man_fairseq.provenance import cpu_model, git_commit
from man_fairseq.tables import markdown_table
from man_fairseq.recipes.config import REPO, load_config
from man_fairseq.recipes.options import number
from man_fairseq.recipes.studies.experiments import EXPERIMENTS, missing_data

PHASES = {
    "calibration": ["calibrated forward", "perturbation forward", "calibrated backward", "perturbation backward"],
    "transformer": ["forward", "backward"],
}


def build(cfg, data, extra=()):
    """(task, model, criterion, fairseq cfg) of a study config, parsed as fairseq-train parses it
    (``extra``: more fairseq-train arguments)."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from man_fairseq.recipes.training.launch import train_args

    argv = train_args(cfg, "/nonexistent-save-dir", device="cpu", precision="fp32", data=data, extra=["--seed", 1, *extra])
    parser = options.get_training_parser()
    fs_cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, argv))
    utils.import_user_module(fs_cfg.common)
    task = tasks.setup_task(fs_cfg.task)
    model = task.build_model(fs_cfg.model)
    criterion = task.build_criterion(fs_cfg.criterion)
    return task, model, criterion, fs_cfg


def batches(task, model, fs_cfg, count):
    """The first ``count`` training batches of epoch 1, in fairseq-train's order (seed 1)."""
    from fairseq import utils

    task.load_dataset("train", combine=False, epoch=1)
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=fs_cfg.dataset.max_tokens,
        max_sentences=fs_cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, required_batch_size_multiple=fs_cfg.dataset.required_batch_size_multiple,
        seed=fs_cfg.common.seed, num_workers=0, epoch=1,
    ).next_epoch_itr(shuffle=True)
    return [next(itr) for _ in range(count)]


def calibration_update(model, criterion, sample):
    """One calibrated update's forward and backward, each term apart: {phase: seconds}."""
    t0 = time.perf_counter()
    _, loss, _, encoder_out = criterion.calibrated_pass(model, sample)
    t1 = time.perf_counter()
    objective = criterion.perturbation_loss(model, sample, encoder_out, True)[0]
    t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    objective.backward()
    t4 = time.perf_counter()
    return dict(zip(PHASES["calibration"], (t1 - t0, t2 - t1, t3 - t2, t4 - t3)))


def transformer_update(model, criterion, sample):
    t0 = time.perf_counter()
    loss, _, _ = criterion(model, sample)
    t1 = time.perf_counter()
    loss.backward()
    return dict(zip(PHASES["transformer"], (t1 - t0, time.perf_counter() - t1)))


def measure(experiment, data, n_batches, warmup, threads):
    """The record: every timed batch's phases for both models, the same batches for both."""
    import torch

    torch.set_num_threads(threads)
    commit, loadavg = git_commit(), list(os.getloadavg())  # the code measured, the machine before
    exp = EXPERIMENTS[experiment]
    built = {fam: build(load_config(exp["configs"] / f"{fam}.yaml"), data) for fam in PHASES}
    samples = batches(built["calibration"][0], built["calibration"][1], built["calibration"][3], warmup + n_batches)
    run = {"calibration": calibration_update, "transformer": transformer_update}
    times = {fam: [] for fam in PHASES}
    for i, sample in enumerate(samples):
        for fam in PHASES:  # interleaved per batch: a drift of the machine hits both alike
            torch.manual_seed(i)
            _, model, criterion, _ = built[fam]
            model.train()
            model.zero_grad(set_to_none=True)
            phases = run[fam](model, criterion, sample)
            if i >= warmup:
                times[fam].append(phases)
    return {"kind": "calibration-passes", "experiment": experiment, "threads": threads, "commit": commit,
            "cpu": cpu_model(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_before": loadavg,
            "loadavg_after": list(os.getloadavg()),
            "batches": n_batches, "warmup": warmup, "data": str(data),
            "target_tokens": [int(s["ntokens"]) for s in samples[warmup:]], "times": times}


def to_markdown(record):
    """Median seconds per batch of each phase, and its share of the Transformer's forward + backward."""
    med = {fam: {ph: statistics.median(b[ph] for b in record["times"][fam]) for ph in PHASES[fam]} for fam in PHASES}
    base = sum(med["transformer"].values())
    total = sum(med["calibration"].values())
    lines = [f"Calibration's training update by part, {record['experiment']}: median seconds over "
             f"{record['batches']} real batches (after {record['warmup']} warm-up), {record['threads']} thread(s), "
             f"{record['cpu']}, commit {record['commit']}, load average {record['loadavg_before'][0]:.2f} before, "
             f"{record['loadavg_after'][0]:.2f} after; "
             "forward and backward only (no optimizer step).", ""]
    lines += markdown_table(["model", "part", "seconds", "× Transformer's forward + backward"],
                            [[fam, ph, f"{med[fam][ph]:.3f}", f"{med[fam][ph] / base:.2f}"]
                             for fam in ("transformer", "calibration") for ph in PHASES[fam]]
                            + [["calibration", "**all**", f"{total:.3f}", f"**{total / base:.2f}**"]], "llrr")
    return "\n".join(lines) + "\n"


def main(argv=None):
    import fairseq  # noqa: F401  (its import sets the root logger to DEBUG, which quiet_logging undoes)

    quiet_logging()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                prog="python -m man_fairseq.recipes.studies.calibration_passes")
    p.add_argument("experiment", choices=sorted(e for e in EXPERIMENTS
                                                if (EXPERIMENTS[e]["configs"] / "calibration.yaml").is_file()))
    p.add_argument("--batches", type=number("--batches", low=1), default=20, help="timed batches")
    p.add_argument("--warmup", type=number("--warmup", low=0), default=2, help="untimed batches first")
    p.add_argument("--threads", type=number("--threads", low=1), default=1)
    p.add_argument("--data", default=None, help="binarized data (default: the study's data-bin)")
    p.add_argument("--output", default=None,
                   help="the record (default: results/speed/EXPERIMENT-calibration-passes.json)")
    p.add_argument("--force", action="store_true", help="replace an existing record")
    args = p.parse_args(argv)
    data = Path(args.data or EXPERIMENTS[args.experiment]["data"])
    if problem := missing_data(args.experiment, data):
        p.error(problem)
    output = Path(args.output or REPO / "results" / "speed" / f"{args.experiment}-calibration-passes.json")
    if output.is_dir():
        p.error(f"--output: {output} is a folder")
    if output.exists() and not args.force:
        p.error(f"--output: {output} exists; pass --force to replace it")
    record = measure(args.experiment, data, args.batches, args.warmup, args.threads)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=1) + "\n")
    print(to_markdown(record))
    print(f"record: {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
