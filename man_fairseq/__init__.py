"""man-fairseq: local / masked attention Transformers as a fairseq ``--user-dir`` plugin.

``--user-dir`` imports ``models/`` and ``tasks/`` on its own but not criterions, and fairseq's
patches (``patches/``: the checkpoint allow-list, the batching fix, ...) must be in place before
fairseq loads a checkpoint or batches data, so everything is done here; first of all, a check that
torch and fairseq are ones the plugin runs with (``dependencies``).
"""

# The one place of the version: pyproject.toml reads it from here (without importing the package).
__version__ = "0.1.0"

from .dependencies import require  # noqa: E402

require()

from . import patches  # noqa: E402

patches.apply_all()

from . import criterions, models  # noqa: E402,F401  (registers archs and criterions)
