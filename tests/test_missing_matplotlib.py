"""matplotlib is the ``analysis`` extra, not a dependency: a figure without it is one line naming
the install command, never a traceback."""

import subprocess
import sys

from conftest import REPO

# blocks the import as an environment without matplotlib would
PROGRAM = """
import sys
sys.modules["matplotlib"] = None
from man_recipes.logging_setup import pyplot
pyplot()
"""


def test_a_figure_without_matplotlib_is_one_line():
    proc = subprocess.run([sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: drawing a figure needs matplotlib, which is not installed: "
                     "pip install 'man-fairseq[analysis]' (or pip install matplotlib)"], proc.stderr
