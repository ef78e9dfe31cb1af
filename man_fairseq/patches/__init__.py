"""Everything ``import man_fairseq`` changes in fairseq, torch and Python, one module a change.

Each module's docstring names the behaviour it changes and why; each has ``apply()``, which installs
its replacement once per process (:func:`.install.install`), so a second import changes nothing more.
In the order :func:`apply_all` applies them (first the allow-list, which must be in place before
anything loads a checkpoint):

- ``safe_globals``: torch's safe loading accepts fairseq's own checkpoints (``torch.serialization``)
- ``batch_by_size``: the last batch is kept (the forks drop it: data lost) (``data_utils.batch_by_size``)
- ``empty_source``: an empty source gets an empty hypothesis, not a hallucination (``TranslationTask.inference_step``)
- ``option_errors``: a wrong plugin option is one line, not a traceback (``sys.excepthook``)
- ``bf16``: --bf16 no longer turns on --tpu (``options.parse_args_and_arch``)
- ``ngram_blocking``: --no-repeat-ngram-size blocks without the CUDA kernel too (``NGramRepeatBlock._no_repeat_ngram``)
- ``exit_threads``: a run stopped mid-epoch exits 0, not SIGABRT (``iterators.BackgroundConsumer.__init__``)
- ``model_overrides``: a --model-overrides that is no dict, an unknown key or one that defines the model, or a --path that is no checkpoint, is refused (``options.gen_parser_from_dataclass``, ``checkpoint_utils.load_checkpoint_to_cpu``)
- ``from_pretrained``: a missing folder or checkpoint is named, an unknown keyword refused as --model-overrides (``hub_utils.from_pretrained``)
- ``patience_resume``: --patience counts on across a resume (``Trainer.save_checkpoint, checkpoint_utils.load_checkpoint``)
- ``resume_options``: a resume with other model options than the run's is refused in one line (``Trainer.load_checkpoint``)
- ``resume_batches``: a resumed run trains on the batches of the run uninterrupted (``FairseqTask.get_batch_iterator``)
- ``known_warnings``: three harmless warnings silenced, each by its exact message (``warnings`` filters)
"""

from . import (bf16, batch_by_size, empty_source, exit_threads, from_pretrained, known_warnings, model_overrides,
               ngram_blocking, option_errors, patience_resume, resume_batches, resume_options, safe_globals)

PATCHES = (safe_globals, batch_by_size, empty_source, option_errors, bf16, ngram_blocking, exit_threads,
           model_overrides, from_pretrained, patience_resume, resume_options, resume_batches, known_warnings)


def apply_all():
    for patch in PATCHES:
        patch.apply()
