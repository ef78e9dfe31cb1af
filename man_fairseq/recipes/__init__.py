"""Reproduction recipes, one package per stage of the pipeline, each floor importing only those below:

* :mod:`.data`: download, tokenize, BPE and binarize the corpora (``data-prep/*.sh``);
* :mod:`.training`: build and run fairseq-train for a config (``scripts/train.sh``);
* :mod:`.evaluation`: average, decode, score one run (``scripts/evaluate.sh``), the paper tables;
* :mod:`.studies`: every family against the Transformer over seeds (``scripts/reproduce.sh``);
* :mod:`.checks`: the whole pipeline end to end (``make smoke``).

Beside them, what every stage shares: the configs (:mod:`.config`), the environment and runner of
fairseq's command-line tools (:mod:`.tools`), work folders (:mod:`.workdir`).

Nothing here is imported by the fairseq plugin itself (``man_fairseq/__init__.py`` only imports
``models/`` and ``criterions/``), so the recipes add no start-up cost to fairseq-train.
"""
