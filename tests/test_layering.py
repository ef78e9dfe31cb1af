"""The two packages' floors: every import of a ``man_fairseq`` or ``man_recipes`` module (read with ``ast``,
not run) goes to its own floor or one below, never up, and no modules import each other in a circle. The
plugin (``man_fairseq``, what ``--user-dir`` loads) is the bottom: it never imports ``man_recipes``, and
``import man_fairseq`` loads no module of it. Neither package imports the lab (``lab/``: the project's own
instruments, which import both) and the wheel leaves the lab out; no file of the packages, ``lab/`` or
``scripts/`` is over 400 lines.

Floors, lowest first (a module sits on the floor of the longest prefix that names it):

* plugin.ground: what the plugin's own modules need before fairseq loads anything (options, checkpoint
  allow-list, the warnings it silences, the dependency check);
* plugin: what ``--user-dir man_fairseq`` registers (modules, models, criterions, fairseq fixes);
* ground: logging setup, paths, text files and the one writer of whole files, provenance, the toy corpus, table helpers, the Ctrl-C line;
* library: checkpoint averaging, scoring (BLEU, ROUGE-1.5.5), the analyses;
* recipes: what every recipe stage shares (configs, the subprocess runner, work folders);
* data, training, evaluation, studies: the pipeline, in its order;
* checks: the end-to-end check of the whole pipeline (smoke run);
* cli: the commands, which parse their arguments and call what is below.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "man_fairseq"
RECIPES = REPO / "man_recipes"
PACKAGES = (PLUGIN, RECIPES)
LAB = REPO / "lab"

FLOORS = [
    ("plugin.ground", ["man_fairseq.plugin_options", "man_fairseq.model_options", "man_fairseq.checkpoint_errors",
                       "man_fairseq.dependencies"]),
    ("plugin.patches", ["man_fairseq.patches"]),
    ("plugin", ["man_fairseq"]),
    ("ground", ["man_recipes.logging_setup", "man_recipes.paths", "man_recipes.textfile", "man_recipes.provenance",
                "man_recipes.toy_corpus", "man_recipes.tables", "man_recipes.interrupt", "man_recipes.atomic"]),
    ("library", ["man_recipes.averaging", "man_recipes.scoring", "man_recipes.rouge155", "man_recipes.analysis"]),
    ("recipes", ["man_recipes"]),
    ("data", ["man_recipes.data"]),
    ("training", ["man_recipes.training"]),
    ("evaluation", ["man_recipes.evaluation"]),
    ("studies", ["man_recipes.studies"]),
    ("checks", ["man_recipes.checks"]),
    ("cli", ["man_recipes.cli"]),
]
MAX_LINES = 400


def module_files():
    """{dotted module name: path} of every module of the package (a package by its __init__)."""
    out = {}
    for path in sorted(p for package in PACKAGES for p in package.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_modules(name, path, modules):
    """The package's modules that ``name`` imports anywhere in its body (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` the module mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                found.add(target)
    return found


def floor(name):
    matches = [(len(prefix), i) for i, (_, prefixes) in enumerate(FLOORS) for prefix in prefixes
               if name == prefix or name.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


@pytest.fixture(scope="module")
def graph():
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def test_every_module_has_a_floor(graph):
    assert [m for m in graph if floor(m) is None] == []


def test_no_import_runs_up_a_floor(graph):
    upward = [f"{a} ({FLOORS[floor(a)][0]}) imports {b} ({FLOORS[floor(b)][0]})"
              for a, targets in sorted(graph.items()) for b in sorted(targets)
              if floor(a) is not None and floor(b) is not None and floor(b) > floor(a)]
    assert upward == []


def test_no_import_cycle(graph):
    """Tarjan's strongly connected components: a component of more than one module is a circle."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_checker_sees_a_circle_and_an_upward_import(tmp_path):
    """The reader resolves relative, lazy and ``from package import module`` imports."""
    modules = {"man_recipes.scoring": None, "man_recipes.rouge155": None, "man_recipes.cli": None,
               "man_recipes.cli.files2rouge": None}
    src = tmp_path / "scoring.py"
    src.write_text("def rouge():\n    from . import rouge155\n    from .cli import files2rouge\n")
    found = imported_modules("man_recipes.scoring", src, modules)
    assert found == {"man_recipes.rouge155", "man_recipes.cli.files2rouge"}
    assert floor("man_recipes.cli.files2rouge") > floor("man_recipes.scoring") > floor("man_fairseq.models.x")
    assert floor("man_fairseq.models.x") > floor("man_fairseq.plugin_options")


def lab_imports(path):
    """The ``lab`` modules that ``path`` imports (absolute imports: the package has no relative way there)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found |= {n for n in names if n == "lab" or n.startswith("lab.")}
    return found


def package_files():
    return sorted(p for package in PACKAGES for p in package.rglob("*.py"))


def test_the_packages_never_import_the_lab():
    assert LAB.is_dir() and lab_imports(LAB / "speed" / "study.py")  # the lab is there and the reader sees its imports
    assert {str(p.relative_to(REPO)): lab_imports(p) for p in package_files() if lab_imports(p)} == {}
    # nor run it (``python -m lab.X``): where the wheel is installed there is no lab
    assert [str(p.relative_to(REPO)) for p in package_files() if re.search(r"\blab\.\w", p.read_text())] == []


def test_the_plugin_never_imports_the_recipes(graph):
    assert [f"{a} imports {b}" for a, targets in sorted(graph.items()) if a.split(".")[0] == "man_fairseq"
            for b in sorted(targets) if b.split(".")[0] != "man_fairseq"] == []
    # nor names them in a string (an importlib call, a `python -m`)
    assert [str(p.relative_to(REPO)) for p in sorted(PLUGIN.rglob("*.py")) if "man_recipes" in p.read_text()] == []


def test_importing_the_plugin_loads_only_the_plugin():
    code = "import sys, man_fairseq; print(sorted(m for m in sys.modules if m.startswith('man_')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    loaded = eval(out)
    assert "man_fairseq.models.transformer_man" in loaded  # the plugin registered its models
    assert [m for m in loaded if not m.startswith("man_fairseq")] == []


def test_the_wheel_leaves_the_lab_out():
    project = (REPO / "pyproject.toml").read_text()
    include = project[project.index("[tool.setuptools.packages.find]"):].split("\n")[1]
    assert include.startswith("include = ") and "man_fairseq" in include and "man_recipes" in include
    assert "lab" not in include


def test_no_file_is_over_400_lines():
    files = package_files() + sorted(LAB.rglob("*.py")) + sorted((REPO / "scripts").glob("*"))
    long = [f"{p.relative_to(REPO)}: {n}" for p in files if p.is_file()
            for n in [len(p.read_text().splitlines())] if n > MAX_LINES]
    assert long == []
