"""Speed and memory of the families against fairseq's own Transformer (``scripts/benchmark.py``).

``cases`` (what is compared), ``batching`` (the random batches every model sees), ``model`` (one
model built and stepped as ``fairseq-train`` does it, in the recipes' precision), ``workers`` (the
measuring subprocesses), ``report`` (the Markdown table) and ``cli`` (the command line).
"""
