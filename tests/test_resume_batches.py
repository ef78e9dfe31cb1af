"""A training run interrupted and resumed ends exactly where the same run uninterrupted ends
(man_fairseq/patches/resume_batches.py): fairseq 0.12 made a resumed run's batches anew at the epoch it
resumed at, so the two parted at the first update after the resume."""

import torch

from conftest import TINY_MODEL, TINY_TRAIN, run_cli

from man_recipes.studies.convergence import checkpoint_updates
from man_fairseq.patches.resume_batches import kept_across_epochs

# dropout on, as in the studies: fairseq reseeds it every update, so it is part of what must agree
OPTIONS = ["--arch", "transformer_man_small", "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, "--seed", "3",
           "--no-epoch-checkpoints", "--max-epoch", "3"]


def _train(data, save_dir, *extra):
    run_cli(["fairseq-train", data, "--user-dir", "man_fairseq", *OPTIONS, "--save-dir", save_dir, *extra])
    return torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)


def _differing(a, b):
    return [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]


def test_a_resumed_run_ends_as_the_same_run_uninterrupted(toy_data_bin, tmp_path):
    whole = _train(toy_data_bin, tmp_path / "whole")
    # stopped at the end of epoch 1, resumed: before the fix every parameter differed at the end
    _train(toy_data_bin, tmp_path / "at-epoch-end", "--max-epoch", "1")
    resumed = _train(toy_data_bin, tmp_path / "at-epoch-end")
    # stopped within epoch 2 (a few updates into it), resumed from there
    per_epoch = checkpoint_updates(tmp_path / "at-epoch-end" / "checkpoint_last.pt") // 3
    _train(toy_data_bin, tmp_path / "within-epoch", "--max-update", str(per_epoch + 3))
    within = torch.load(tmp_path / "within-epoch" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert within["extra_state"]["train_iterator"] == {"version": 2, "epoch": 2, "iterations_in_epoch": 3,
                                                       "shuffle": True}
    resumed_within = _train(toy_data_bin, tmp_path / "within-epoch", "--max-update", "0")
    for other in (resumed, resumed_within):
        assert other["optimizer_history"][-1]["num_updates"] == whole["optimizer_history"][-1]["num_updates"]
        assert _differing(whole, other) == []
        assert other["extra_state"]["best"] == whole["extra_state"]["best"]


def _ids(iterator):
    return [batch.tolist() for batch in iterator.frozen_batches]


def test_batches_are_kept_across_epochs_only_where_fairseq_keeps_them(toy_data_bin):
    """The fix leaves alone what fairseq makes anew every epoch anyway."""
    from fairseq import options, tasks

    import man_fairseq  # noqa: F401  (applies the fix)

    args = options.parse_args_and_arch(options.get_training_parser(),
                                       [str(toy_data_bin), "--arch", "transformer", "-s", "src", "-t", "tgt"])
    task = tasks.setup_task(args)
    task.load_dataset("train")
    train = task.dataset("train")
    assert kept_across_epochs(task, train)
    assert not kept_across_epochs(task, train, disable_iterator_cache=True)  # sharded data: fairseq's choice
    assert not kept_across_epochs(task, train, update_epoch_batch_itr=True)
    first = task.get_batch_iterator(train, max_tokens=1000, seed=3, epoch=1)
    task.dataset_to_epoch_iter.clear()
    later = task.get_batch_iterator(train, max_tokens=1000, seed=3, epoch=4)  # a run resumed at epoch 4
    assert later.epoch == 4 and _ids(later) == _ids(first)
    rebuilt = task.get_batch_iterator(train, max_tokens=1000, seed=3, epoch=4, disable_iterator_cache=True)
    assert _ids(rebuilt) != _ids(first)  # fairseq's own batches of epoch 4
