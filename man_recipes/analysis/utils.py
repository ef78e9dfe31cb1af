"""Pieces shared by the analysis commands: loading checkpoints, checking count options, batching a
split, progress, labels, and the rank correlation used by the calibration analysis."""

import argparse
import contextlib
import logging
import math
import os
import re
import time
from collections import Counter
from typing import List, Optional

import torch
from torch import Tensor

from man_recipes import textfile

logger = logging.getLogger("man_recipes.analysis")


@contextlib.contextmanager
def checkpoint_load_errors(path: str, data: str, files: Optional[List[str]] = None):
    """Loading ``path`` (the checkpoint ``files``, by default ``path`` alone: fairseq's ``a.pt:b.pt``
    names several) with its task reading ``data``: a missing file, or a data folder without the
    checkpoint's dictionaries or with others of other sizes, is one line, not a traceback."""
    missing = [f for f in (files or [path]) if not os.path.isfile(f)]
    if missing:
        raise SystemExit(f"--path {path}: no such checkpoint file: {missing[0]}")
    from man_fairseq.checkpoint_errors import is_torch_file

    foreign = [f for f in (files or [path]) if not is_torch_file(f)]
    if foreign:
        raise SystemExit(f"--path {path}: {foreign[0]} is not a PyTorch checkpoint (neither the zip archive "
                         "torch.save writes nor a pickle); give a checkpoint*.pt written by fairseq-train")
    try:
        yield
    except FileNotFoundError as e:  # the task's dictionaries, named by the checkpoint's languages
        raise SystemExit(f"{data} has no {os.path.basename(e.filename or '?')}, which {path} needs: give the data "
                         "folder it was trained on (or --source-lang / --target-lang)") from None
    except RuntimeError as e:
        if "size mismatch" not in str(e):
            raise
        raise SystemExit(f"the dictionaries in {data} are not those {path} was trained with (their sizes differ "
                         "from its embeddings): give the data folder it was trained on") from None


def load_checkpoint(path: str, data: str, source_lang: Optional[str] = None, target_lang: Optional[str] = None):
    """(model in eval mode, cfg, task) of one checkpoint, its task reading ``data``."""
    import man_fairseq  # noqa: F401  (registers the archs before the checkpoint is read)
    from fairseq import checkpoint_utils

    overrides = {"data": data}
    if source_lang:
        overrides["source_lang"] = source_lang
    if target_lang:
        overrides["target_lang"] = target_lang
    with checkpoint_load_errors(path, data):
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    return models[0].eval(), cfg, task


def parse_model_overrides(text: str) -> dict:
    """``--model-overrides`` as a dict, read as a Python *literal* (never evaluated as code), as the
    plugin reads fairseq's (:func:`man_fairseq.patches.model_overrides.parse_model_overrides`):
    ``"{'attention_backend': 'flex'}"``. Anything else is refused with a clear error."""
    from man_fairseq.patches import model_overrides

    try:
        return model_overrides.parse_model_overrides(text)
    except ValueError as e:
        raise SystemExit(f"--model-overrides {e}") from None


def arch_name(cfg) -> str:
    return getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", "model")


def analysis_parser(doc: str, default_subset: str, path_help: str, data_help: str) -> argparse.ArgumentParser:
    """The parser of a teacher-forced analysis command (described by its module's ``doc``'s first line)
    with the options they all share: data, checkpoints, labels, split or sentence pairs, output
    folder, languages, extra user dir, batch size, progress interval, CPU."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("data", help=data_help)
    p.add_argument("--path", required=True, help=path_help)
    p.add_argument("--labels", default=None,
                   help="comma-separated model names (default: the checkpoints' folder names)")
    p.add_argument("--gen-subset", default=default_subset, help=f"data split (default: {default_subset})")
    p.add_argument("--input-pairs", default=None,
                   help="instead of a split: a text file of 'source ||| target' lines (tokenised like the data)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--source-lang", default=None)
    p.add_argument("--target-lang", default=None)
    p.add_argument("--user-dir", default=None, help="an extra fairseq --user-dir to import")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--log-interval", type=int, default=10, help="log progress every N batches")
    p.add_argument("--cpu", action="store_true")
    return p


def check_counts(args, **minimums: int) -> None:
    """Each named count option that is set is at least its minimum (``batch_size=1``), checked
    before anything is loaded: ``--max-sentences 0`` wrote a table of zeros, ``--log-interval 0``
    was a traceback after the model had loaded."""
    for name, minimum in minimums.items():
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise SystemExit(f"--{name.replace('_', '-')} {value}: expected an integer >= {minimum}")


def check_output_dir(path: str, flag: str = "--output-dir") -> None:
    """The output folder can be written (or made), checked before any checkpoint is loaded: a file
    there (``--output-dir FILE``) or a read-only folder was a traceback after the measurement."""
    from man_recipes.paths import output_folder_problem

    problem = output_folder_problem(path)
    if problem:
        raise SystemExit(f"{flag} {path}: {problem}")


ATTENTION_KINDS = ("encoder_self", "decoder_self", "cross")
ATTENTION_MODULE = re.compile(r"(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)\.(bias_module|post_softmax)$")
WRAPPERS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")  # what FSDP and activation checkpointing add


def attention_modules(model, module_type, what):
    """[(attention kind, layer, module)] of every ``module_type`` (a bias or post-softmax module of the
    plugin) of ``model``, in the model's order; ``what`` names the module type in the error for one
    found elsewhere. The one finder of the analyses (checkpoints of FSDP or activation-checkpointed
    runs too)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, module_type):
            for wrapper in WRAPPERS:
                name = name.replace(wrapper, "")
            m = ATTENTION_MODULE.search(name)
            if m is None:
                raise RuntimeError(f"unexpected {what} module location {name}")
            side, layer, which, _ = m.groups()
            kind = "encoder_self" if side == "encoder" else ("decoder_self" if which == "self_attn" else "cross")
            found.append((kind, int(layer), module))
    return found


