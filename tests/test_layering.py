"""The package's floors: every import of a ``man_fairseq`` module (read with ``ast``, not run) goes to
its own floor or one below, never up, and no modules import each other in a circle; the package never
imports the lab (``lab/``: the project's own instruments, which import the package) and the wheel leaves
the lab out; no file of ``man_fairseq/``, ``lab/`` or ``scripts/`` is over 400 lines.

Floors, lowest first (a module sits on the floor of the longest prefix that names it):

* ground: logging setup, paths, text files, provenance, the toy corpus, table helpers, the Ctrl-C line, and what the
  plugin's own modules need before fairseq loads anything (options, checkpoint allow-list);
* plugin: what ``--user-dir man_fairseq`` registers (modules, models, criterions, fairseq fixes);
* library: checkpoint averaging, scoring (BLEU, ROUGE-1.5.5), the analyses;
* recipes: what every recipe stage shares (configs, the subprocess runner, work folders);
* recipes.data, recipes.training, recipes.evaluation, recipes.studies: the pipeline, in its order;
* recipes.checks: the end-to-end check of the whole pipeline (smoke run);
* cli: the commands, which parse their arguments and call what is below.
"""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "man_fairseq"
LAB = REPO / "lab"

FLOORS = [
    ("ground", ["man_fairseq.logging_setup", "man_fairseq.paths", "man_fairseq.textfile", "man_fairseq.provenance",
                "man_fairseq.toy_corpus", "man_fairseq.tables", "man_fairseq.known_warnings",
                "man_fairseq.plugin_options", "man_fairseq.checkpoint_compat", "man_fairseq.interrupt"]),
    ("plugin", ["man_fairseq", "man_fairseq.fairseq_fixes", "man_fairseq.modules", "man_fairseq.models",
                "man_fairseq.criterions"]),
    ("library", ["man_fairseq.averaging", "man_fairseq.scoring", "man_fairseq.rouge155", "man_fairseq.analysis"]),
    ("recipes", ["man_fairseq.recipes"]),
    ("recipes.data", ["man_fairseq.recipes.data"]),
    ("recipes.training", ["man_fairseq.recipes.training"]),
    ("recipes.evaluation", ["man_fairseq.recipes.evaluation"]),
    ("recipes.studies", ["man_fairseq.recipes.studies"]),
    ("recipes.checks", ["man_fairseq.recipes.checks"]),
    ("cli", ["man_fairseq.cli"]),
]
MAX_LINES = 400


def module_files():
    """{dotted module name: path} of every module of the package (a package by its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
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
    modules = {"man_fairseq.scoring": None, "man_fairseq.rouge155": None, "man_fairseq.cli": None,
               "man_fairseq.cli.files2rouge": None}
    src = tmp_path / "scoring.py"
    src.write_text("def rouge():\n    from . import rouge155\n    from .cli import files2rouge\n")
    found = imported_modules("man_fairseq.scoring", src, modules)
    assert found == {"man_fairseq.rouge155", "man_fairseq.cli.files2rouge"}
    assert floor("man_fairseq.cli.files2rouge") > floor("man_fairseq.scoring") > floor("man_fairseq.models.x")


def lab_imports(path):
    """The ``lab`` modules that ``path`` imports (absolute imports: the package has no relative way there)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found |= {n for n in names if n == "lab" or n.startswith("lab.")}
    return found


def test_the_package_never_imports_the_lab():
    assert LAB.is_dir() and lab_imports(LAB / "speed" / "study.py")  # the lab is there and the reader sees its imports
    assert {str(p.relative_to(REPO)): lab_imports(p) for p in sorted(PACKAGE.rglob("*.py")) if lab_imports(p)} == {}
    # nor runs it (``python -m lab.X``): where the wheel is installed there is no lab
    assert [str(p.relative_to(REPO)) for p in sorted(PACKAGE.rglob("*.py")) if re.search(r"\blab\.\w", p.read_text())] == []


def test_the_wheel_leaves_the_lab_out():
    project = (REPO / "pyproject.toml").read_text()
    include = project[project.index("[tool.setuptools.packages.find]"):].split("\n")[1]
    assert include.startswith("include = ") and "man_fairseq" in include and "lab" not in include


def test_no_file_is_over_400_lines():
    files = sorted(PACKAGE.rglob("*.py")) + sorted(LAB.rglob("*.py")) + sorted((REPO / "scripts").glob("*"))
    long = [f"{p.relative_to(REPO)}: {n}" for p in files if p.is_file()
            for n in [len(p.read_text().splitlines())] if n > MAX_LINES]
    assert long == []
