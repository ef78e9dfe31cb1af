"""Where the checkout's parts are: the repository, the plugin folder fairseq's ``--user-dir`` names,
the recipe configs. Defined once here, for the recipes, the benchmark and the scripts. An installed
wheel has the two packages and not the checkout's configs/ (nor scripts/, data-prep/): there a config
is given by its file's path."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "man_fairseq")
CONFIG_DIR = REPO / "configs"


def output_folder_problem(folder):
    """None when ``folder`` is a folder this process can write into, or can create; otherwise why not
    (a file in its place or above it, a read-only folder on the way). Every command checks its output
    folders with it before the work, so a wrong one is one line, not a traceback after the work."""
    import os

    folder = Path(folder).absolute()
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent  # the first part of the path that exists: where the folders get made
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None
