"""Stage 2, training: the fairseq-train command of a config and its launch (``scripts/train.sh``),
the training logs, and the probes that train a few updates (learning rate, sublayer gradients)."""
