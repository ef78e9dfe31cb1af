"""man-fairseq: local / masked attention Transformers as a fairseq ``--user-dir`` plugin.

``--user-dir`` imports ``models/`` and ``tasks/`` on its own but not criterions, and the
checkpoint allow-list (and the fix of the fork's batching, see ``fairseq_fixes``) must be in
place before fairseq loads a checkpoint or batches data, so everything is done here.
"""

from . import fairseq_fixes, known_warnings
from .checkpoint_compat import register_safe_globals

register_safe_globals()
fairseq_fixes.apply()
known_warnings.silence()

from . import criterions, models  # noqa: E402,F401  (registers archs and criterions)
