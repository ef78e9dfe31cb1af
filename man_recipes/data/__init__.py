"""Stage 1, data: download, tokenize (Moses), BPE and binarize the corpora (``data-prep/*.sh``)."""
