"""Fixes for the fairseq fork we install, applied when the plugin is imported.

The maintained forks of fairseq 0.12 for Python >= 3.9 (``fairseq-fixed`` 0.12.3.1 and
``ve-fairseq`` 0.12.3 alike) changed ``fairseq.data.data_utils.batch_by_size`` to **drop the
last batch** whenever its size is not a multiple of ``--required-batch-size-multiple``
(default 8). fairseq 0.12.2 keeps it. Dropping it silently loses data: ``fairseq-generate``
translates only part of the test set (so BLEU is computed on a subset), validation skips
sentences, and since batches are formed from length-sorted indices the longest training
sentences are never seen. We restore fairseq 0.12.2's behaviour.

A second fix concerns empty inputs: ``fairseq-interactive`` (and ``fairseq-generate``) feed an
empty source line to the model as a lone end-of-sentence token and print whatever the decoder
hallucinates from it (``A2 A2``). An empty source now gets an empty hypothesis (score 0) and a
warning; the other sentences of the batch are decoded as before.

A third concerns a wrong plugin option found only when the model or criterion is built (an
index beyond ``--encoder-layers``, the calibration criterion with another ``--arch``): fairseq's
CLIs would print a 40-line traceback for that user mistake. A
:class:`~man_fairseq.plugin_options.PluginOptionError` is printed as one line,
``fairseq-train: error: MESSAGE`` (exit status 1), also when it was raised in one of the
processes fairseq spawns per GPU (torch hands the parent only that process's formatted
traceback); every other exception keeps its traceback.

A fourth: fairseq 0.12 turns ``--bf16`` into ``--tpu`` (``options.parse_args_and_arch``: bf16 was a
TPU mode when it was written), so ``fairseq-train --bf16`` on a GPU asks torch_xla for a device and
dies (``'NoneType' object has no attribute 'xla_device'``). ``--tpu`` is now set only when given.

A fifth: ``--no-repeat-ngram-size`` (the summarization papers' trigram blocking) does nothing
wherever fairseq's CUDA kernel for it is not in use (on CPU, and on a GPU where the extension was
not built): since fairseq commit 8ca4813 its Python fallback compares the last n-1 entries of the
whole (padded) token buffer with the earlier n-grams, which never match (fairseq issues 4709,
5206), so beam search repeats n-grams freely and exits 0. The fallback now bans what the CUDA
kernel bans: every token that would complete an n-gram already in the hypothesis (its leading
end-of-sentence included).

A sixth: ``fairseq-train`` that stops before the end of an epoch (``--max-update``, ``--stop-time-hours``)
can die at exit with ``terminate called without an active exception`` (SIGABRT, exit status -6)
after its last checkpoint is written. fairseq collates the next batches in a daemon thread
(``iterators.BackgroundConsumer``); when the interpreter shuts down while that thread is inside a
torch operator that released the GIL, Python < 3.14 ends the thread with ``pthread_exit`` as it
takes the GIL back, and the unwinding through pybind11's GIL guard calls ``std::terminate``. At
exit those threads are now told to stop after the batch in hand and are waited for (their queues
drained so that none waits to put), before the interpreter shuts down.

A seventh: ``--model-overrides`` (fairseq-generate, -interactive, -validate) sets any key it is
given, and a key the checkpoint has no option of (another family's option, a misspelt name) was
ignored without a word. Such a key, as given on the command line, is now refused in one line
naming it (:func:`man_fairseq.plugin_options.check_model_overrides`); bad values of known keys
were refused already, when the model is built. A ``--path`` that is not a checkpoint at all (a text
file) is one line saying so too.

An eighth: ``from_pretrained`` with a run folder, checkpoint file or data folder that does not exist
ended in ``TypeError: expected str ... not NoneType`` (fairseq's archive lookup returns None for a
path it cannot find); it is now a FileNotFoundError naming the path and the keyword.
"""

import atexit
import logging
import math
import os
import queue
import re
import sys
import threading
import time
import weakref

