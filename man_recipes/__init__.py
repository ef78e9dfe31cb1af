"""man-recipes: everything of the checkout beside the fairseq plugin (``man_fairseq/``): the recipes that
take the papers' experiments from raw corpora to results tables, their scoring, the analyses and the
commands. It imports the plugin where it trains, loads or scores a model; the plugin never imports it.

The recipes, one package per stage of the pipeline, each floor importing only those below:

* :mod:`.data`: download, tokenize, BPE and binarize the corpora (``data-prep/*.sh``);
* :mod:`.training`: build and run fairseq-train for a config (``scripts/train.sh``);
* :mod:`.evaluation`: average, decode, score one run (``scripts/evaluate.sh``), the paper tables;
* :mod:`.studies`: every family against the Transformer over seeds (``scripts/reproduce.sh``);
* :mod:`.checks`: the whole pipeline end to end (``make smoke``).

Beneath them, what every stage shares: paths, text files, tables, logging, the Ctrl-C line, provenance,
the toy corpus; checkpoint averaging, scoring (BLEU, ROUGE-1.5.5) and the analyses (:mod:`.analysis`);
the configs (:mod:`.config`), the environment and runner of fairseq's command-line tools
(:mod:`.tools`), work folders (:mod:`.workdir`). Above them, the console commands (:mod:`.cli`).
"""
