"""No command prints library debug noise: each one runs the shared quiet setup
(``man_recipes/logging_setup.py``) first thing, and a real plot prints no DEBUG line."""

import ast
import importlib
import importlib.util
import json
import logging
import re
import sys

import pytest

from conftest import REPO, run_cli
from man_recipes.logging_setup import NOISY_LOGGERS, pyplot, quiet_logging

# every user-facing command: the console scripts of pyproject.toml, the recipes behind scripts/*.sh and
# data-prep/*.sh, and the Python scripts
RECIPES = ["evaluation.evaluate", "training.launch", "studies.reproduce", "evaluation.results_table", "checks.smoke",
           "data.head_subset"]
# the lab's instruments (lab/: run from the checkout)
LAB = ["lab.gpu_check", "lab.lr_probe", "lab.sublayer_grads", "lab.speed.__main__", "lab.speed.study", "lab.speed.synthetic",
       "lab.speed.profile", "lab.man_training_study", "lab.compare_rouge_scorers"]
# data-prep/*.sh run these, which never import the plugin package: fairseq is never imported, so the root
# logger keeps Python's default (WARNING), and they draw nothing
DATA_PREP = ["data.prepare", "data.multi30k"]
COMMANDS = (
    [f"man_recipes.cli.{m}:{f}" for m, f in [
        ("analyze", "cli_main"), ("average_checkpoints", "main"), ("options", "cli_main"),
        ("localness_windows", "cli_main"), ("diffwin_windows", "cli_main"),
        ("export_calibration", "cli_main"), ("attention_locality", "cli_main"), ("files2rouge", "main")]]
    + [f"man_recipes.{m}:main" for m in RECIPES]
    + [f"{m}:main" for m in LAB]
    + ["scripts/demo.py:main"]
)
# standard library only (runs with a GPU node's bare Python before anything is installed): imports
# no library that logs, so it has no quiet setup to run
STDLIB_ONLY = ["scripts/wheelhouse.py"]


def test_the_list_covers_every_command():
    project = (REPO / "pyproject.toml").read_text()
    scripts = {m.group(1).replace(":cli_main", "") for m in re.finditer(r'= "(man_recipes\.cli\.\w+:\w+)"', project)}
    assert scripts  # the table was found
    listed = {c.rsplit(":", 1)[0].removesuffix(".__main__") for c in COMMANDS} | {f"man_recipes.{m}" for m in DATA_PREP}
    assert {s.split(":")[0] for s in scripts} <= listed
    wrapped = set()
    for sh in list((REPO / "scripts").glob("*.sh")) + list((REPO / "data-prep").glob("*.sh")) + list((REPO / "lab").glob("*.sh")):
        wrapped |= set(re.findall(r"-m ((?:man_recipes|lab)\.[\w.]+\w)", sh.read_text()))
    assert wrapped and wrapped <= listed
    assert {f"scripts/{p.name}" for p in (REPO / "scripts").glob("*.py") if "def main(" in p.read_text()} <= listed | set(STDLIB_ONLY)


@pytest.mark.parametrize("script", STDLIB_ONLY)
def test_stdlib_only_scripts_import_no_library(script):
    tree = ast.parse((REPO / script).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert imported and all(m.split(".")[0] in sys.stdlib_module_names for m in imported), imported


def _entry(command):
    where, func = command.rsplit(":", 1)
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_cmd_{where.replace('/', '_')[:-3]}", REPO / where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, func)


@pytest.fixture
def fairseq_logging_state():
    """The logging state importing fairseq leaves (root at DEBUG), restored afterwards."""
    root = logging.getLogger()
    saved = root.level, list(root.handlers), {n: logging.getLogger(n).level for n in NOISY_LOGGERS}
    root.setLevel(logging.DEBUG)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_sets_up_quiet_logging_first(command, fairseq_logging_state, capsys, monkeypatch):
    monkeypatch.delenv("LOGLEVEL", raising=False)
    monkeypatch.setattr(sys, "argv", ["cmd", "--help"])
    main = _entry(command)
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code in (0, None), capsys.readouterr()
    assert logging.getLogger().level == logging.INFO
    assert all(logging.getLogger(n).level == logging.WARNING for n in NOISY_LOGGERS)


def test_a_figure_after_the_quiet_setup_logs_no_debug(fairseq_logging_state, caplog, tmp_path):
    quiet_logging()
    with caplog.at_level(logging.DEBUG):
        plt = pyplot()
        fig = plt.figure()
        plt.plot([1, 2, 3], label="x")
        plt.legend()
        plt.title("t")
        fig.savefig(tmp_path / "f.png")
        plt.close(fig)
    assert not [r for r in caplog.records if r.levelno < logging.INFO], caplog.text[:2000]


def test_lr_probe_plot_prints_no_debug_line(tmp_path):
    """What a user sees: a fresh process (fairseq imported, root at DEBUG) drawing a probe's curve."""
    records = [{"num_updates": float(i), "loss": 10.0 - i, "gnorm": 1.0, "lr": 1e-3} for i in range(1, 6)]
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"config": "c", "norm": "pre", "verdict": "trains", "records": records}))
    png = tmp_path / "curve.png"
    proc = run_cli([sys.executable, "-m", "lab.lr_probe", "--plot", probe, "--png", png],
                   cwd=tmp_path, env={"PYTHONPATH": str(REPO)}, timeout=300)
    assert png.stat().st_size > 5000
    assert "DEBUG" not in proc.stdout, proc.stdout[:2000]
