"""Build and run the fairseq-train command of a recipe config (``scripts/train.sh``).

The paper's effective batch is ``max-tokens x paper_gpus x paper_update_freq``. Whatever the
number of processes we run on, ``--update-freq`` is chosen so that product stays the same
(``update_freq = paper_gpus * paper_update_freq / world_size``), and the run records the
effective batch it really got. Multi-GPU runs go through fairseq's own distributed training:
``torchrun`` (fairseq reads RANK/WORLD_SIZE/LOCAL_RANK) or SLURM (``srun`` + ``--distributed-port``,
fairseq reads the SLURM_* variables). Multi-process CPU runs (gloo) go through
:mod:`man_recipes.training.torchrun_cpu`, because fairseq's torchrun path divides the rank by
``torch.cuda.device_count()`` and so cannot start without a GPU.
"""

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import yaml

from man_recipes.config import REPO, load_config, option_args
from man_recipes.options import PRECISION_HELP, PRECISIONS, precision_args, resolve_precision, visible_gpus  # noqa: F401
from man_recipes.tools import echo, run_tool, tool_env
from man_recipes.logging_setup import quiet_logging
from man_recipes.paths import USER_DIR
from man_recipes.interrupt import one_line_on_ctrl_c


def split_fairseq_args(argv):
    """``(ours, fairseq's)``: the command line split at the first ``--`` (what follows goes to
    fairseq-train unchanged); ``argv`` None means ``sys.argv[1:]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def effective_batch_units(cfg):
    """The paper's effective batch in units of one GPU's ``max-tokens``."""
    return cfg["batch"]["paper_gpus"] * cfg["batch"]["paper_update_freq"]


def update_freq_for(cfg, world_size):
    """(update_freq, effective units actually obtained, warning or None) for ``world_size`` processes."""
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    units = effective_batch_units(cfg)
    update_freq = max(1, int(round(units / world_size)))
    got = update_freq * world_size
    warning = None
    if got != units:
        warning = (f"effective batch differs from the paper: {world_size} processes x update-freq "
                   f"{update_freq} = {got} x max-tokens, paper {units} x max-tokens")
    return update_freq, got, warning


def train_args(cfg, save_dir, world_size=1, device="gpu", precision="fp16", data=None, extra=()):
    """fairseq-train arguments (without the program name) for ``cfg``."""
    update_freq, _, _ = update_freq_for(cfg, world_size)
    argv = [
        str(data or cfg["data"]),
        "--user-dir", USER_DIR,
        "--task", cfg.get("task", "translation"),
        "--arch", cfg["arch"],
    ]
    if cfg.get("source_lang"):
        argv += ["--source-lang", cfg["source_lang"], "--target-lang", cfg["target_lang"]]
    argv += option_args(cfg.get("model"))
    argv += option_args(cfg["train"])
    argv += ["--update-freq", str(update_freq), "--save-dir", str(save_dir)]
    argv += precision_args(device, precision)
    if device == "cpu" and world_size > 1:
        # DDP's c10d wrapper insists on device_ids for fairseq's call; the legacy wrapper
        # all-reduces gradients itself and works on CPU tensors with gloo.
        argv += ["--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
    return argv + [str(a) for a in extra]


def launch_command(cfg, save_dir, nproc=1, launcher="torchrun", device="gpu", precision="fp16",
                   data=None, extra=(), nnodes=1, master_port=None):
    """The full command line: a single process, torchrun, or srun."""
    world_size = nproc * nnodes
    fargs = train_args(cfg, save_dir, world_size, device, precision, data, extra)
    if world_size == 1:
        return ["fairseq-train"] + fargs
    if launcher == "torchrun":
        cmd = ["torchrun", f"--nproc_per_node={nproc}"]
        if nnodes == 1:
            cmd += ["--standalone"] + ([f"--master_port={master_port}"] if master_port else [])
        else:
            addr = os.environ.get("MASTER_ADDR")
            if not addr:
                raise ValueError("multi-node torchrun needs MASTER_ADDR (the first node's address) "
                                 "in the environment of every node")
            port = master_port or os.environ.get("MASTER_PORT", "29500")
            cmd += [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={addr}:{port}"]
        if device == "cpu":
            return cmd + ["-m", "man_recipes.training.torchrun_cpu"] + fargs
        # fairseq skips distributed set-up when its default world size (the local GPU count)
        # is 1, e.g. one GPU per node on several nodes: state the world size explicitly.
        return cmd + ["-m", "fairseq_cli.train"] + fargs + ["--distributed-world-size", str(world_size)]
    if launcher == "slurm":
        # One task per GPU; fairseq derives rank/world size from SLURM_* and the port.
        return (["srun", f"--ntasks-per-node={nproc}", f"--nodes={nnodes}", "fairseq-train"] + fargs
                + ["--distributed-world-size", str(world_size),
                   "--distributed-port", str(master_port or 12597)])
    raise ValueError(f"launcher must be torchrun or slurm, got {launcher!r}")


@one_line_on_ctrl_c("scripts/train.sh", "fairseq-train keeps its last checkpoint: the same command again resumes from it")
def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(
        prog="scripts/train.sh",
        description="Train one recipe config (one paper table row) with fairseq-train.",
    )
    p.add_argument("config", help="configs/<name>.yaml (or just <name>)")
    p.add_argument("--gpus", type=int, default=None,
                   help="processes per node (default: all visible GPUs; 1 process on CPU)")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--cpu", action="store_true", help="train on CPU (smoke runs)")
    p.add_argument("--launcher", choices=["torchrun", "slurm"], default=None,
                   help="default: slurm inside a SLURM allocation, torchrun otherwise")
    p.add_argument("--precision", choices=PRECISIONS, default=None, help=PRECISION_HELP)
    p.add_argument("--data", default=None, help="override the config's data-bin directory")
    p.add_argument("--run-dir", default=None, help="default: runs/<config name>")
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("--dry-run", action="store_true", help="print the command and write run.json only")
    p.epilog = "Options after '--' go to fairseq-train unchanged (they override the config)."
    argv, extra = split_fairseq_args(argv)
    args = p.parse_args(argv)
    args.precision = resolve_precision(p, args.precision, args.cpu)

    try:
        return train(load_config(args.config), args.run_dir, data=args.data, nproc=args.gpus, nnodes=args.nnodes,
                     cpu=args.cpu, launcher=args.launcher, precision=args.precision, master_port=args.master_port,
                     extra=extra, dry_run=args.dry_run)
    except LaunchError as e:
        sys.exit(str(e))


class LaunchError(RuntimeError):
    """What stops a launch before fairseq-train starts; ``main`` exits with it as its message."""


def train(cfg, run_dir=None, data=None, nproc=None, nnodes=1, cpu=False, launcher=None, precision="fp16",
          master_port=None, seed=None, extra=(), dry_run=False) -> int:
    """The train step: fairseq-train for the loaded config ``cfg`` into ``run_dir`` (default
    ``runs/<config name>``), its ``run.json``, ``config.yaml`` and ``train.log`` beside the
    checkpoints; returns fairseq-train's exit code. ``seed`` comes after the config's options (it
    overrides theirs), ``extra`` (fairseq options) after it. A run folder whose checkpoints were
    trained by another command is refused (:class:`LaunchError`), not resumed."""
    device = "cpu" if cpu else "gpu"
    nproc = nproc if nproc is not None else (1 if cpu else max(1, visible_gpus()))
    if device == "gpu" and visible_gpus() == 0 and not dry_run:
        raise LaunchError("no GPU visible: pass --cpu for a CPU smoke run (or --dry-run to see the command)")
    launcher = launcher or ("slurm" if "SLURM_JOB_ID" in os.environ else "torchrun")
    run_dir = Path(run_dir or REPO / "runs" / cfg["name"]).resolve()
    save_dir = run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    extra = (["--seed", str(seed)] if seed is not None else []) + [str(a) for a in extra]

    world = nproc * nnodes
    update_freq, units, warning = update_freq_for(cfg, world)
    cmd = launch_command(cfg, save_dir, nproc, launcher, device, precision, data, extra, nnodes, master_port)
    if warning:
        print(f"WARNING: {warning}", file=sys.stderr)
    previous = run_dir / "run.json"
    if previous.is_file() and (save_dir / "checkpoint_last.pt").is_file():
        # fairseq would resume these checkpoints under the new options and run.json would lose
        # the record of how they were trained: only the same command may continue a run.
        before = json.loads(previous.read_text()).get("command")
        if before != cmd:
            raise LaunchError(f"{run_dir} holds checkpoints of another command ({previous}); resume with the "
                              "same config and options, or pass another --run-dir")
    record = {
        "config": cfg["_path"], "name": cfg["name"], "world_size": world, "update_freq": update_freq,
        "effective_batch_tokens": units * int(cfg["train"]["max-tokens"]),
        "paper_effective_batch_tokens": effective_batch_units(cfg) * int(cfg["train"]["max-tokens"]),
        "device": device, "precision": "fp32" if device == "cpu" else precision,
        "data": str(data or cfg["data"]), "config_data": str(cfg["data"]),
        # everything that makes this run differ from the config, for results_table.py
        "overrides": extra, "command": cmd,
    }
    (run_dir / "run.json").write_text(json.dumps(record, indent=2) + "\n")
    resolved = {k: v for k, v in cfg.items() if not k.startswith("_")}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    print("+ " + shlex.join(str(c) for c in cmd), flush=True)  # runs as printed: --adam-betas '(0.9, 0.98)'
    if dry_run:
        return 0

    # fairseq writes to a pipe here, which Python would block-buffer (tens of seconds of lag)
    env = tool_env(PYTHONUNBUFFERED="1")
    if shutil.which(cmd[0], path=env["PATH"]) is None:
        raise LaunchError(f"{cmd[0]} not found on PATH")
    # Keep a log next to the checkpoints while streaming progress to the terminal, line by
    # line, so that `tail -f train.log` and cluster job logs follow the run as it goes.
    rc = run_tool(cmd, run_dir / "train.log", on_line=echo, append=True, env=env)
    if rc != 0:
        print(f"training failed with exit code {rc}; log: {run_dir / 'train.log'}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
