"""man-fairseq models. Importing a module registers its model and architectures."""

import importlib
import os

# every module of this folder, like fairseq's own models/__init__.py
for _file in sorted(os.listdir(os.path.dirname(__file__))):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(__name__ + "." + _file[:-3])
