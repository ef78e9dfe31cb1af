"""man-fairseq: local / masked attention Transformers as a fairseq ``--user-dir`` plugin.

``--user-dir`` imports ``models/`` and ``tasks/`` on its own but not criterions, and the
checkpoint allow-list must be in place before fairseq loads a checkpoint, so everything is
imported here.
"""

from .checkpoint_compat import register_safe_globals

register_safe_globals()

from . import criterions, models  # noqa: E402,F401  (registers archs and criterions)
