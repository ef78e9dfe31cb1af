"""Entry point of data-prep/prepare-*.sh: runs man_fairseq.recipes.prepare (or .multi30k) without importing the
fairseq plugin package (``man_fairseq/__init__`` imports fairseq and every model, seconds of
start-up that data preparation does not need; fairseq-preprocess runs as its own process)."""

import importlib.util
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "man_fairseq" / "recipes"
spec = importlib.util.spec_from_file_location("man_fairseq_recipes", PKG / "__init__.py",
                                              submodule_search_locations=[str(PKG)])
module = importlib.util.module_from_spec(spec)
sys.modules["man_fairseq_recipes"] = module
spec.loader.exec_module(module)

if __name__ == "__main__":
    corpus = sys.argv[1] if len(sys.argv) > 1 else None
    if corpus == "multi30k":  # its own options (--src/--tgt, --bpe-merges): man_fairseq.recipes.multi30k
        from man_fairseq_recipes.multi30k import main  # noqa: E402
        sys.exit(main(sys.argv[2:]))
    from man_fairseq_recipes.prepare import main  # noqa: E402
    sys.exit(main(sys.argv[1:]))
