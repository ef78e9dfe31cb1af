"""What a study compares and on what: the families (the Transformer is the baseline of every
comparison), their labels in tables and figures, and the experiments of ``scripts/reproduce.sh``
(their configs, data, metric, title, and the families they have configs for)."""

import shlex
from pathlib import Path

from man_recipes.config import CONFIG_DIR, REPO

FAMILIES = ["transformer", "man", "sman2", "localness", "diffwin", "calibration"]
BASELINE = "transformer"
FAMILY_LABELS = {
    "transformer": "Transformer (small)",
    "man": "MAN (small, DMAN enc.)",
    "sman2": "SMAN2 (b=4)",
    "localness": "Localness (query window)",
    "diffwin": "Diffwin Enc(AW)-Cr(AW,Seg)-Dec(MW)",
    "calibration": "Calibration (anneal)",
    "calibration-alpha0.01": "Calibration (anneal, α = 0.01)",
    "man-zeros": "MAN (small, DMAN P, U from 0)",
    "man-calibration": "MAN enc. + calibrated cross-att. (anneal)",
    "man-nobias": "MAN, its first sublayer a plain self-attention (floor)",
}
MULTI30K = {"data": REPO / "data-bin" / "multi30k.de-en", "dataset": "multi30k", "metric": "bleu",
            "prepare": "data-prep/prepare-multi30k.sh [--from FOLDER]"}
EXPERIMENTS = {
    "multi30k": dict(MULTI30K, configs=CONFIG_DIR / "multi30k",
                     title="Multi30k De→En, papers' small width: every family against the Transformer"),
    # "device": the default --device of a CPU study (its records were made there)
    # man-calibration: the composed arch (transformer_masked: MAN's encoder, calibrated cross-attention)
    "multi30k-cpu": dict(MULTI30K, configs=CONFIG_DIR / "multi30k-cpu", device="cpu",
                         families=FAMILIES + ["man-calibration"],
                         # measured by scripts/speed.sh only: MAN's and SMAN2's floor (issue 80)
                         speed_families=["man-nobias"],
                         title="Multi30k De→En on a 2-core CPU (d=256, 3+3 layers): every family against the Transformer"),
    "gigaword-cpu": {"configs": CONFIG_DIR / "gigaword-cpu", "data": REPO / "data-bin" / "gigaword-30k",
                     "dataset": "gigaword", "metric": "rouge", "device": "cpu",
                     # calibration twice: at the default α = 1 its mask saturates on this configuration
                     # (a Transformer in effect), at α = 0.01 it stays below 1 (docs/calibration.md);
                     # MAN twice: its DMAN biases P, U drawn from N(0, 1) (the authors') and started at 0
                     "families": FAMILIES + ["calibration-alpha0.01", "man-zeros"],
                     "speed_families": ["man-nobias"],  # scripts/speed.sh only: MAN's and SMAN2's floor (issue 80)
                     "prepare": "data-prep/prepare-gigaword.sh --from ../shared/data/gigaword-30k "
                                "--allow-nonstandard-splits --bpe-merges 8000",
                     "title": "Gigaword headlines on a 2-core CPU (29,911 training pairs, d=256, 3+3 layers): "
                              "every family against the Transformer"},
    # the families a CPU budget allows on 400-token sources (issue-level choice: the Transformer, MAN
    # and localness; every other family's config is absent, so --families names only these)
    "cnndm-cpu": {"configs": CONFIG_DIR / "cnndm-cpu", "data": REPO / "data-bin" / "cnndm-40k",
                  "dataset": "cnndm", "metric": "rouge", "device": "cpu",
                  "families": ["transformer", "man", "localness"],
                  # measured by scripts/speed.sh beside them, never trained by reproduce.sh: MAN's floor (its DMAN
                  # sublayer a plain self-attention) and SMAN2, whose band keeps 9 of 400 keys (issue 80)
                  "speed_families": ["man-nobias", "sman2"],
                  "prepare": "data-prep/prepare-cnndm.sh --from ../shared/data/cnndm-see "
                             "--allow-nonstandard-splits --bpe-merges 16000",
                  "title": "CNN/DailyMail on a 2-core CPU (40,000 training pairs, articles cut to 400 tokens, "
                           "d=256, 3+3 layers): Transformer, MAN and localness"},
}


