"""docs/architecture.md's two walks ("Two routes, walked") say how many files a reader follows: each
count is that of the files the walk names, and those are every module of its package its route imports (read with
``ast``, as tests/test_layering.py reads the floors), so the walk goes stale with the first import it
does not name (issue 81: they said 10 and 14 where the route had grown)."""

import re

import pytest
from conftest import REPO
from test_layering import imported_modules, module_files

ARCHITECTURE = REPO / "docs" / "architecture.md"
# the walk's first words: (its package, the module its route starts from, the files before that module)
WALKS = {
    "**`--localness-window query`": ("man_fairseq", "man_fairseq.models.transformer_localness",
                                     {"man_fairseq/__init__.py", "man_fairseq/models/__init__.py"}),
    "**`scripts/evaluate.sh RUN`**": ("man_recipes", "man_recipes.evaluation.evaluate", set()),
}


def walk_text(first_words):
    """The walk's paragraph, up to its "Before the split" (what the route was, not what it is)."""
    text = ARCHITECTURE.read_text()
    start = text.index(first_words)
    end = text.find("\n\n", start)
    return text[start:end if end > 0 else len(text)].split("Before the split")[0]


def named_files(text, package, files):
    """The package's files the paragraph names in code spans (``models/family.py``, ``family.py``)."""
    named = set()
    for span in re.findall(r"`([\w/.]+\.py)`", text):
        exact = [f for f in files if f in (span, f"{package}/{span}")]
        found = exact or [f for f in files if f.endswith("/" + span)]
        assert len(found) == 1, f"`{span}`: {found or 'no file'} in {package}/"
        named.add(found[0])
    return named


@pytest.mark.parametrize("first_words", sorted(WALKS))
def test_a_walk_names_every_file_its_route_imports_and_counts_them(first_words):
    package, start, before = WALKS[first_words]
    modules = module_files()
    files = {str(path.relative_to(REPO)) for path in modules.values()}
    reached, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [m for m in imported_modules(name, modules[name], modules) if m.startswith(package + ".")]
    route = {str(modules[m].relative_to(REPO)) for m in reached if modules[m].name != "__init__.py"} | before
    text = walk_text(first_words)
    count = int(re.search(r"\((\d+) files of", text).group(1))
    assert named_files(text, package, files) == route
    assert count == len(route)
