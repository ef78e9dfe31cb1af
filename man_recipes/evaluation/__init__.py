"""Stage 3, evaluation: average the last checkpoints, decode, score one run (``scripts/evaluate.sh``),
and the tables of the paper rows (``scripts/results_table.py``)."""