import numpy as np
import torch
from fairseq import checkpoint_utils, hub_utils, options
from fairseq.data import data_utils, iterators
from fairseq.ngram_repeat_block import NGramRepeatBlock
from fairseq.tasks.translation import TranslationTask

logger = logging.getLogger(__name__)

_fork_batch_by_size = data_utils.batch_by_size
_fairseq_from_pretrained = hub_utils.from_pretrained


def batch_by_size(
    indices,
    num_tokens_fn,
    num_tokens_vec=None,
    max_tokens=None,
    max_sentences=None,
    required_batch_size_multiple=1,
    fixed_shapes=None,
):
    """fairseq 0.12.2's ``batch_by_size``: every index ends up in exactly one batch."""
    if fixed_shapes is not None or required_batch_size_multiple <= 1:
        return _fork_batch_by_size(
            indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
            required_batch_size_multiple, fixed_shapes,
        )
    from fairseq.data.data_utils_fast import batch_by_size_fn, batch_by_size_vec

    max_tokens = int(max_tokens) if max_tokens is not None else -1
    max_sentences = max_sentences if max_sentences is not None else -1
    if not isinstance(indices, np.ndarray):
        indices = np.fromiter(indices, dtype=np.int64, count=-1)
    if num_tokens_vec is None:
        return batch_by_size_fn(indices, num_tokens_fn, max_tokens, max_sentences, required_batch_size_multiple)
    if not isinstance(num_tokens_vec, np.ndarray):
        num_tokens_vec = np.fromiter(num_tokens_vec, dtype=np.int64, count=-1)
    return batch_by_size_vec(indices, num_tokens_vec, max_tokens, max_sentences, required_batch_size_multiple)


_original_inference_step = TranslationTask.inference_step


def _empty_hypothesis(eos, device, beam):
    return [{"tokens": torch.tensor([eos], device=device), "score": 0.0, "attention": None,
             "alignment": None, "positional_scores": torch.zeros(1, device=device)}
            for _ in range(beam)]


def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
    """``TranslationTask.inference_step`` that answers an empty source (only end-of-sentence)
    with an empty hypothesis instead of decoding it."""
    net_input = sample.get("net_input") or {}
    lengths = net_input.get("src_lengths")
    if lengths is None or not torch.is_tensor(lengths) or not bool((lengths <= 1).any()):
        return _original_inference_step(self, generator, models, sample, prefix_tokens, constraints)
    bsz = lengths.size(0)
    empty = (lengths <= 1).nonzero().view(-1).tolist()
    keep = (lengths > 1).nonzero().view(-1)
    ids = sample.get("id")  # sentence ids where the caller has them (fairseq-generate)
    which = f" (ids {[int(ids[i]) for i in empty]})" if torch.is_tensor(ids) else ""
    logger.warning("%d empty source sentence(s)%s: empty hypothesis (nothing to translate)", len(empty), which)
    hypos = [None] * bsz
    if keep.numel():
        def pick(value):
            return value.index_select(0, keep) if torch.is_tensor(value) and value.dim() and value.size(0) == bsz else value

        sub = dict(sample)
        sub["net_input"] = {k: pick(v) for k, v in net_input.items()}
        for key in ("id", "target", "nsentences"):
            if key in sample:
                sub[key] = pick(sample[key])
        if "nsentences" in sample:
            sub["nsentences"] = int(keep.numel())
        decoded = _original_inference_step(self, generator, models, sub,
                                           None if prefix_tokens is None else pick(prefix_tokens),
                                           None if constraints is None else pick(constraints))
        for row, result in zip(keep.tolist(), decoded):
            hypos[row] = result
    beam = max(1, getattr(generator, "beam_size", 1))
    eos = self.target_dictionary.eos()
    for row in empty:
        hypos[row] = _empty_hypothesis(eos, lengths.device, beam)
    return hypos


