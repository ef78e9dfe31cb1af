"""The to-convergence protocol of the studies (issue 47): its configs, fairseq's --patience across a
resume (patience_resume), and a tiny study trained to convergence beside its fixed budget.

A tiny model's dev loss falls every epoch, so the tests stop it with
``--maximize-best-checkpoint-metric``: the first epoch's (highest) loss is then the best, and every
later one counts as a validation without improvement. The best checkpoint is epoch 1's and, with
patience P, the run stops at epoch 1 + P, whatever the model learns."""

import json
import sys

import pytest

from conftest import REPO, TINY_MODEL, TINY_TRAIN
from test_multi30k import prepare, run, synthetic_release

from man_recipes.config import CONFIG_DIR, load_config
from man_recipes.studies import reproduce
from man_recipes.studies import study_records as sr
from man_recipes.studies.experiments import EXPERIMENTS, protocol
from man_recipes.training.fairseq_log import valid_epochs

NO_IMPROVEMENT = ["--maximize-best-checkpoint-metric"]


@pytest.mark.parametrize("study", ["multi30k-cpu", "gigaword-cpu"])
def test_each_family_converges_from_its_fixed_budget_config(study):
    """A convergence config is its fixed-budget config with patience, the cap and the best checkpoint
    scored; nothing else changes, and its fingerprint is another (the two never mix)."""
    args = reproduce.parse_args([study])
    for family in EXPERIMENTS[study].get("families", reproduce.FAMILIES):
        fixed = load_config(CONFIG_DIR / study / f"{family}.yaml")
        converge = load_config(CONFIG_DIR / f"{study}-converge" / f"{family}.yaml")
        assert (protocol(fixed), protocol(converge)) == ("fixed-budget", "to-convergence")
        assert converge["train"] == dict(fixed["train"], patience=3, **{"max-epoch": 40})
        assert converge["eval"] == dict(fixed["eval"], avg_last=1)  # no average: run_options agree
        assert {k: v for k, v in converge.items() if k not in ("train", "eval", "name", "_path")} == \
               {k: v for k, v in fixed.items() if k not in ("train", "eval", "name", "_path")}
        assert sr.record_fingerprint(fixed, args, 1) != sr.record_fingerprint(converge, args, 1)
        assert sr.record_fingerprint(fixed, args, 1, True) != sr.record_fingerprint(converge, args, 1, True)


def test_a_convergence_study_scores_no_average(capsys):
    with pytest.raises(SystemExit):
        reproduce.parse_args(["gigaword-cpu-converge", "--avg-last", "5"])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "--avg-last: gigaword-cpu-converge scores each run's best checkpoint by dev loss, never an average")


def test_a_convergence_run_into_a_fresh_results_dir_names_the_records_it_needs_before_training(tmp_path, capsys):
    # it trained to the end, then said "no current run record ... nothing to tabulate"
    results, runs = tmp_path / "fresh", tmp_path / "runs"
    assert reproduce.main(["multi30k-cpu-converge", "--seeds", "1,", "--data", str(tmp_path / "data"),
                           "--runs-dir", str(runs), "--results-dir", str(results)]) == 2
    assert capsys.readouterr().err == (
        "ERROR: multi30k-cpu-converge is tabulated beside multi30k-cpu's fixed-budget records "
        f"(RESULTS/multi30k-cpu/FAMILY-seedN.json), and {results / 'multi30k-cpu'} holds none: run "
        "scripts/reproduce.sh multi30k-cpu first, or pass the --results-dir that holds them\n")
    assert not runs.exists()


def _train(data, save_dir, *extra):
    cmd = ["fairseq-train", data, "--user-dir", REPO / "man_fairseq", "--arch", "transformer_man_small",
           "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN, "--save-dir", save_dir, "--patience", "3",
           *NO_IMPROVEMENT, *extra]
    return run(cmd).stdout


def test_patience_counts_on_across_a_resume(toy_data_bin, tmp_path):
    """fairseq keeps its count of validations without improvement in memory only: resumed after
    epoch 2, it restarted from 0 and stopped at epoch 6 instead of 4."""
    whole = _train(toy_data_bin, tmp_path / "whole", "--max-epoch", "10")
    first = _train(toy_data_bin, tmp_path / "split", "--max-epoch", "2")  # "interrupted" after epoch 2
    resumed = _train(toy_data_bin, tmp_path / "split", "--max-epoch", "10")
    for log in (whole, first + resumed):
        assert "early stop since valid performance hasn't improved for last 3 runs" in log
        assert "end of epoch 4 " in log and "end of epoch 5 " not in log
    assert "patience: restored best" in resumed and "1 validation(s) without improvement since" in resumed


