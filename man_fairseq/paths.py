"""Where the checkout's parts are: the repository, the plugin folder fairseq's ``--user-dir`` names,
the recipe configs. Defined once here, for the recipes, the benchmark and the scripts."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "man_fairseq")
CONFIG_DIR = REPO / "configs"
