"""man-fairseq criterions. Importing a module registers its criterion."""

import importlib
import os

# every module of this folder, like fairseq's own criterions/__init__.py
for _file in sorted(os.listdir(os.path.dirname(__file__))):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(__name__ + "." + _file[:-3])
