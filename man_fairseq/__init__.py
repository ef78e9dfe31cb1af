"""man-fairseq: local / masked attention Transformers as a fairseq ``--user-dir`` plugin.

``--user-dir`` imports ``models/`` and ``tasks/`` on its own but not criterions, and the
checkpoint allow-list (and the fix of the fork's batching, see ``fairseq_fixes``) must be in
place before fairseq loads a checkpoint or batches data, so everything is done here; first of
all, a check that torch and fairseq are ones the plugin runs with (``dependencies``).
"""

# The one place of the version: pyproject.toml reads it from here (without importing the package).
__version__ = "0.1.0"

from .dependencies import require  # noqa: E402

require()

from . import fairseq_fixes, known_warnings, patience_resume, resume_batches  # noqa: E402
from .checkpoint_compat import register_safe_globals  # noqa: E402

register_safe_globals()
fairseq_fixes.apply()
patience_resume.apply()
resume_batches.apply()
known_warnings.silence()

from . import criterions, models  # noqa: E402,F401  (registers archs and criterions)
