"""The package as pip builds and installs it (pyproject.toml), and the one-line refusal of
``import man_fairseq`` when torch or fairseq is missing, too old or does not import.

The wheel is built offline (``pip wheel --no-deps --no-build-isolation --no-index``) from a copy of
the package's sources, so nothing is written into the checkout; it is installed with ``--no-deps``
into a fresh venv that sees the project's torch and fairseq through a ``.pth`` line (not their
``.pth`` files: the checkout's editable install stays invisible there)."""

import configparser
import email
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
import torch

from conftest import REPO, child_env, run_cli

import man_fairseq
from man_fairseq import dependencies

PACKAGES = ("man_fairseq", "man_recipes")  # the plugin, and the recipes and commands beside it
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirement_lines():
    lines = (line.strip() for line in (REPO / "requirements.txt").read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def normalized(req):
    """'omegaconf>=2.3,<2.4' and 'omegaconf<2.4,>=2.3' alike (pip writes specifiers sorted)."""
    name, spec = re.match(r"([A-Za-z0-9_.\-]+)(.*)", req.replace(" ", "")).groups()
    return name.lower(), tuple(sorted(filter(None, spec.split(","))))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    run_cli([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
             "--wheel-dir", tmp / "dist", src], timeout=300)
    (found,) = (tmp / "dist").glob("*.whl")
    return found


def test_wheel_metadata(wheel):
    assert wheel.name == f"man_fairseq-{man_fairseq.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"man_fairseq-{man_fairseq.__version__}.dist-info"
        meta = email.message_from_string(zf.read(f"{info}/METADATA").decode())
        entry_points = configparser.ConfigParser()
        entry_points.read_string(zf.read(f"{info}/entry_points.txt").decode())
    assert meta["Name"] == "man-fairseq" and meta["Version"] == man_fairseq.__version__
    requires = meta.get_all("Requires-Dist")
    runtime = [r for r in requires if "extra ==" not in r]
    # the runtime dependencies are requirements.txt, exactly; torch and fairseq are not declared
    assert sorted(map(normalized, runtime)) == sorted(map(normalized, requirement_lines()))
    assert not any(normalized(r)[0] in ("torch", "fairseq", "fairseq-fixed", "pytest") for r in runtime)
    assert sorted(meta.get_all("Provides-Extra")) == ["analysis", "test"]
    extras = {}
    for req in requires:
        if "extra ==" in req:
            extras.setdefault(re.search(r'extra == "(\w+)"', req).group(1), set()).add(req.split(";")[0].strip())
    assert extras == {name: set(reqs) for name, reqs in PROJECT["optional-dependencies"].items()}
    assert {"pytest", "pytest-xdist"} <= extras["test"] and "matplotlib" in extras["analysis"]
    scripts = dict(entry_points["console_scripts"])
    assert scripts == PROJECT["scripts"] and len(scripts) == 8
    assert "man-options" in scripts
    # every module of the two packages is in the wheel, and nothing but the packages
    modules = {str(p.relative_to(REPO)) for package in PACKAGES for p in (REPO / package).rglob("*.py")}
    assert modules <= set(names)
    assert {n.split("/")[0] for n in names} == {*PACKAGES, info}


def test_wheel_installs_into_a_venv_that_has_torch_and_fairseq(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    purelib = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    # the project's torch, fairseq and the runtime dependencies, as a GPU cluster's environment has them
    (purelib / "project-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run_cli([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-deps",
             "--no-index", "--quiet", wheel], timeout=300)
    proc = run_cli([venv / "bin" / "python", "-c", "import importlib.metadata, man_fairseq; "
                    "print(man_fairseq.__file__, importlib.metadata.version('man-fairseq'))"], cwd=tmp_path)
    where, version = proc.stdout.split()[-2:]
    assert Path(where).is_relative_to(purelib) and version == man_fairseq.__version__  # the wheel's, not the checkout
    proc = run_cli([venv / "bin" / "man-options", "--help"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert "usage: man-options" in proc.stdout
    # the recipes import without the checkout, and a config name says where the configs are
    proc = run_cli([venv / "bin" / "python", "-c", "import man_recipes.config as c\ntry:\n    c.load_config('man')\n"
                    "except c.ConfigError as e:\n    print(e)"], cwd=tmp_path)
    assert "the recipe configs are the checkout's configs/ folder, which an installed wheel does not have" in proc.stdout


# ---- import man_fairseq with an unusable torch or fairseq ----------------------------------------

def test_supported_versions():
    assert dependencies.torch_problem(torch.__version__) is None  # this environment's
    assert dependencies.torch_problem("2.11.0+cu130") is None and dependencies.torch_problem("2.13.0+cpu") is None
    assert dependencies.torch_problem("2.10.0") == "torch 2.10.0 is too old"
    assert dependencies.torch_problem("1.13.1") == "torch 1.13.1 is too old"
    assert dependencies.fairseq_problem("0.12.3.1") is None and dependencies.fairseq_problem("0.12.2") is None
    assert dependencies.fairseq_problem("0.10.2") == "fairseq 0.10.2 is not 0.12"
    assert dependencies.fairseq_problem("") == "fairseq (no version) is not 0.12"


def test_the_makefile_installs_what_the_message_names():
    makefile = (REPO / "Makefile").read_text()
    assert f"FAIRSEQ_PKG ?= {dependencies.FAIRSEQ_PKG}\n" in makefile
    torch_pin = re.search(r"^TORCH_VERSION \?= (\S+)$", makefile, flags=re.M).group(1)
    assert dependencies.torch_problem(torch_pin) is None


def refusal(code, env=None):
    """The last stderr line of ``import man_fairseq`` in a new interpreter after ``code``."""
    proc = subprocess.run([sys.executable, "-c", f"{code}\nimport man_fairseq"], capture_output=True, text=True,
                          env=child_env(env), timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and "man-fairseq needs torch >= 2.11" in last
    assert "fairseq-fixed==0.12.3.1" in last and "make install" in last
    return last


def test_import_refuses_a_missing_fairseq():
    line = refusal("import sys; sys.modules['fairseq'] = None")
    assert line.startswith("ImportError: fairseq is not installed: ")


def test_import_refuses_an_old_torch():
    line = refusal("import torch; torch.__version__ = '2.5.1'")
    assert line.startswith("ImportError: torch 2.5.1 is too old: ")


def test_import_refuses_a_fairseq_that_does_not_import(tmp_path):
    # fairseq 0.12.2 on Python 3.11 fails in its dataclasses like this (fairseq issue 5012)
    (tmp_path / "fairseq").mkdir()
    (tmp_path / "fairseq" / "__init__.py").write_text(
        "raise ValueError('mutable default <class X> for field common is not allowed: use default_factory')\n")
    line = refusal("", env={"PYTHONPATH": str(tmp_path)})
    assert line.startswith("ImportError: fairseq does not import (ValueError: mutable default <class X> for field ")


# ---- citing --------------------------------------------------------------------------------------

def test_citation_file_and_readme_bibtex_agree():
    import yaml

    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["version"] == man_fairseq.__version__
    readme = (REPO / "README.md").read_text()
    block = re.search(r"^## Citing\n.*?```bibtex\n(.*?)```", readme, flags=re.M | re.S).group(1)
    entries = {}
    for body in re.split(r"^@inproceedings\{", block, flags=re.M)[1:]:
        fields = dict(re.findall(r"^  (\w+) = \{(.*)\},$", body, flags=re.M))
        entries[fields["title"]] = fields
    papers = [r for r in cff["references"] if r["title"] in entries]
    assert len(entries) == 4 and len(papers) == 4  # the four families' papers, in both
    for paper in papers:
        entry = entries[paper["title"]]
        assert entry["doi"] == paper["doi"] and entry["year"] == str(paper["year"])
        assert entry["pages"] == f"{paper['start']}--{paper['end']}"
        assert entry["author"] == " and ".join(f"{a['family-names']}, {a['given-names']}" for a in paper["authors"])
        # the README's family table names the same paper, first author and year
        first = paper["authors"][0]["family-names"]
        assert re.search(rf"\*{re.escape(paper['title'])}[^*]*\* \({first} et al\., \w+ {paper['year']}\)", readme)
