"""Entry point of data-prep/prepare-*.sh: runs man_fairseq.recipes.data.prepare (or .multi30k) without importing
the fairseq plugin package (``man_fairseq/__init__`` imports fairseq and every model, seconds of
start-up that data preparation does not need; fairseq-preprocess runs as its own process): the
package is entered as a bare namespace, so its modules import as usual and its ``__init__`` never runs."""

import sys
import types
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "man_fairseq"
package = types.ModuleType("man_fairseq")
package.__path__ = [str(PKG)]
sys.modules.setdefault("man_fairseq", package)

if __name__ == "__main__":
    corpus = sys.argv[1] if len(sys.argv) > 1 else None
    if corpus == "multi30k":  # its own options (--src/--tgt, --bpe-merges): man_fairseq.recipes.data.multi30k
        from man_fairseq.recipes.data.multi30k import main  # noqa: E402
        sys.exit(main(sys.argv[2:]))
    from man_fairseq.recipes.data.prepare import main  # noqa: E402
    sys.exit(main(sys.argv[1:]))