def banned_ngram_completions(tokens, step, n):
    """(rows, tokens) to ban at ``step`` under ``--no-repeat-ngram-size n``: for each row of
    ``tokens`` (the generator's buffer; positions ``0..step`` are the hypothesis so far, from its
    leading end-of-sentence), the token that followed each earlier occurrence of its last n-1
    tokens. The rule of fairseq's CUDA kernel (``ngram_repeat_block_cuda_kernel.cu``)."""
    start = step + 2 - n  # where the n-gram that the next token would complete begins
    if start <= 0:
        return tokens.new_empty(0), tokens.new_empty(0)
    hyp = tokens[:, : step + 1]
    if n == 1:
        matches = torch.ones(hyp.size(0), start, dtype=torch.bool, device=hyp.device)
    else:
        earlier = hyp.unfold(1, n - 1, 1)[:, :start]  # (rows, start, n-1): the (n-1)-grams at 0..start-1
        matches = (earlier == hyp[:, start:].unsqueeze(1)).all(-1)
    rows, at = matches.nonzero(as_tuple=True)
    return rows, hyp[rows, at + n - 1]


def _no_repeat_ngram(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
    """``NGramRepeatBlock``'s fallback (CPU, or CUDA without fairseq's extension), banning what the
    CUDA kernel bans (:func:`banned_ngram_completions`)."""
    rows, banned = banned_ngram_completions(tokens, step, self.no_repeat_ngram_size)
    lprobs[rows, banned] = -math.inf
    return lprobs


_original_parse_args_and_arch = options.parse_args_and_arch


def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
    """fairseq's ``parse_args_and_arch`` without its ``if args.bf16: args.tpu = True``."""
    result = _original_parse_args_and_arch(parser, input_args, parse_known, suppress_defaults, modify_parser)
    args = result[0] if parse_known else result
    argv = sys.argv[1:] if input_args is None else input_args
    if getattr(args, "bf16", False) and "--tpu" not in argv:
        args.tpu = False
    return result


def command_line_model_overrides():
    """The keys of ``--model-overrides`` on this process's command line (the text fairseq's CLIs
    read it from), or () when it is not there or not a literal dict (fairseq then stops on it)."""
    import ast

    argv, text = sys.argv[1:], None
    for i, arg in enumerate(argv):
        if arg == "--model-overrides" and i + 1 < len(argv):
            text = argv[i + 1]
        elif arg.startswith("--model-overrides="):
            text = arg.split("=", 1)[1]
    try:
        value = ast.literal_eval(text) if text else {}
    except (ValueError, SyntaxError):
        return ()
    return tuple(value) if isinstance(value, dict) else ()


_fairseq_load_checkpoint_to_cpu = checkpoint_utils.load_checkpoint_to_cpu


def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """fairseq's ``load_checkpoint_to_cpu``, the overrides applied after a check that each key of the
    command line's ``--model-overrides`` is an option of the checkpoint (the state read before it).
    A ``--path`` that is no checkpoint at all is one line saying so, not torch's ``KeyError: 101``."""
    from fairseq.dataclass.utils import overwrite_args_by_name

    from .checkpoint_compat import is_torch_file, load_error
    from .plugin_options import PluginOptionError, check_model_overrides

    try:
        state = _fairseq_load_checkpoint_to_cpu(path, None, load_on_all_ranks)
    except Exception as e:
        if os.path.isfile(path) and not is_torch_file(path):
            raise PluginOptionError(load_error(path, e)) from None
        raise
    if arg_overrides:
        check_model_overrides([k for k in command_line_model_overrides() if k in arg_overrides], state, path)
        if state.get("args") is not None:  # as fairseq applies them
            for name, value in arg_overrides.items():
                setattr(state["args"], name, value)
        if state.get("cfg") is not None:
            overwrite_args_by_name(state["cfg"], arg_overrides)
    return state


def plugin_option_message(exc):
    """The message of a PluginOptionError ``exc``, or None when ``exc`` is not one.

    Under ``torch.multiprocessing.spawn`` (fairseq's ``distributed_utils.call_main`` on several
    GPUs) the error is raised in a child, and the parent receives a ProcessRaisedException whose
    text is the child's traceback: its last line is ``...PluginOptionError: MESSAGE``."""
    from torch.multiprocessing import ProcessRaisedException

    from .plugin_options import PluginOptionError

    if isinstance(exc, PluginOptionError):
        return str(exc)
    if isinstance(exc, ProcessRaisedException):
        lines = [line for line in str(exc).splitlines() if line.strip()]
        found = re.fullmatch(r"(?:\w+\.)*PluginOptionError: (.*)", lines[-1]) if lines else None
        if found:
            return found.group(1)
    return None


def print_plugin_option_errors(previous):
    """A ``sys.excepthook`` that prints an uncaught PluginOptionError (:func:`plugin_option_message`)
    as one line, like argparse's usage errors, and hands every other exception to ``previous``."""

    def hook(exc_type, exc, tb):
        message = plugin_option_message(exc)
        if message is not None:
            prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
            sys.stderr.write(f"{prog}: error: {message}\n")
            sys.stderr.flush()
            return
        previous(exc_type, exc, tb)

    hook.prints_plugin_option_errors = True
    return hook


_exiting = threading.Event()
_consumers = weakref.WeakSet()
_fork_consumer_init = iterators.BackgroundConsumer.__init__
CONSUMER_STOP_SECONDS = 60  # one batch in hand; a stuck source keeps fairseq's own behaviour after this


def _until_exit(source):
    for item in source:
        if _exiting.is_set():
            return
        yield item


def consumer_init(self, queue_, source, max_len, cuda_device):
    _fork_consumer_init(self, queue_, _until_exit(source), max_len, cuda_device)
    _consumers.add(self)


def stop_background_consumers(timeout=CONSUMER_STOP_SECONDS):
    """Stop fairseq's batch-collating threads before the interpreter shuts down (see the sixth fix)."""
    _exiting.set()
    deadline = time.monotonic() + timeout
    for consumer in list(_consumers):
        while consumer.is_alive() and time.monotonic() < deadline:
            try:
                while True:  # room in its queue, so that a thread waiting to put goes on and sees the flag
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.05)


