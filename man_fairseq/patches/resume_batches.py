"""A resumed training run trains on the batches of the same run uninterrupted.

fairseq 0.12 makes a training run's batches once, when the run first asks for its training iterator
(``FairseqTask.get_batch_iterator``), and shuffles those batches anew every epoch (seed + epoch). Which
sentences share a batch depends on the epoch it was made at: the examples are ordered by length under
``numpy_seed(seed + epoch)``, ties broken at random. A run started from scratch makes them at epoch 1
and keeps them; a run resumed from a checkpoint at epoch N made them at epoch N. So every resume
changed the rest of the run's batches: the same command, interrupted once, ended at another loss than
uninterrupted (dropout and the parameters were restored exactly; fairseq reseeds every update from
seed + update number). A resumed run now makes its batches as at epoch 1, where the iterator would
have been kept across epochs had the run not stopped: not for sharded data, a dataset that cannot
reuse its iterator or ``--rebuild-batches``, whose batches fairseq makes each epoch anyway.
"""

import inspect

from fairseq.tasks.fairseq_task import FairseqTask

from .install import install


def kept_across_epochs(task, dataset, disable_iterator_cache=False, update_epoch_batch_itr=False):
    """Whether fairseq keeps ``dataset``'s iterator (and so its batches) from one epoch to the next."""
    return (not disable_iterator_cache and not update_epoch_batch_itr and task.can_reuse_epoch_itr(dataset)
            and not getattr(task.cfg, "rebuild_batches", False))


def batches_of_the_first_epoch(fairseq_get_batch_iterator):
    signature = inspect.signature(fairseq_get_batch_iterator)

    def get_batch_iterator(self, *args, **kwargs):
        call = signature.bind(self, *args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        epoch, dataset = a["epoch"], a["dataset"]
        if (epoch <= 1 or dataset in self.dataset_to_epoch_iter
                or not kept_across_epochs(self, dataset, a["disable_iterator_cache"], a["update_epoch_batch_itr"])):
            return fairseq_get_batch_iterator(**a)
        # a run resumed at `epoch`: the batches it made at its first epoch, at the epoch it is in
        iterator = fairseq_get_batch_iterator(**dict(a, epoch=1))
        iterator.epoch = epoch
        dataset.set_epoch(epoch)
        return iterator

    return get_batch_iterator


def apply():
    install(FairseqTask, "get_batch_iterator", batches_of_the_first_epoch)
