"""The commit a record or report names: results/ rewritten by a running study is not a code change."""

import subprocess

from man_recipes.provenance import LOCAL_CHANGES, git_commit


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_git_commit_ignores_results_but_not_code(tmp_path):
    assert git_commit(repo=tmp_path) == "unknown"  # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.md").write_text("old\n")
    (tmp_path / "model.py").write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "c")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    short = git_commit(repo=tmp_path)
    assert len(short) >= 7 and head.startswith(short)
    assert git_commit(full=True, repo=tmp_path) == head
    (tmp_path / "results" / "table.md").write_text("rebuilt while a run trains\n")
    (tmp_path / "untracked.py").write_text("")
    assert git_commit(repo=tmp_path) == short
    (tmp_path / "model.py").write_text("x = 2\n")
    assert git_commit(repo=tmp_path) == short + LOCAL_CHANGES
    assert git_commit(full=True, repo=tmp_path) == head + LOCAL_CHANGES
