"""The config of a scripts/train.sh run of the tiny MAN model (conftest's TINY_MODEL) on the toy
corpus: shared by the training and evaluation tests (tests/test_recipes.py, tests/test_workflow.py)."""

from conftest import TINY_MODEL


def toy_config(data_bin, name, train, batch, evaluation, **extra):
    """The config ``name`` on ``data_bin``: ``train`` and ``evaluation`` join the options every toy
    run shares; ``batch`` and ``extra`` (more top-level keys) are the caller's."""
    model = {TINY_MODEL[i].lstrip("-"): TINY_MODEL[i + 1] for i in range(0, len(TINY_MODEL), 2)}
    return {"name": name, "paper": "man", "table": "toy", "row": "toy", "dataset": "toy",
            "data": str(data_bin), "source_lang": "src", "target_lang": "tgt",
            "arch": "transformer_man_small", "model": model,
            "train": {"optimizer": "adam", "lr": 0.003, "lr-scheduler": "inverse_sqrt",
                      "criterion": "label_smoothed_cross_entropy", "label-smoothing": 0.1,
                      "share-all-embeddings": True, "num-workers": 0, "no-progress-bar": True, "seed": 1, **train},
            "batch": batch,
            "eval": {"metric": "bleu_ci", "beam": 2, "max_len_a": 1, "max_len_b": 5, **evaluation},
            **extra}
