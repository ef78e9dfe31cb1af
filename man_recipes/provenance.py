"""Which code and which machine produced a result: the commit and the CPU model, for records and reports."""

import platform
import subprocess

from man_recipes.interrupt import run_child
from man_recipes.paths import REPO

LOCAL_CHANGES = "+local changes"


def _git(repo, *args):
    try:
        out = run_child(["git", *args], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(full=False, repo=REPO):
    """The checkout's commit, with "+local changes" when tracked files outside ``results/`` differ
    from it; "unknown" outside a git checkout.

    ``results/`` is left out because the study's launchers rewrite its table while other runs are
    still training: that does not change the code a record was produced with.
    """
    commit = _git(repo, "rev-parse", "HEAD") if full else _git(repo, "rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    if _git(repo, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"):
        commit += LOCAL_CHANGES
    return commit


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
