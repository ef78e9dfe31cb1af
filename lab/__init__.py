"""The project's own instruments, apart from the plugin: speed and profiling (``lab.speed``), the GPU
check and session, the learning-rate probe, the training studies, the ROUGE scorers' comparison.

Run from the checkout's root (``python -m lab.X``); it imports ``man_fairseq`` and is never imported
by it (tests/test_layering.py), and the wheel leaves it out (pyproject.toml).
"""
