"""The average step: the parameters of a fairseq run's last N checkpoints averaged into one file.

The library of ``man-average-checkpoints`` (:mod:`man_recipes.cli.average_checkpoints`, fairseq's
``scripts/average_checkpoints.py`` with the same flags) and of every recipe that averages
(``scripts/evaluate.sh``, ``scripts/reproduce.sh``, ``scripts/demo.py``), called directly.
The output must be a new file (``overwrite`` replaces an existing one); it is checked before any
checkpoint is read, and never a checkpoint fairseq keeps beside the inputs.
"""

import argparse
import collections
import os
import re
from typing import List, Optional

import torch

from man_recipes.atomic import replacing


class AverageError(Exception):
    pass


class CheckpointsNotFound(AverageError):
    """Fewer checkpoints of the asked kind than asked for (or no checkpoint folder): a choice of
    what to average, which the caller may name another way to make."""


def last_n_checkpoints(path: str, n: int, update_based: bool, upper_bound=None) -> List[str]:
    """Paths of the newest ``n`` ``checkpointE.pt`` / ``checkpoint_E_U.pt`` files, newest first."""
    if not os.path.isdir(path):
        raise CheckpointsNotFound(f"checkpoint directory not found: {path}")
    pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt$" if update_based else r"checkpoint(\d+)\.pt$")
    found, above = [], 0
    for name in os.listdir(path):
        m = pattern.fullmatch(name)
        if m:
            key = int(m.group(1))
            if upper_bound is None or key <= upper_bound:
                found.append((key, name))
            else:
                above += 1
    kind = "update-based (checkpoint_E_U.pt)" if update_based else "epoch (checkpointN.pt)"
    if len(found) < n:
        others = sorted(f for f in os.listdir(path) if f.endswith(".pt") and not pattern.fullmatch(f))
        if above:
            why = (f"--checkpoint-upper-bound {upper_bound} leaves out the {above} later one(s): "
                   "raise it or average fewer checkpoints.")
        elif update_based:
            why = "Train with --save-interval-updates K (and --keep-interval-updates >= N) for update-based checkpoints."
        elif not found and others:
            why = ("Training ended before its first epoch did (e.g. --max-update reached mid-epoch) or ran "
                   "with --no-epoch-checkpoints: train for at least N epochs, or use one of the files present.")
        else:
            why = ("Training ran fewer than N epochs, or --keep-last-epochs below N removed older ones: "
                   "average fewer checkpoints.")
        raise CheckpointsNotFound(
            f"asked to average the last {n} {kind} checkpoints but {path} holds only {len(found)}"
            + (f" at or below --checkpoint-upper-bound {upper_bound}" if upper_bound is not None else "")
            + (": " + ", ".join(sorted(x[1] for x in found)) if found else "")
            + (f" (other checkpoints there: {', '.join(others)})" if others else "")
            + ". " + why
        )
    return [os.path.join(path, name) for _, name in sorted(found, reverse=True)[:n]]


def _load(path: str):
    from man_fairseq.checkpoint_errors import load_error
    from man_fairseq.patches import safe_globals

    safe_globals.apply()
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated / corrupt files, or no checkpoint at all: say which one
        raise AverageError(load_error(path, e)) from e