# The to-convergence protocol of a study: the same families and data, its configs those of
# the study with `train: patience` and a higher `max-epoch` (configs/<study>-converge/), its records
# in their own folder, and its table the study's: both protocols side by side (``converges``).
for _study in ("multi30k-cpu", "gigaword-cpu"):
    EXPERIMENTS[f"{_study}-converge"] = dict(EXPERIMENTS[_study], configs=CONFIG_DIR / f"{_study}-converge",
                                             converges=_study,
                                             title=EXPERIMENTS[_study]["title"].split(":")[0] + ": to convergence")
FIXED_BUDGET, TO_CONVERGENCE = "fixed-budget", "to-convergence"


def protocol(cfg):
    """How a run of ``cfg`` is trained and scored: ``to-convergence`` when the config sets
    ``train.patience`` (until the dev loss stops improving, capped by ``max-epoch``; scored on the best
    checkpoint by dev loss), else ``fixed-budget`` (its epochs; scored on the average of its last
    ``eval.avg_last`` checkpoints)."""
    return TO_CONVERGENCE if (cfg.get("train") or {}).get("patience") else FIXED_BUDGET


def table_experiment(experiment):
    """The experiment whose table shows ``experiment``'s records: a to-convergence protocol's is its study's."""
    return EXPERIMENTS[experiment].get("converges", experiment)


def convergence_experiment(experiment):
    """The to-convergence protocol of the study ``experiment``, or None."""
    return next((name for name, exp in EXPERIMENTS.items() if exp.get("converges") == experiment), None)


def prepare_line(experiment, data=None):
    """The command that writes the data folder ``data`` (default: the experiment's data-bin) the way
    ``experiment`` reads it: its preparation with ``--dest`` naming that folder (inside the checkout,
    relative to it, as the command runs from there)."""
    exp = EXPERIMENTS[experiment]
    data = Path(data or exp["data"])
    if data.is_absolute() and data.is_relative_to(REPO):
        data = data.relative_to(REPO)
    return f"{exp['prepare']} --dest {shlex.quote(str(data))}"


def missing_data(experiment, data):
    """None when ``data`` holds binarized data (a fairseq dictionary), else the line that says so and
    how to make it (for ``argparse``'s error)."""
    if (data / "dict.txt").is_file() or any(data.glob("dict.*.txt")):
        return None
    return f"--data: {data} holds no binarized data (prepare it: {prepare_line(experiment, data)})"


def families_of(experiment):
    """The families ``experiment`` has configs for, the baseline first (every family by default)."""
    return EXPERIMENTS[experiment].get("families", FAMILIES)


def other_families():
    """The experiments whose families are not :data:`FAMILIES`, with theirs ('EXPERIMENT's F1,F2; ...')."""
    return "; ".join(f"{name}'s {','.join(families_of(name))}" for name in EXPERIMENTS
                     if families_of(name) != FAMILIES)


def speed_families_of(experiment):
    """The families ``scripts/speed.sh`` measures of ``experiment``: its study's, then those it has configs for
    only to be measured (``speed_families``)."""
    return families_of(experiment) + EXPERIMENTS[experiment].get("speed_families", [])


def parse_families(experiment, text, speed=False):
    """(the families ``--families`` names, the families to run: the baseline first, then the named
    ones in the study's order; ``speed``: of :func:`speed_families_of`). ValueError says what is wrong:
    none named (it would run the baseline alone, most likely a typo) or one the experiment has no config for."""
    known = speed_families_of(experiment) if speed else families_of(experiment)
    named = [f.strip() for f in (text if text is not None else ",".join(known)).split(",") if f.strip()]
    if not named:
        raise ValueError(f"--families {text!r} names no family; choose from {known}")
    unknown = [f for f in named if f not in known]
    if unknown:
        raise ValueError(f"unknown families {unknown} for {experiment}; choose from {known}")
    return named, [BASELINE] + [f for f in known if f in named and f != BASELINE]
