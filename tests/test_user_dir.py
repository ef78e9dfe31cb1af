"""The ``--user-dir`` that docs/usage.md gives for use outside the checkout works from any folder
(issue #72 item 6: ``--user-dir man_fairseq`` elsewhere is fairseq's FileNotFoundError traceback)."""

import re
import subprocess
import sys

from conftest import REPO, child_env


def documented_line():
    (line,) = re.findall(r"^MAN_USER_DIR=.*$", (REPO / "docs" / "usage.md").read_text(), re.M)
    return line


def test_the_documented_user_dir_works_outside_the_checkout(tmp_path):
    env = child_env({"PYTHONPATH": str(REPO), "PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin"})
    shown = subprocess.run(["bash", "-c", documented_line() + '\nprintf %s "$MAN_USER_DIR"'], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120, check=True).stdout
    assert shown == str(REPO / "man_fairseq")
    # fairseq's own loader takes it, run from a folder with no man_fairseq in it
    code = ("import argparse, sys; from fairseq import utils; "
            "utils.import_user_module(argparse.Namespace(user_dir=sys.argv[1])); "
            "from fairseq.models import ARCH_MODEL_REGISTRY; print('transformer_man_small' in ARCH_MODEL_REGISTRY)")
    loaded = subprocess.run([sys.executable, "-c", code, shown], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=300)
    assert loaded.stdout.strip().splitlines()[-1:] == ["True"], loaded.stderr[-2000:]