def model_option_names(arch):
    """The option names (argparse dests) the model class behind ``arch`` declares, or None."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    import man_fairseq  # noqa: F401  (registers the plugin's archs)

    cls = ARCH_MODEL_REGISTRY.get(arch)
    if cls is None:
        return None
    parser = argparse.ArgumentParser(add_help=False)
    try:
        cls.add_args(parser)
    except Exception:  # a model whose add_args needs fairseq's full parser: compare the arch only
        return set()
    return {action.dest for action in parser._actions}


def model_config(state):
    """The options that define the model a checkpoint holds: the arch and every option its model
    class declares (fairseq's ``cfg.model`` also carries data paths, learning rates etc. for
    legacy models, which differ between runs of one model and are ignored). Dropout rates are
    left out too: they change training, not what the parameters mean."""
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if model is None and state.get("args") is not None:
        model = state["args"]
    if model is not None and not isinstance(model, dict):  # argparse.Namespace
        model = vars(model)
    model = dict(model or {})
    arch = model.get("_name") or model.get("arch") or "?"
    names = model_option_names(arch) or set()
    options = {k: v for k, v in model.items() if k in names and not str(k).endswith("dropout")}
    options["arch"] = arch
    return options


def _arch(config):
    return config["arch"]


def check_same_model(path, state, ref_path, ref_state):
    """Raise AverageError naming the first difference between two checkpoints' models:
    architecture, model options, parameter names, then tensor shapes."""
    a, b = model_config(ref_state), model_config(state)
    if _arch(a) != _arch(b):
        raise AverageError(f"{path} is a different model than {ref_path}: arch {_arch(b)!r} vs {_arch(a)!r}")
    for key in sorted(set(a) | set(b), key=str):
        if a.get(key) != b.get(key):
            raise AverageError(f"{path} is a different model than {ref_path}: option {key} = "
                               f"{b.get(key)!r} vs {a.get(key)!r}")
    pa, pb = ref_state["model"], state["model"]
    for key in pa:
        if key not in pb:
            raise AverageError(f"{path} has no parameter {key}, which {ref_path} has; not the same model")
    for key in pb:
        if key not in pa:
            raise AverageError(f"{path} has a parameter {key} that {ref_path} lacks; not the same model")
    for key in pa:
        if tuple(pa[key].shape) != tuple(pb[key].shape):
            hint = " (different dictionaries?)" if "embed_tokens" in key or "output_projection" in key else ""
            raise AverageError(f"{path} is a different model than {ref_path}: {key} has shape "
                               f"{tuple(pb[key].shape)} vs {tuple(pa[key].shape)}{hint}")


def average_checkpoints(inputs: List[str]):
    """Average the ``model`` entries of ``inputs``; the other entries are the newest file's.
    Every input must hold the same model (arch, options, parameter names and shapes);
    fp16/bf16 parameters are summed in fp32 and the average is written in fp32."""
    if not inputs:
        raise AverageError("no checkpoints to average")
    seen = {}
    for fpath in inputs:  # one file twice weighs it double: an "average" of what was not trained
        real = os.path.realpath(fpath)
        if real in seen:
            raise AverageError(f"{fpath} is given twice (also as {seen[real]}); each checkpoint is averaged once")
        seen[real] = fpath
    params_dict = collections.OrderedDict()
    new_state = None
    for fpath in inputs:
        state = _load(fpath)
        if "model" not in state:
            raise AverageError(f"{fpath} holds no 'model' entry; not a fairseq checkpoint")
        if new_state is None:
            new_state = state
        else:
            check_same_model(fpath, state, inputs[0], new_state)
        model_params = state["model"]
        for k, p in model_params.items():
            if p.dtype in (torch.float16, torch.bfloat16):
                p = p.float()
            params_dict[k] = p.clone() if k not in params_dict else params_dict[k] + p
    averaged = collections.OrderedDict()
    for k, v in params_dict.items():
        averaged[k] = v / len(inputs) if v.is_floating_point() else v // len(inputs)
    new_state["model"] = averaged
    return new_state


# the files fairseq-train keeps in a run's --save-dir: an average never replaces one of them
FAIRSEQ_CHECKPOINT = re.compile(r"checkpoint(\d+|_\d+_\d+|_best|_last)?(\.best_.*)?\.pt")


def check_output(output: str, inputs: List[str], overwrite: bool):
    """Refuse an ``--output`` that cannot or may not be written, before any work: a folder, one of
    the inputs, a fairseq checkpoint in an input's folder, an existing file without ``overwrite``,
    or a path whose folder cannot be created."""
    path = os.path.realpath(output)
    if os.path.isdir(path):
        raise AverageError(f"--output {output} is a folder; give the file to write, e.g. "
                           f"{os.path.join(output, 'averaged.pt')}")
    if any(path == os.path.realpath(f) for f in inputs):
        raise AverageError(f"--output {output} is one of the inputs; write the average to a new file")
    input_dirs = {os.path.dirname(os.path.realpath(f)) for f in inputs}
    if FAIRSEQ_CHECKPOINT.fullmatch(os.path.basename(path)) and os.path.dirname(path) in input_dirs:
        raise AverageError(f"--output {output} is a checkpoint name of the run being averaged (fairseq-train "
                           "resumes from and keeps these files); write the average to another name")
    if os.path.lexists(output) and not overwrite:
        raise AverageError(f"--output {output} exists; pass --overwrite to replace it, or choose a new file")
    parent = os.path.dirname(path)
    while not os.path.exists(parent):  # the folders that would be made: the first existing one decides
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise AverageError(f"--output {output}: cannot write in {parent}")


def write_atomic(state, output: str):
    """torch.save ``state`` as ``output``, written whole (:func:`man_recipes.atomic.replacing`)."""
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with replacing(output, "wb") as f:
        torch.save(state, f)


def select_inputs(inputs: List[str], num_epoch: Optional[int] = None, num_update: Optional[int] = None,
                  upper_bound: Optional[int] = None) -> List[str]:
    """The checkpoint files to average: the last ``num_epoch`` / ``num_update`` checkpoints of the one
    folder in ``inputs``, or ``inputs`` themselves (files that must exist)."""
    by_update = num_update is not None
    num = num_update if by_update else num_epoch
    if num is not None:  # 0 is a number too, not "no number given"
        flag = "--num-update-checkpoints" if by_update else "--num-epoch-checkpoints"
        if num < 1:
            raise AverageError(f"{flag} {num}: the number of checkpoints must be >= 1")
        if len(inputs) != 1:
            raise AverageError(f"{flag} takes exactly one --inputs directory")
        return last_n_checkpoints(inputs[0], num, by_update, upper_bound)
    if upper_bound is not None:  # it picks among a folder's checkpoints only
        raise AverageError("--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints")
    folders = [f for f in inputs if os.path.isdir(f)]
    if folders:
        raise AverageError(f"--inputs {folders[0]} is a folder: pass --num-epoch-checkpoints N or "
                           "--num-update-checkpoints N to pick its last N checkpoints, or name the files")
    missing = [f for f in inputs if not os.path.isfile(f)]
    if missing:
        raise AverageError(f"checkpoint file(s) not found: {', '.join(missing)}")
    return list(inputs)


def average_files(inputs: List[str], output: str, overwrite: bool = False) -> None:
    """Average ``inputs`` into ``output`` (checked first, written whole or not at all)."""
    check_output(output, inputs, overwrite)
    print("averaging:\n  " + "\n  ".join(inputs), flush=True)
    state = average_checkpoints(inputs)
    write_atomic(state, output)
    print(f"wrote averaged checkpoint to {output}")