def _local_missing(name, archive_map):
    """Whether ``name`` is meant as a local path (not an archive name or a URL) and does not exist."""
    return isinstance(name, str) and name not in (archive_map or {}) and "://" not in name and not os.path.exists(name)


def from_pretrained(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", archive_map=None, **kwargs):
    if _local_missing(model_name_or_path, archive_map):
        raise FileNotFoundError(f"from_pretrained: the run folder {model_name_or_path} does not exist")
    if isinstance(model_name_or_path, str) and os.path.isdir(model_name_or_path):
        for name in checkpoint_file.split(os.pathsep):
            if not os.path.isfile(os.path.join(model_name_or_path, name)):
                raise FileNotFoundError(f"from_pretrained: checkpoint_file {name!r} is not in the run folder "
                                        f"{model_name_or_path} (it is relative to it)")
    if not str(data_name_or_path).startswith(".") and _local_missing(data_name_or_path, archive_map):
        raise FileNotFoundError(f"from_pretrained: the data folder {data_name_or_path} (data_name_or_path, the "
                                "folder with the dictionaries) does not exist")
    return _fairseq_from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, archive_map, **kwargs)


def apply():
    hub_utils.from_pretrained = from_pretrained
    data_utils.batch_by_size = batch_by_size
    TranslationTask.inference_step = inference_step
    options.parse_args_and_arch = parse_args_and_arch
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    NGramRepeatBlock._no_repeat_ngram = _no_repeat_ngram
    if iterators.BackgroundConsumer.__init__ is not consumer_init:  # once per process
        iterators.BackgroundConsumer.__init__ = consumer_init
        atexit.register(stop_background_consumers)
    if not getattr(sys.excepthook, "prints_plugin_option_errors", False):  # once per process
        sys.excepthook = print_plugin_option_errors(sys.excepthook)
