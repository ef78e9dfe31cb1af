"""``--patience`` survives a resume.

fairseq 0.12 counts the validations without improvement in attributes of the function
``fairseq_cli.train.should_stop_early`` (``best``, ``num_runs``) that no checkpoint saves: a run
resumed from ``checkpoint_last.pt`` started counting afresh, from the first loss it saw after the
restart as its "best", so an interrupted run trained longer than the same run uninterrupted and
stopped at another epoch. (``checkpoint_best.pt`` is unaffected: ``save_checkpoint.best`` is in the
checkpoint's ``extra_state`` and restored.) Every checkpoint now carries the counter as well
(``extra_state["patience"]``, written by ``Trainer.save_checkpoint``), and loading a checkpoint to
resume (``checkpoint_utils.load_checkpoint``) restores it; a checkpoint written before this fix gives
back its best loss, with the count restarting at 0.
"""

import logging
import sys

from fairseq import checkpoint_utils
from fairseq.trainer import Trainer

from .install import install

logger = logging.getLogger(__name__)
STATE_KEY = "patience"


def _should_stop_early():
    """fairseq-train's ``should_stop_early`` (its module is ``__main__`` under ``python -m``), or None
    outside fairseq-train."""
    for name in ("fairseq_cli.train", "__main__"):
        func = getattr(sys.modules.get(name), "should_stop_early", None)
        if func is not None:
            return func
    return None


def saving_the_count(original):
    def save_checkpoint(self, filename, extra_state):
        func = _should_stop_early()
        if func is not None and getattr(func, "best", None) is not None:
            extra_state = dict(extra_state, **{STATE_KEY: {"best": func.best, "num_runs": func.num_runs}})
        return original(self, filename, extra_state)

    return save_checkpoint


def restoring_the_count(original):
    def load_checkpoint(cfg, trainer, **passthrough_args):
        extra_state, epoch_itr = original(cfg, trainer, **passthrough_args)
        func = _should_stop_early()
        if func is not None and extra_state is not None and not cfg.reset_meters and not cfg.reset_optimizer:
            state = extra_state.get(STATE_KEY)
            if state is not None:
                func.best, func.num_runs = state["best"], state["num_runs"]
                logger.info(f"patience: restored best {func.best:.3f}, {func.num_runs} validation(s) without "
                            "improvement since")
            elif extra_state.get("best") is not None:
                func.best, func.num_runs = extra_state["best"], 0
                logger.info(f"patience: restored best {func.best:.3f}; the checkpoint predates the count of "
                            "validations without improvement, which restarts at 0")
        return extra_state, epoch_itr

    return load_checkpoint


def apply():
    install(Trainer, "save_checkpoint", saving_the_count)
    install(checkpoint_utils, "load_checkpoint", restoring_the_count)