def checkpoint_folder(path: str) -> str:
    """The folder name of a checkpoint (``runs/acn/checkpoint_best.pt`` -> ``acn``), a default label."""
    import os

    return os.path.basename(os.path.dirname(os.path.abspath(path))) or path


def model_labels(paths: List[str], names: List[str], labels_option: Optional[str]) -> List[str]:
    """``--labels`` if given (one per checkpoint), else ``names`` (+ the path when repeated)."""
    if labels_option:
        labels = [x.strip() for x in labels_option.split(",")]
        if len(labels) != len(paths):
            raise SystemExit(f"--labels has {len(labels)} names for {len(paths)} checkpoints")
        return labels
    counts = Counter(names)
    return [f"{n} ({p})" if counts[n] > 1 else n for n, p in zip(names, paths)]


def sentence_pairs_dataset(task, path: str):
    """A LanguagePairDataset of the lines ``source ||| target`` of ``path`` (tokenised and BPE-split as
    the training data; tokens missing from the dictionaries become <unk>)."""
    from fairseq.data import LanguagePairDataset

    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src, tgt = [], []
    try:
        lines = textfile.read_lines(path)
    except textfile.NotUtf8Error as e:
        raise SystemExit(str(e))
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.count("|||") != 1:
            raise SystemExit(f"{path}:{number}: expected one 'source ||| target' pair per line")
        s, t = (x.strip() for x in line.split("|||"))
        if not s or not t:
            raise SystemExit(f"{path}:{number}: empty source or target")
        src.append(src_dict.encode_line(s, add_if_not_exist=False, append_eos=True).long())
        tgt.append(tgt_dict.encode_line(t, add_if_not_exist=False, append_eos=True).long())
    if not src:
        raise SystemExit(f"{path}: no sentence pairs")
    cfg = getattr(task, "cfg", None)
    return LanguagePairDataset(
        src, [len(x) for x in src], src_dict, tgt, [len(x) for x in tgt], tgt_dict,
        left_pad_source=getattr(cfg, "left_pad_source", True), left_pad_target=getattr(cfg, "left_pad_target", False),
    )


def batch_iterator(task, model, subset: str, batch_size: int, max_tokens: Optional[int] = None,
                   input_pairs: Optional[str] = None):
    """Teacher-forcing batches of ``subset`` (or of the pairs in the file ``input_pairs``) in a fixed
    order (no shuffling), too long sentences skipped."""
    from fairseq import utils

    if input_pairs:
        dataset = sentence_pairs_dataset(task, input_pairs)
    else:
        task.load_dataset(subset)
        dataset = task.dataset(subset)
    return task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens, max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, num_workers=0,
    ).next_epoch_itr(shuffle=False)


class Progress:
    """Logs ``done/total`` batches and sentences every ``interval`` batches and at the end."""

    def __init__(self, what: str, total_batches: int, interval: int = 10):
        self.what, self.total, self.interval = what, total_batches, max(1, interval)
        self.start = time.time()
        self.sentences = 0

    def step(self, batch_index: int, sentences: int):
        self.sentences += sentences
        if batch_index % self.interval == 0 or batch_index == self.total:
            logger.info("%s: %d/%d batches, %d sentences, %.0f s", self.what, batch_index, self.total,
                        self.sentences, time.time() - self.start)


def kendall_tau_b(x: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    """Kendall's tau-b between rows of ``x`` and ``y`` (N, S) over the entries where ``valid``.

    tau_b = (concordant - discordant) / sqrt((pairs not tied in x) * (pairs not tied in y)),
    the definition of ``scipy.stats.kendalltau`` (variant 'b'). NaN for a row with fewer than two
    valid entries or a constant one (undefined there).
    """
    x, y = x.double(), y.double()
    n = x.size(-1)
    upper = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    pairs = (valid[:, :, None] & valid[:, None, :] & upper).double()
    sx = torch.sign(x[:, :, None] - x[:, None, :]) * pairs
    sy = torch.sign(y[:, :, None] - y[:, None, :]) * pairs
    numerator = (sx * sy).sum((1, 2))
    denominator = torch.sqrt(sx.abs().sum((1, 2)) * sy.abs().sum((1, 2)))
    return torch.where(denominator > 0, numerator / denominator.clamp_min(1e-300),
                       torch.full_like(numerator, math.nan))
