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

The optimizer's state is a list in the order of the model's parameters, with no names: a checkpoint whose
parameters carry other names or come in another order than the model's (one saved before a change of the
plugin's layer form, e.g. ``transformer_masked`` on the Transformer's sublayer order before it took
fairseq's layer form; its weights load renamed) would hand Adam's moments to other parameters, so it is
refused too unless ``--reset-optimizer`` is given (:func:`check_parameter_order`).
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


def check_resume(path, given, state=None):
    """Refuse (PluginOptionError) resuming the checkpoint ``path`` with the model options ``given``
    where an option defining the model differs (``state``: the checkpoint, if read already)."""
    from ..model_options import describe_differences, differing_options, option_value, saved_model_options
    from ..plugin_options import PluginOptionError

    saved = saved_model_options(read_without_tensors(path) if state is None else state)
    if saved is None:
        return
    arch = option_value(given, "arch") or option_value(saved, "arch")
    differences = differing_options(saved, given, arch)
    if differences:
        raise PluginOptionError(
            f"{path} was trained with other model options than this command's: {describe_differences(differences)} "
            "(saved -> given); resume with the run's options, or train the new model in another --save-dir")


def check_parameter_order(path, state, model):
    """Refuse (PluginOptionError) the optimizer state of the checkpoint ``path`` (read: ``state``) when its
    model's parameters are not ``model``'s names in ``model``'s order."""
    from ..plugin_options import PluginOptionError

    if not isinstance(state, dict) or not state.get("last_optimizer_state") or "model" not in state:
        return
    names = [name for name, _ in model.named_parameters()]
    wanted = set(names)
    saved = [key for key in state["model"] if key in wanted]
    if saved != names:
        kept = set(saved)
        missing = [name for name in names if name not in kept]
        example = f"no '{missing[0]}'" if missing else "the same names in another order"
        raise PluginOptionError(
            f"{path} holds this model's parameters under other names or in another order ({example}; "
            f"{len(missing)} of {len(names)} missing): its optimizer state would go to other parameters. Resume with "
            "--reset-optimizer (Adam's moments start again), or with the plugin version that wrote it")


def checking_the_run_options(original):
    def load_checkpoint(self, filename, reset_optimizer=False, *args, **kwargs):
        """fairseq's ``Trainer.load_checkpoint``, after :func:`check_resume` (and, unless the optimizer is
        reset, :func:`check_parameter_order`) for the run's own last checkpoint (``SAVE_DIR/checkpoint_last*.pt``)."""
        folder, name = os.path.split(os.path.abspath(filename))
        save_dir = os.path.abspath(self.cfg.checkpoint.save_dir)
        if folder == save_dir and name.startswith("checkpoint_last") and os.path.isfile(filename):
            state = read_without_tensors(filename)
            check_resume(filename, self.cfg.model, state)
            if not reset_optimizer:
                check_parameter_order(filename, state, self.get_model())
        return original(self, filename, reset_optimizer, *args, **kwargs)

    return load_checkpoint


def apply():
    install(Trainer, "load_checkpoint", checking_the_run_options)
