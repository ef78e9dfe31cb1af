"""``from_pretrained`` with a folder or checkpoint that does not exist names it, and its keywords are
checked as ``--model-overrides`` is.

fairseq's ``hub_utils.from_pretrained`` ended in ``TypeError: expected str ... not NoneType`` for a run
folder, checkpoint file or data folder that does not exist (its archive lookup returns None for a path
it cannot find); it is now a FileNotFoundError naming the path and the keyword. Its other keywords are
overrides of the checkpoint's options, which fairseq set without a word where nothing reads them
(another family's option, a misspelt name, ``attention_backend`` on fairseq's own Transformer): the
command line's rule refuses them (:mod:`.model_overrides`).
"""

import os

from fairseq import hub_utils

from .install import install
from .model_overrides import requested_overrides

# keywords from_pretrained reads itself, not options of the checkpoint
HUB_KEYWORDS = ("generation_args", "is_vocoder")


def _local_missing(name, archive_map):
    """Whether ``name`` is meant as a local path (not an archive name or a URL) and does not exist."""
    return isinstance(name, str) and name not in (archive_map or {}) and "://" not in name and not os.path.exists(name)


def naming_missing_paths(fairseq_from_pretrained):
    def from_pretrained(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", archive_map=None,
                        **kwargs):
        if _local_missing(model_name_or_path, archive_map):
            raise FileNotFoundError(f"from_pretrained: the run folder {model_name_or_path} does not exist")
        if isinstance(model_name_or_path, str) and os.path.isdir(model_name_or_path):
            for name in checkpoint_file.split(os.pathsep):
                if not os.path.isfile(os.path.join(model_name_or_path, name)):
                    raise FileNotFoundError(f"from_pretrained: checkpoint_file {name!r} is not in the run folder "
                                            f"{model_name_or_path} (it is relative to it)")
        if not str(data_name_or_path).startswith(".") and _local_missing(data_name_or_path, archive_map):
            raise FileNotFoundError(f"from_pretrained: the data folder {data_name_or_path} (data_name_or_path, the "
                                    "folder with the dictionaries) does not exist")
        with requested_overrides([k for k in kwargs if k not in HUB_KEYWORDS], "from_pretrained({key}=...)"):
            return fairseq_from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, archive_map, **kwargs)

    return from_pretrained


def apply():
    install(hub_utils, "from_pretrained", naming_missing_paths)