def test_a_study_trained_to_convergence_beside_its_fixed_budget(tmp_path):
    data, _ = prepare(synthetic_release(tmp_path / "raw"), tmp_path)
    # the same fairseq options for both protocols (they are part of every fingerprint): 6 epochs cap
    # the fixed budget (its config averages the last 5) and the run to convergence
    tiny = [*TINY_MODEL, "--max-tokens", "1500", "--warmup-updates", "4", "--lr", "0.003", "--max-epoch", "6",
            *NO_IMPROVEMENT]

    def study(experiment, *ours):
        return [sys.executable, "-m", "man_recipes.studies.reproduce", experiment, "--seeds", "1,",
                "--families", "man", "--device", "cpu", "--data", data, "--runs-dir", tmp_path / "runs" / experiment,
                "--results-dir", tmp_path / "results", "--bootstrap-samples", "100", *ours, "--", *tiny]

    run(study("multi30k-cpu"))
    out = run(study("multi30k-cpu-converge")).stdout
    results = tmp_path / "results"
    fixed = json.loads((results / "multi30k-cpu" / "man-seed1.json").read_text())
    converged = json.loads((results / "multi30k-cpu-converge" / "man-seed1.json").read_text())
    assert fixed["protocol"] == "fixed-budget" and fixed["epochs"] == 6
    # patience 3 from the config, the cap from the command line: stopped by patience at epoch 1 + 3
    assert {k: converged[k] for k in ("protocol", "patience", "max_epoch", "stopping_epoch", "stopped_by",
                                      "best_epoch")} == {
        "protocol": "to-convergence", "patience": 3, "max_epoch": 6, "stopping_epoch": 4, "stopped_by": "patience",
        "best_epoch": 1}
    # the best checkpoint, as it is, is what was decoded: epoch 1's (the first validation)
    assert converged["averaged_checkpoints"] == ["checkpoint_best.pt"]
    assert str(tmp_path / "runs" / "multi30k-cpu-converge" / "man-seed1" / "checkpoints" / "checkpoint_best.pt") in \
        converged["test_sets"]["test"]["generate_command"]
    assert [converged["best_updates"], converged["best_valid_loss"]] == converged["valid_curve"][0]
    assert len(converged["valid_curve"]) == 4 and fixed["fingerprint"] != converged["fingerprint"]
    # one training loss per epoch, at the updates of its validation
    assert [u for u, _ in converged["train_curve"]] == [u for u, _ in converged["valid_curve"]]
    epochs, early = valid_epochs(tmp_path / "runs" / "multi30k-cpu-converge" / "man-seed1" / "train.log")
    assert [e for e, _, _ in epochs] == [1, 2, 3, 4] and early
    # one table: the fixed budget's rows as before, and the two protocols side by side
    md = (results / "multi30k-cpu.md").read_text()
    table = json.loads((results / "multi30k-cpu.json").read_text())
    assert [r["family"] for r in table["runs"]] == ["man", "transformer"]
    assert [(r["family"], r["protocol"]) for r in table["to_convergence"]["runs"]] == [
        ("man", "to-convergence"), ("transformer", "to-convergence")]
    assert set(table["to_convergence"]["runs"][0]["paired_randomization"]) == {"test", "test_2017_flickr"}
    assert "## Fixed budget | to convergence" in md
    per_seed, per_family = md.split("## Fixed budget | to convergence")[1].split("Per family, over the seeds")
    (row,) = [line for line in per_seed.splitlines() if line.startswith("| MAN (small, DMAN enc.) | 1 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "6" and cells[6] == "4 (best 1)" and cells[7] == f"{converged['best_valid_loss']:.3f}"
    assert cells[8] == f"{converged['test_sets']['test']['sacrebleu']:.2f}" and cells[9].count("/") == 1
    # the family summary of the one seed run both ways: its BLEU and its difference to the Transformer
    (row,) = [line for line in per_family.splitlines() if line.startswith("| MAN (small, DMAN enc.) | 1 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    base = {r["protocol"]: r for r in [json.loads((results / e / "transformer-seed1.json").read_text())
                                        for e in ("multi30k-cpu", "multi30k-cpu-converge")]}
    delta = converged["test_sets"]["test"]["sacrebleu"] - base["to-convergence"]["test_sets"]["test"]["sacrebleu"]
    assert cells[5] == f"{converged['test_sets']['test']['sacrebleu']:.2f}" and cells[6] == f"{delta:+.2f}"
    (summary,) = [f for f in table["to_convergence"]["families"] if f["family"] == "man"]
    assert summary["seeds"] == [1] and summary["to-convergence"]["randomization_p"]["sacreBLEU"] == [
        table["to_convergence"]["runs"][0]["paired_randomization"]["test"]["p_value"]]
    assert "multi30k-cpu.md" in out or "Fixed budget | to convergence" in out


def _record(protocol, family, seed, bleu):
    return {"protocol": protocol, "family": family, "seed": seed, "test_sets": {"test": {"bleu": bleu}}}


def test_the_family_summary_compares_both_protocols_on_the_same_seeds():
    """Means, spreads and differences over the seeds a family and its Transformer ran both ways; a seed
    one protocol lacks (MAN seed 3 to convergence) leaves both protocols' means of that family (the
    Transformer keeps its three); * marks p < 0.05."""
    from man_recipes.studies.convergence import family_summary, family_summary_lines

    scores = {("fixed-budget", "transformer"): [25, 24, 26], ("to-convergence", "transformer"): [26, 27, 28],
              ("fixed-budget", "man"): [23, 21, 30], ("to-convergence", "man"): [29, 25]}
    runs = {(p, f, seed): _record(p, f, seed, v) for (p, f), values in scores.items()
            for seed, v in enumerate(values, 1)}
    p_values = {1: 0.0001, 2: 0.2, 3: 0.0001}
    tests = {(p, "man", seed, "test"): {"paired_randomization": {"p_value": p_values[seed]}}
             for (p, f, seed) in runs if f == "man"}
    metrics = [("BLEU", lambda r: r["test_sets"]["test"]["bleu"], lambda t: t["paired_randomization"]["p_value"])]
    transformer, man = family_summary(runs, ["transformer", "man"], metrics, tests, "test")
    assert transformer["seeds"] == [1, 2, 3] and man["seeds"] == [1, 2]
    assert transformer["fixed-budget"]["mean_std"]["BLEU"] == (25, 1) and "delta" not in transformer["fixed-budget"]
    assert man["fixed-budget"]["delta"]["BLEU"] == [-2, -3] and man["to-convergence"]["delta"]["BLEU"] == [3, -2]
    assert man["to-convergence"]["randomization_p"]["BLEU"] == [0.0001, 0.2]
    lines = family_summary_lines([transformer, man], {"man": "MAN"}, ["BLEU"])
    assert "| MAN | 1, 2 | 22.00 ± 1.41 | -2.50 | -2.00*, -3.00 | 27.00 ± 2.83 | +0.50 | +3.00*, -2.00 |" in lines
    assert "| transformer | 1, 2, 3 | 25.00 ± 1.00 | baseline | baseline | 27.00 ± 1.00 | baseline | baseline |" in lines
    # no seed run both ways: no row
    assert family_summary({k: v for k, v in runs.items() if k[0] == "fixed-budget"}, ["man"], metrics, tests,
                          "test") == []


@pytest.mark.parametrize("study", ["gigaword-cpu", "gigaword-cpu-converge"])
def test_gigaword_calibrates_at_alpha_0_01_beside_the_default(study):
    """The second calibration family is the first with --perturbation-weight 0.01 on its command line,
    and nothing else changed (its mask stays live where the default's saturates)."""
    from man_recipes.training.launch import train_args

    default, live = (load_config(CONFIG_DIR / study / f"{f}.yaml") for f in ("calibration", "calibration-alpha0.01"))
    assert live["train"] == dict(default["train"], **{"perturbation-weight": 0.01})
    assert {k: v for k, v in live.items() if k not in ("train", "name", "_path")} == \
           {k: v for k, v in default.items() if k not in ("train", "name", "_path")}
    argv = train_args(live, "SAVE", device="cpu", data="DATA")
    assert argv[argv.index("--perturbation-weight") + 1] == "0.01"
    assert "--perturbation-weight" not in train_args(default, "SAVE", device="cpu", data="DATA")


@pytest.mark.parametrize("study", ["gigaword-cpu", "gigaword-cpu-converge"])
def test_gigaword_runs_man_with_its_dman_biases_from_zero_beside_the_default(study):
    """The man-zeros family is MAN with --dman-init zeros on its command line and nothing else changed
    (that the option reaches the DMAN biases: tests/test_man.py)."""
    from man_recipes.training.launch import train_args

    default, zeros = (load_config(CONFIG_DIR / study / f"{f}.yaml") for f in ("man", "man-zeros"))
    assert zeros["model"] == dict(default["model"], **{"dman-init": "zeros"})
    assert {k: v for k, v in zeros.items() if k not in ("model", "name", "_path", "notes")} == \
           {k: v for k, v in default.items() if k not in ("model", "name", "_path", "notes")}
    argv = train_args(zeros, "SAVE", device="cpu", data="DATA")
    assert argv[argv.index("--dman-init") + 1] == "zeros"
    assert "--dman-init" not in train_args(default, "SAVE", device="cpu", data="DATA")


def test_a_calibrated_run_whose_mask_ended_saturated_is_named_under_the_table():
    from man_recipes.studies.convergence import saturated_mask_lines

    live = dict(_record("to-convergence", "calibration", 2, 20), mask_mean_curve=[[10, 0.9], [20, 0.95]])
    saturated = dict(_record("to-convergence", "calibration", 1, 20), mask_mean_curve=[[10, 0.956], [20, 1.0]])
    assert saturated_mask_lines([live, _record("fixed-budget", "man", 1, 20)]) == []
    (note,) = [line for line in saturated_mask_lines([live, saturated]) if line]
    assert "calibration seed 1 (to-convergence: mean m 1.000)" in note and "seed 2" not in note


def test_the_generalisation_panel_plots_dev_loss_against_training_loss():
    """Each run's (training loss, dev loss) pairs, matched by update count, its first quarter left out,
    a star on its best checkpoint, training loss falling to the right."""
    from man_recipes.logging_setup import pyplot
    from man_recipes.studies.study_figure import plot_generalisation

    plt = pyplot()
    run = {"family": "man", "seed": 2, "best_updates": 30,
           "train_curve": [[10, 9.0], [20, 8.0], [30, 7.0], [40, 6.5]],
           "valid_curve": [[10, 9.5], [20, 8.5], [30, 7.8], [40, 7.9]]}
    fig, ax = plt.subplots()
    plot_generalisation(ax, [run, dict(run, family="transformer", train_curve=[])], ["transformer", "man"], {},
                        plt.get_cmap("tab10"))
    curve, star = ax.get_lines()  # the run without a training loss draws nothing
    assert list(curve.get_xdata()) == [8.0, 7.0, 6.5] and list(curve.get_ydata()) == [8.5, 7.8, 7.9]
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([7.0], [7.8])
    left, right = ax.get_xlim()
    assert left > 8.0 > 6.5 > right
    assert ax.get_legend_handles_labels()[1] == ["man s2"]
    plt.close(fig)


def test_the_figure_names_two_families_of_one_model_apart_and_gives_a_converged_only_family_its_column(tmp_path):
    """Calibration at α = 1 and at α = 0.01 share the short name "Calibration": each keeps its whole label
    in the figure, and the α = 0.01 family, run to convergence only, still gets its column of stars."""
    from man_recipes.studies.experiments import FAMILY_LABELS
    from man_recipes.studies.study_figure import columns, plot_study, short_labels

    families = ["transformer", "calibration", "calibration-alpha0.01"]
    short = short_labels(families, FAMILY_LABELS)
    assert short["transformer"] == "Transformer"
    assert short["calibration"] != short["calibration-alpha0.01"]
    assert "0.01" in short["calibration-alpha0.01"]

    def run(family, protocol):
        return dict(_record(protocol, family, 1, 20), test_sets={"test": {"rouge1": 25.0}},
                    valid_curve=[[10, 8.0], [20, 7.5]], best_updates=20, best_valid_loss=7.5)

    fixed = [run("transformer", "fixed-budget"), run("calibration", "fixed-budget")]
    conv = [run(f, "to-convergence") for f in families]
    assert columns(families, fixed, conv) == families and columns(families, fixed, []) == families[:2]
    png = tmp_path / "study.png"
    plot_study(fixed, families, FAMILY_LABELS, [("R-1", lambda r: r["test_sets"]["test"]["rouge1"])], png, "t", conv)
    assert png.stat().st_size > 0


def test_a_run_to_convergence_stopped_by_the_cap_is_named_under_the_table():
    from man_recipes.studies.convergence import capped_lines

    patience = dict(_record("to-convergence", "diffwin", 1, 20), stopped_by="patience", stopping_epoch=29, best_epoch=26)
    cap = dict(_record("to-convergence", "diffwin", 2, 20), stopped_by="cap", stopping_epoch=40, best_epoch=40)
    assert capped_lines([patience]) == []
    (note,) = [line for line in capped_lines([patience, cap]) if line]
    assert "diffwin seed 2 (epoch 40, best 40)" in note and "seed 1" not in note


# ------------------------------------------------- the stop fields of a record against its dev curve

def test_every_committed_record_to_convergence_agrees_with_its_dev_curve():
    records = [sr.read_record(p) for p in sorted((REPO / "results").glob("**/*-seed*.json"))]  # every record read
    assert sum(r.get("protocol") == "to-convergence" for r in records) >= 17


# man seed 2's dev loss was 7.386 at epochs 21 and 24: the best checkpoint is epoch 24's (fairseq keeps
# the last of equal losses), the patience counted from epoch 21 (the first), so it stopped at 21 + 3
@pytest.mark.parametrize("record, edit, said", [
    ("gigaword-cpu-converge/man-seed1.json", {"stopping_epoch": 40, "best_epoch": 5, "best_valid_loss": 5.0},
     "it stopped at epoch 40 (25 epochs), but its dev curve has 25 validations, one per epoch"),
    ("gigaword-cpu-converge/man-seed1.json", {"best_valid_loss": 5.0},
     "its best checkpoint is epoch 22 (update 5412, dev loss 5.000), but its dev curve's best is epoch 22 "
     "(update 5412, 6.722)"),
    ("gigaword-cpu-converge/man-seed1.json", {"best_epoch": 5},
     "its best checkpoint is epoch 5 (update 5412, dev loss 6.722), but its dev curve's best is epoch 22"),
    ("gigaword-cpu-converge/man-seed1.json", {"stopped_by": "cap"},
     "it says it stopped at epoch 25 by 'cap' (patience 3, cap 40), but its dev curve reached its best loss at "
     "epoch 22"),
    ("gigaword-cpu-converge/man-seed1.json", {"patience": 10}, "by 'patience' (patience 10, cap 40)"),
    ("gigaword-cpu-converge/man-seed1.json", {"valid_curve": "cut"},
     "it stopped at epoch 25 (25 epochs), but its dev curve has 20 validations"),
    ("gigaword-cpu-converge/man-seed1.json", {"stopping_epoch": "25"}, "its stop fields or dev curve are not what"),
    ("gigaword-cpu-converge/man-seed2.json", {"best_epoch": 21, "best_updates": 5166},
     "its best checkpoint is epoch 21 (update 5166, dev loss 7.386), but its dev curve's best is epoch 24"),
    ("gigaword-cpu-converge/diffwin-seed2.json", {"stopped_by": "patience"}, "by 'patience' (patience 3, cap 40)"),
])
def test_a_record_whose_stop_fields_its_dev_curve_contradicts_is_refused(tmp_path, record, edit, said):
    # was tabulated with exit status 0 (the issue: "40 (best 5), 5.000" beside a curve whose best is epoch 22)
    saved = json.loads((REPO / "results" / record).read_text())
    if edit.get("valid_curve") == "cut":
        edit = {"valid_curve": saved["valid_curve"][:20]}
    path = tmp_path / record.split("/")[1]
    path.write_text(json.dumps({**saved, **edit}))
    with pytest.raises(sr.RecordError) as e:
        sr.read_record(path)
    assert str(e.value).startswith(f"{path}: ") and said in str(e.value)
    assert str(e.value).endswith("; restore it (git checkout) or rerun that run (--force)")
