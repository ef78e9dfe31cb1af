"""Average the parameters of the last N checkpoints of a fairseq run.

fairseq's ``scripts/average_checkpoints.py`` is not installed by pip; this is the same
command (same flags), installed as ``man-average-checkpoints`` and runnable as
``python -m man_fairseq.cli.average_checkpoints``.

    man-average-checkpoints --inputs checkpoints/run --num-epoch-checkpoints 5 --output avg.pt
"""

import argparse
import collections
import os
import re
import sys
from typing import List

import torch


class AverageError(Exception):
    pass


def last_n_checkpoints(path: str, n: int, update_based: bool, upper_bound=None) -> List[str]:
    """Paths of the newest ``n`` ``checkpointE.pt`` / ``checkpoint_E_U.pt`` files, newest first."""
    if not os.path.isdir(path):
        raise AverageError(f"checkpoint directory not found: {path}")
    pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt$" if update_based else r"checkpoint(\d+)\.pt$")
    found = []
    for name in os.listdir(path):
        m = pattern.fullmatch(name)
        if m:
            key = int(m.group(1))
            if upper_bound is None or key <= upper_bound:
                found.append((key, name))
    kind = "update-based (checkpoint_E_U.pt)" if update_based else "epoch (checkpointN.pt)"
    if len(found) < n:
        raise AverageError(
            f"asked to average the last {n} {kind} checkpoints but {path} holds only {len(found)}"
            + (f" at or below {upper_bound}" if upper_bound is not None else "")
            + (": " + ", ".join(sorted(x[1] for x in found)) if found else "")
            + (". Train with --save-interval-updates for update-based checkpoints." if update_based else
               ". Keep epoch checkpoints (do not pass --no-epoch-checkpoints).")
        )
    return [os.path.join(path, name) for _, name in sorted(found, reverse=True)[:n]]


def _load(path: str):
    from man_fairseq.checkpoint_compat import register_safe_globals

    register_safe_globals()
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated / corrupt files: say which one
        raise AverageError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e


def average_checkpoints(inputs: List[str]):
    """Average the ``model`` entries of ``inputs``; the other entries are the newest file's."""
    if not inputs:
        raise AverageError("no checkpoints to average")
    params_dict = collections.OrderedDict()
    params_keys = None
    new_state = None
    for fpath in inputs:
        state = _load(fpath)
        if new_state is None:
            new_state = state
        model_params = state["model"]
        keys = list(model_params.keys())
        if params_keys is None:
            params_keys = keys
        elif keys != params_keys:
            raise AverageError(f"{fpath} has different parameters than {inputs[0]}; not from the same model?")
        for k in params_keys:
            p = model_params[k]
            if isinstance(p, torch.HalfTensor) or p.dtype in (torch.float16, torch.bfloat16):
                p = p.float()
            params_dict[k] = p.clone() if k not in params_dict else params_dict[k] + p
    averaged = collections.OrderedDict()
    for k, v in params_dict.items():
        averaged[k] = v / len(inputs) if v.is_floating_point() else v // len(inputs)
    new_state["model"] = averaged
    return new_state


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", required=True, nargs="+",
                   help="checkpoint files, or one directory with --num-*-checkpoints")
    p.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointE.pt")
    g.add_argument("--num-update-checkpoints", type=int, help="average the last N checkpoint_E_U.pt")
    p.add_argument("--checkpoint-upper-bound", type=int,
                   help="ignore checkpoints after this epoch / update")
    args = p.parse_args(argv)

    num = args.num_epoch_checkpoints or args.num_update_checkpoints
    if num is not None:
        if num < 1:
            raise AverageError("the number of checkpoints must be >= 1")
        if len(args.inputs) != 1:
            raise AverageError("--num-*-checkpoints takes exactly one --inputs directory")
        inputs = last_n_checkpoints(args.inputs[0], num, args.num_update_checkpoints is not None,
                                    args.checkpoint_upper_bound)
    else:
        inputs = args.inputs
        missing = [f for f in inputs if not os.path.isfile(f)]
        if missing:
            raise AverageError(f"checkpoint file(s) not found: {', '.join(missing)}")
    print("averaging:\n  " + "\n  ".join(inputs), flush=True)
    state = average_checkpoints(inputs)
    tmp = args.output + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    torch.save(state, tmp)
    os.replace(tmp, args.output)  # never leave a half-written output behind
    print(f"wrote averaged checkpoint to {args.output}")


def cli_main():
    try:
        main()
    except AverageError as e:
        print(f"man-average-checkpoints: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli_main()
