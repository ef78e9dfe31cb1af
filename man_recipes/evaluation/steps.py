"""The evaluation path of a trained run: average -> decode -> score -> record, one function per step,
which every entry point that evaluates calls: ``scripts/evaluate.sh`` (:mod:`.evaluate`),
``scripts/reproduce.sh`` (:mod:`..studies.study_eval`) and ``scripts/demo.py``.

* :func:`average`: the run's last N epoch (or update) checkpoints averaged into one file
  (:mod:`man_recipes.averaging`);
* :func:`decode`: fairseq-generate with a config's beam, length penalty, length limits and n-gram
  blocking, read back as hypotheses and targets (:mod:`.decode`);
* :func:`score`: a metric of the hypotheses against the references (:mod:`.metric`);
* :func:`record`: a result file written whole, so an interrupted write never leaves half of one
  (:func:`man_recipes.atomic.write_text`).

What each entry point records is its own: evaluate.sh's ``results.json`` / ``.md``
(:mod:`.result_files`), a study's run record (:mod:`..studies.study_records`), the demo's table.
"""

from man_recipes.atomic import write_text as record  # noqa: F401  (the record step)
from man_recipes.averaging import AverageError, CheckpointsNotFound, average_files, last_n_checkpoints  # noqa: F401
from man_recipes.evaluation.decode import EvaluateError, decode  # noqa: F401  (the decode step)
from man_recipes.evaluation.metric import DEMO_METRIC, Names, Scores, score  # noqa: F401  (the score step)

__all__ = ["average", "decode", "score", "record", "AverageError", "CheckpointsNotFound", "EvaluateError",
           "DEMO_METRIC", "Names", "Scores"]


def average(checkpoint_dir, n, by_update, output, overwrite=False):
    """Average the last ``n`` epoch checkpoints of ``checkpoint_dir`` (``by_update``: its update
    checkpoints) into ``output`` (``overwrite``: replacing it, for an output in the caller's own
    folder); returns the files averaged, newest first. :class:`CheckpointsNotFound` when fewer than
    ``n`` are there, :class:`AverageError` for any other reason."""
    inputs = last_n_checkpoints(str(checkpoint_dir), n, by_update)
    average_files(inputs, str(output), overwrite=overwrite)
    return inputs
