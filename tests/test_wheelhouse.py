"""The offline install (scripts/wheelhouse.py, `make wheelhouse` / `make install-offline`): what the
wheelhouse is asked to carry, that the install never reaches an index nor replaces torch, and the
one-line refusals. The end-to-end run (downloads ~115 MB, builds fairseq: minutes) is opt-in:
MAN_FAIRSEQ_WHEELHOUSE_E2E=1."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("wheelhouse", REPO / "scripts" / "wheelhouse.py")
wheelhouse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheelhouse)

SCRIPT = [sys.executable, str(REPO / "scripts" / "wheelhouse.py")]
FAIRSEQ = "fairseq-fixed==0.12.3.1"


def names(lines):
    return {wheelhouse.canonical(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]) for line in lines}


def make_vars():
    text = (REPO / "Makefile").read_text()
    return dict(re.findall(r"^(\w+) \?= (.+)$", text, flags=re.M)), text


def test_wheelhouse_carries_every_requirement_but_torch():
    reqs = wheelhouse.requirements(REPO / "requirements.txt")
    asked = names(reqs + wheelhouse.TOOLS)
    assert names(reqs) >= {"hydra-core", "sacremoses", "rouge-score", "numpy"}  # the file was read
    # The fairseq fork builds with --no-build-isolation: its pyproject's build needs, but torch,
    # must come from the wheelhouse.
    assert {"setuptools", "wheel", "cython", "numpy", "pip"} <= asked
    assert not any(wheelhouse.FORBIDDEN.match(f"{name}-1.0-py3-none-any.whl") for name in asked)
    assert wheelhouse.FORBIDDEN.match("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert wheelhouse.FORBIDDEN.match("nvidia_cublas-13.0-py3-none-manylinux_2_27_x86_64.whl")


def test_the_wheelhouse_carries_what_the_package_declares():
    # The wheelhouse is made from requirements.txt and the extras: a runtime dependency written
    # into pyproject.toml instead of requirements.txt would be missing on the node.
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "dependencies" in project["project"]["dynamic"] and "dependencies" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.txt"]}
    # the extras: the test tools, and the analyses' matplotlib and deepsig (the study tables' ASO test)
    assert names(wheelhouse.extras()) == {"pytest", "pytest-xdist", "matplotlib", "deepsig"}


def test_makefile_targets_and_defaults():
    defaults, text = make_vars()
    assert defaults["WHEELHOUSE"] == "wheelhouse" and defaults["WHEELHOUSE_PYTHON"] == "3.12"
    phony = re.search(r"^\.PHONY: (.+)$", text, flags=re.M).group(1).split()
    assert {"wheelhouse", "install-offline"} <= set(phony)
    build = re.search(r"^wheelhouse: install\n((?:\t.*\n)+)", text, flags=re.M).group(1)
    assert "scripts/wheelhouse.py build" in build and "$(WHEELHOUSE_PYTHON)" in build
    # the node's torch version: the wheels must meet its caps (torch 2.11: setuptools<82)
    assert "--torch $(WHEELHOUSE_TORCH)" in build and defaults["WHEELHOUSE_TORCH"] == "2.11.0"
    offline = re.search(r"^install-offline:\n((?:\t.*\n)+)", text, flags=re.M).group(1)
    assert "scripts/wheelhouse.py install" in offline and "$(FAIRSEQ_PKG)" in offline
    assert "touch $(STAMP)" in offline  # make test / gpu-check afterwards do not go online
    assert "/wheelhouse/" in (REPO / ".gitignore").read_text().split()


def test_install_uses_only_the_wheelhouse_and_pins_torch(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(wheelhouse, "run", lambda cmd, **kw: calls.append([str(c) for c in cmd])
                        or subprocess.CompletedProcess(cmd, 0))
    constraints = tmp_path / "torch.txt"
    wheelhouse.pip_install("py", tmp_path, constraints, "-r", "requirements.txt")
    (cmd,) = calls
    assert cmd[:4] == ["py", "-m", "pip", "install"] and "--no-index" in cmd
    assert cmd[cmd.index("--find-links") + 1] == str(tmp_path)
    assert cmd[cmd.index("--constraint") + 1] == str(constraints)


def test_platform_tags_cover_older_manylinux():
    tags = wheelhouse.platform_tags("2.28")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_29_x86_64" not in tags
    with pytest.raises(wheelhouse.Refusal):
        wheelhouse.platform_tags("2.12")


def test_pure_wheel_names():
    assert wheelhouse.pure("rouge_score-0.1.2-py3-none-any.whl")
    assert wheelhouse.pure("six-1.17.0-py2.py3-none-any.whl")
    assert not wheelhouse.pure("regex-2026.11.19-cp312-cp312-manylinux_2_28_x86_64.whl")


def refusal(args, **kwargs):
    proc = subprocess.run(SCRIPT + args, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def fake_wheelhouse(path, python):
    path.mkdir()
    (path / "fairseq_fixed-0.12.3.1.tar.gz").write_bytes(b"")
    (path / wheelhouse.MANIFEST).write_text(json.dumps(
        {"python": python, "glibc": "2.17", "fairseq": FAIRSEQ, "fairseq_sdist": "fairseq_fixed-0.12.3.1.tar.gz"}))
    return path


def here():
    return "%d.%d" % sys.version_info[:2]


def test_install_refuses_a_folder_without_manifest(tmp_path):
    line = refusal(["install", "--wheelhouse", str(tmp_path), "--venv", str(tmp_path / "venv")])
    assert str(tmp_path) in line and "make wheelhouse" in line
    assert not (tmp_path / "venv").exists()


def test_install_refuses_another_python_version(tmp_path):
    wh = fake_wheelhouse(tmp_path / "wh", "3.7")
    line = refusal(["install", "--wheelhouse", str(wh), "--venv", str(tmp_path / "venv"),
                    "--python", sys.executable, "--fairseq", FAIRSEQ])
    assert f"is Python {here()}" in line and "WHEELHOUSE_PYTHON=" in line
    assert not (tmp_path / "venv").exists()


def test_install_refuses_a_python_without_torch(tmp_path):
    # The same interpreter without site-packages: it runs, but cannot import torch.
    bare = tmp_path / "python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    wh = fake_wheelhouse(tmp_path / "wh", here())
    line = refusal(["install", "--wheelhouse", str(wh), "--venv", str(tmp_path / "venv"),
                    "--python", str(bare), "--fairseq", FAIRSEQ])
    assert "cannot import torch" in line and "fetches none" in line
    assert not (tmp_path / "venv").exists()


def test_install_refuses_a_wheelhouse_missing_the_fairseq_sdist(tmp_path):
    wh = fake_wheelhouse(tmp_path / "wh", here())
    (wh / "fairseq_fixed-0.12.3.1.tar.gz").unlink()
    line = refusal(["install", "--wheelhouse", str(wh), "--venv", str(tmp_path / "venv")])
    assert "fairseq_fixed-0.12.3.1.tar.gz is missing" in line


def test_build_refuses_a_wheelhouse_of_another_python(tmp_path):
    # Checked before anything is downloaded; the old manifest stays.
    wh = fake_wheelhouse(tmp_path / "wh", "3.11")
    line = refusal(["build", "--dest", str(wh), "--python-version", "3.12"])
    assert "Python 3.11, not 3.12" in line
    assert json.loads((wh / wheelhouse.MANIFEST).read_text())["python"] == "3.11"


def test_build_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    line = refusal(["build", "--dest", str(tmp_path), "--python-version", "3.12"])
    assert "not empty" in line and (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.skipif(not os.environ.get("MAN_FAIRSEQ_WHEELHOUSE_E2E"),
                    reason="opt-in: MAN_FAIRSEQ_WHEELHOUSE_E2E=<a Python, not a venv, that imports torch>; "
                           "downloads ~115 MB and builds fairseq (minutes)")
def test_end_to_end_offline_install(tmp_path):
    """As on a GPU node: a wheelhouse for that Python's version (built by this Python, which needs
    PyPI), then `make install-offline PYTHON=that` in a copy of this checkout, which makes a venv
    seeing that Python's torch; pip reads no configuration and, where `unshare -n` works, has no
    network at all. Then fairseq-train --help with this project's --user-dir."""
    node_python = os.environ["MAN_FAIRSEQ_WHEELHOUSE_E2E"]
    version = subprocess.run([node_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    wh = tmp_path / "wh"
    subprocess.run(SCRIPT + ["build", "--dest", str(wh), "--python-version", version, "--fairseq", FAIRSEQ],
                   check=True)
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".git", ".venv", "wheelhouse", "runs",
                                                                  "*.egg-info", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env.update(PIP_CONFIG_FILE=os.devnull)
    offline = ["unshare", "-n"] if shutil.which("unshare") and \
        subprocess.run(["unshare", "-n", "true"]).returncode == 0 else []
    venv = tmp_path / "venv"
    subprocess.run(offline + ["make", "-C", str(checkout), "install-offline", f"WHEELHOUSE={wh}",
                              f"PYTHON={node_python}", f"VENV={venv}"], check=True, env=env)
    assert (venv / ".installed").exists()
    proc = subprocess.run(offline + [str(venv / "bin" / "fairseq-train"), "--help", "--user-dir",
                                     str(checkout / "man_fairseq"), "--arch", "transformer_diffwin_small"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "--user-dir" in proc.stdout, proc.stderr[-2000:]
    # the project's modules come from the checkout, torch from the node's Python
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import man_fairseq, torch; "
                            "print(man_fairseq.__file__); print(torch.__file__)"],
                           capture_output=True, text=True, check=True, env=env, cwd=tmp_path).stdout.split()
    assert where[0].startswith(str(checkout)) and not where[1].startswith(str(venv))
