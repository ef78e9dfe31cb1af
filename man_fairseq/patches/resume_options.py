"""A resume with other model options than the run's is refused in one line.

fairseq-train resumes from ``SAVE_DIR/checkpoint_last.pt`` whenever it exists. Given another option that
defines the model (``--man-norm post`` on a pre-norm run, another ``--localness-window``), it built the
new model and then either stopped with "please ensure that the architectures match" under two
tracebacks (other parameter shapes) or, worse, loaded the old parameters into the other model and trained
on (same shapes). ``Trainer.load_checkpoint`` now reads the checkpoint's options first and, for the run's
own last checkpoint, refuses (:class:`~man_fairseq.plugin_options.PluginOptionError`, one line) every
option defining the model (:func:`man_fairseq.model_options.differing_options`) that differs, with its
two values, before anything is loaded or written. Options that may change on a resume (learning rate,
epochs, patience, data, dropout, ...) are not compared; ``--restore-file`` and ``--finetune-from-model``
(another run's checkpoint, deliberately) are not checked.
"""

import os

from fairseq.trainer import Trainer

from .install import install


def read_without_tensors(path):
    """The checkpoint ``path`` as torch's safe loading reads it, its tensors mapped, not read."""
    import torch

    from ..checkpoint_errors import load_error
    from ..plugin_options import PluginOptionError
    from . import safe_globals

    safe_globals.apply()
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # not a checkpoint at all: say so, rather than fairseq's traceback
        raise PluginOptionError(load_error(path, e)) from None


def check_resume(path, given):
    """Refuse (PluginOptionError) resuming the checkpoint ``path`` with the model options ``given``
    where an option defining the model differs."""
    from ..model_options import describe_differences, differing_options, option_value, saved_model_options
    from ..plugin_options import PluginOptionError

    saved = saved_model_options(read_without_tensors(path))
    if saved is None:
        return
    arch = option_value(given, "arch") or option_value(saved, "arch")
    differences = differing_options(saved, given, arch)
    if differences:
        raise PluginOptionError(
            f"{path} was trained with other model options than this command's: {describe_differences(differences)} "
            "(saved -> given); resume with the run's options, or train the new model in another --save-dir")


def checking_the_run_options(original):
    def load_checkpoint(self, filename, *args, **kwargs):
        """fairseq's ``Trainer.load_checkpoint``, after :func:`check_resume` for the run's own last
        checkpoint (``SAVE_DIR/checkpoint_last*.pt``)."""
        folder, name = os.path.split(os.path.abspath(filename))
        save_dir = os.path.abspath(self.cfg.checkpoint.save_dir)
        if folder == save_dir and name.startswith("checkpoint_last") and os.path.isfile(filename):
            check_resume(filename, self.cfg.model)
        return original(self, filename, *args, **kwargs)

    return load_checkpoint


def apply():
    install(Trainer, "load_checkpoint", checking_the_run_options)
