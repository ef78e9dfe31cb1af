"""Entry point of data-prep/prepare-multi30k.sh: runs man_fairseq.recipes.multi30k without importing
the fairseq plugin package (same start-up shortcut as data-prep/_prepare.py)."""

import importlib.util
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "man_fairseq" / "recipes"
spec = importlib.util.spec_from_file_location("man_fairseq_recipes", PKG / "__init__.py",
                                              submodule_search_locations=[str(PKG)])
module = importlib.util.module_from_spec(spec)
sys.modules["man_fairseq_recipes"] = module
spec.loader.exec_module(module)

from man_fairseq_recipes.multi30k import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
