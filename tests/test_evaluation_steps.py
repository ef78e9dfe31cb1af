"""The evaluation path (man_recipes/evaluation/steps.py): average -> decode -> score -> record,
one function per step, and the three entry points that evaluate (scripts/evaluate.sh, scripts/reproduce.sh,
scripts/demo.py) calling those functions rather than their own versions. Small synthetic inputs, in
this process."""

import ast

import pytest
import torch
from conftest import REPO

from man_recipes import scoring
from man_recipes.evaluation import steps

ENTRY_POINTS = {
    "scripts/evaluate.sh": REPO / "man_recipes" / "evaluation" / "evaluate.py",
    "scripts/reproduce.sh": REPO / "man_recipes" / "studies" / "study_eval.py",
    "scripts/demo.py": REPO / "scripts" / "demo.py",
}
# what a step calls below it: an entry point calling one of these walks a path of its own
BELOW_THE_STEPS = {"average_files", "last_n_checkpoints", "select_inputs",
                   "sacrebleu_tokenized", "tokenized_bleu", "sacrebleu_detok", "rouge", "run_generate",
                   "generate_args"}


def _called_names(path):
    """The names every call in ``path`` calls (``f(...)`` and ``x.f(...)`` both give ``f``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", None))
    return names


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_calls_the_steps(entry):
    path = ENTRY_POINTS[entry]
    called = _called_names(path)
    assert {"average", "decode", "score"} <= called, f"{entry} ({path.name}) does not walk the steps"
    assert not called & BELOW_THE_STEPS, f"{entry} ({path.name}) calls {sorted(called & BELOW_THE_STEPS)} itself"
    assert _imports_the_steps(path), f"{entry} ({path.name}) does not import man_recipes.evaluation.steps"


def _imports_the_steps(path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")
            if module[-2:] == ["evaluation", "steps"] or (node.level == 1 and module == ["steps"]
                                                          and path.parent.name == "evaluation"):
                return True
            if module[-1] == "evaluation" and any(a.name == "steps" for a in node.names):
                return True
    return False


def _checkpoints(tmp_path, n):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for i in range(1, n + 1):
        torch.save({"model": {"w": torch.full((2,), float(i))}}, ckpts / f"checkpoint{i}.pt")
    torch.save({"model": {"w": torch.full((2,), 100.0)}}, ckpts / "checkpoint_last.pt")
    return ckpts


def test_average_takes_the_last_n_epoch_checkpoints(tmp_path, capsys):
    ckpts = _checkpoints(tmp_path, 4)
    out = tmp_path / "eval" / "avg.pt"
    averaged = steps.average(ckpts, 2, False, out)
    assert [p.rsplit("/", 1)[-1] for p in averaged] == ["checkpoint4.pt", "checkpoint3.pt"]
    assert torch.load(out, weights_only=True)["model"]["w"].tolist() == [3.5, 3.5]
    with pytest.raises(steps.AverageError, match="exists; pass --overwrite"):
        steps.average(ckpts, 3, False, out)  # an output is replaced only when the caller says it is its own
    steps.average(ckpts, 3, False, out, overwrite=True)
    assert torch.load(out, weights_only=True)["model"]["w"].tolist() == [3.0, 3.0]


def test_too_few_checkpoints_is_its_own_error(tmp_path):
    """evaluate.sh names another way to choose (--avg-last K, --checkpoint) only for this error."""
    ckpts = _checkpoints(tmp_path, 2)
    with pytest.raises(steps.CheckpointsNotFound, match="holds only 2"):
        steps.average(ckpts, 3, False, tmp_path / "avg.pt")
    with pytest.raises(steps.CheckpointsNotFound, match="not found"):
        steps.average(tmp_path / "nowhere", 1, False, tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()


def test_the_demo_metric_is_sacrebleus_default_on_tokens():
    hyps = ["the cat sat on the mat", "a dog ran"]
    refs = ["the cat sat on a mat", "a dog ran away"]
    scored = steps.score(steps.DEMO_METRIC, hyps, refs)
    assert scored.bleu["bleu"] == scoring.sacrebleu_tokenized(hyps, refs)
    import sacrebleu

    assert scored.bleu["bleu"] == sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score
    with pytest.raises(scoring.ScoreInputError):
        steps.score(steps.DEMO_METRIC, hyps, refs[:1])


def test_record_replaces_a_file_whole(tmp_path):
    path = tmp_path / "results.md"
    path.write_text("the earlier record\n")
    theirs = tmp_path / ".results.md.tmp"  # a fixed temporary name would be someone's file
    theirs.write_text("keep")
    steps.record(path, "the new record\n")
    assert path.read_text() == "the new record\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".results.md.tmp", "results.md"]  # none of ours left
    # a write that fails (here a character UTF-8 cannot encode)
    with pytest.raises(UnicodeEncodeError):
        steps.record(path, "the newer record\n" * 1000 + "\ud800\n")
    assert path.read_text() == "the new record\n"  # never half a record under the record's name
    assert sorted(p.name for p in tmp_path.iterdir()) == [".results.md.tmp", "results.md"]
    assert theirs.read_text() == "keep"
