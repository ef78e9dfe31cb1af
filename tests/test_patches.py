"""What ``import man_fairseq`` changes (man_fairseq/patches/): every change one module in one list,
installed by one idiom, once per process. What each change does is tested beside its subject
(test_ngram_blocking, test_option_errors, test_resume_batches, test_convergence, test_train_exit, ...)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "man_fairseq" / "patches"

# Every attribute the patches replace: (module, owner within it or "", attribute).
TARGETS = [
    ("fairseq.data.data_utils", "", "batch_by_size"),
    ("fairseq.tasks.translation", "TranslationTask", "inference_step"),
    ("sys", "", "excepthook"),
    ("fairseq.options", "", "parse_args_and_arch"),
    ("fairseq.ngram_repeat_block", "NGramRepeatBlock", "_no_repeat_ngram"),
    ("fairseq.data.iterators", "BackgroundConsumer", "__init__"),
    ("fairseq.options", "", "gen_parser_from_dataclass"),
    ("fairseq.checkpoint_utils", "", "load_checkpoint_to_cpu"),
    ("fairseq.hub_utils", "", "from_pretrained"),
    ("fairseq.trainer", "Trainer", "save_checkpoint"),
    ("fairseq.trainer", "Trainer", "load_checkpoint"),
    ("fairseq.checkpoint_utils", "", "load_checkpoint"),
    ("fairseq.tasks.fairseq_task", "FairseqTask", "get_batch_iterator"),
]


def patch_modules():
    return sorted(p.stem for p in PATCHES.glob("*.py") if p.stem not in ("__init__", "install"))


def test_every_patch_module_is_in_the_one_list_and_its_docstring():
    from man_fairseq import patches

    listed = [m.__name__.rpartition(".")[2] for m in patches.PATCHES]
    assert sorted(listed) == patch_modules() and len(set(listed)) == len(listed)
    documented = [line.split("``")[1] for line in patches.__doc__.splitlines() if line.startswith("- ``")]
    assert documented == listed, "the package docstring lists the patches in the order they are applied"
    for module in patches.PATCHES:
        assert callable(module.apply) and module.__doc__ and module.__doc__.strip(), module.__name__


def test_every_replacement_goes_through_install():
    calls = 0
    for stem in patch_modules():
        tree = ast.parse((PATCHES / f"{stem}.py").read_text())
        # where a patch would set fairseq's attributes itself: at import, or in apply()
        applying = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        applying += [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply"]
        for node in (inner for n in applying for inner in ast.walk(n)):
            if isinstance(node, ast.Assign):
                assert not any(isinstance(t, ast.Attribute) for t in node.targets), \
                    f"{stem}.py sets an attribute itself: replace it with install()"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
                raise AssertionError(f"{stem}.py sets an attribute itself: replace it with install()")
        calls += sum(isinstance(node, ast.Call) and getattr(node.func, "id", None) == "install"
                     for node in ast.walk(tree))
    assert calls == len(TARGETS), "a patch was added or removed: list its target in TARGETS"


def test_install_replaces_once_and_hands_over_the_original():
    from man_fairseq.patches.install import install, installed

    class Owner:
        @staticmethod
        def f(x):
            return x + 1

    def make(original):
        return lambda x: 10 * original(x)

    assert install(Owner, "f", make) and installed(Owner, "f") and Owner.f(1) == 20
    replaced = Owner.f
    assert not install(Owner, "f", make), "a second install (a second import, a second copy) changes nothing"
    assert Owner.f is replaced and Owner.f(1) == 20


CHECK = """
import importlib, json, sys
targets = json.loads(sys.argv[1])
def get(module, owner, name):
    obj = importlib.import_module(module)
    return getattr(getattr(obj, owner) if owner else obj, name)
before = [get(*t) for t in targets]
import man_fairseq
from man_fairseq import patches
from man_fairseq.patches.install import MARK
after = [get(*t) for t in targets]
patches.apply_all()
again = [get(*t) for t in targets]
print(json.dumps({"changed": [a is not b for a, b in zip(before, after)],
                  "marked": [bool(getattr(a, MARK, False)) for a in after],
                  "same_after_second_apply": [a is b for a, b in zip(after, again)]}))
"""


@pytest.fixture(scope="module")
def fresh_process():
    out = subprocess.run([sys.executable, "-c", CHECK, json.dumps(TARGETS)], cwd=REPO, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("key", ["changed", "marked", "same_after_second_apply"])
def test_import_man_fairseq_replaces_each_target_once(fresh_process, key):
    assert [".".join(filter(None, t)) for t, ok in zip(TARGETS, fresh_process[key]) if not ok] == []
