"""The to-convergence protocol of a study: what a run's record says of how it was trained,
and the part of a study table that sets the two protocols side by side.

A study trains a fixed budget (``configs/<study>/``: its epochs, scored on the average of its last
``eval.avg_last`` checkpoints) and, as a second experiment, to convergence (``configs/<study>-converge/``:
the same config with ``train.patience``, fairseq's ``--patience`` counted in validations, and
``max-epoch`` as the cap; scored on ``checkpoint_best.pt``, the best checkpoint by dev loss). The
first answers "which learns faster", the second "which ends better". The two never share a row:
each protocol's runs are compared with the Transformer of the same seed *and protocol*.
"""

import json
from pathlib import Path

from man_recipes.tables import markdown_table, mean_std
from man_recipes.training.fairseq_log import valid_epochs
from man_recipes.studies.experiments import BASELINE, FIXED_BUDGET, TO_CONVERGENCE, protocol


class ConvergenceError(RuntimeError):
    pass


def best_checkpoint(run):
    """The checkpoint a to-convergence run is scored on: fairseq's ``checkpoint_best.pt``."""
    best = Path(run) / "checkpoints" / "checkpoint_best.pt"
    if not best.is_file():
        raise ConvergenceError(f"{best}: missing; a run trained to convergence is scored on its best checkpoint "
                               "by dev loss (did its training validate?)")
    return best


def checkpoint_updates(path):
    """The update count at which fairseq saved ``path`` (its optimizer history)."""
    import torch

    from man_fairseq.patches import safe_globals

    safe_globals.apply()  # what a fairseq checkpoint holds (man_recipes does not import the plugin itself)
    state = torch.load(path, map_location="cpu", weights_only=True)
    return int(state["optimizer_history"][-1]["num_updates"])


def record_fields(cfg, run, scored):
    """The protocol part of a run's record: ``protocol`` and, to convergence, the patience and cap,
    the epoch it stopped at (and why: ``patience`` or ``cap``), the epoch of the checkpoint scored
    (``scored``, the best) and its dev loss."""
    if protocol(cfg) == FIXED_BUDGET:
        return {"protocol": FIXED_BUDGET}
    epochs, early = valid_epochs(Path(run) / "train.log")
    if not epochs:
        raise ConvergenceError(f"{run}/train.log: no end-of-epoch validation; cannot say which epoch was best")
    updates = checkpoint_updates(scored)
    best = [e for e in epochs if e[1] == updates]
    if not best:
        raise ConvergenceError(f"{scored}: saved at update {updates}, which no validation of {run}/train.log has")
    command = read_command(run)
    return {"protocol": TO_CONVERGENCE, "patience": int(last_option(command, "--patience", cfg["train"]["patience"])),
            "max_epoch": int(last_option(command, "--max-epoch", cfg["train"]["max-epoch"])),
            "stopping_epoch": epochs[-1][0], "stopped_by": "patience" if early else "cap",
            "best_epoch": best[-1][0], "best_updates": updates, "best_valid_loss": best[-1][2]}


def stop_fields_disagreement(record):
    """What in a to-convergence record's stop fields (:func:`record_fields`) its own dev curve
    (``valid_curve``: [updates, loss] of each epoch's validation) contradicts, in words; None when
    they agree (a fixed-budget record has none). fairseq keeps the last of equal losses as
    ``checkpoint_best.pt`` (``<=``) but counts the patience from the first (``<``); a run resumed from a
    checkpoint older than :mod:`man_fairseq.patches.patience_resume` restarted the count, so it may stop later."""
    if record_protocol(record) != TO_CONVERGENCE:
        return None
    try:
        curve = [(int(u), float(loss)) for u, loss in record["valid_curve"]]
        stop, best, by = record["stopping_epoch"], record["best_epoch"], record["stopped_by"]
        patience, cap = record["patience"], record["max_epoch"]
        if not all(isinstance(v, int) and v >= 1 for v in (stop, best, patience, cap)):
            raise ValueError
        best_loss, best_updates = float(record["best_valid_loss"]), record["best_updates"]
        command = [str(word) for word in record.get("train_command") or []]
        max_update = int(last_option(command, "--max-update", 0) or 0)  # the other cap fairseq stops at
    except (KeyError, TypeError, ValueError):
        return "its stop fields or dev curve are not what a to-convergence record holds"
    if len(curve) != stop or record.get("epochs", stop) != stop:
        return (f"it stopped at epoch {stop} ({record.get('epochs')} epochs), but its dev curve has "
                f"{len(curve)} validations, one per epoch")
    if not curve or record.get("updates") != curve[-1][0]:
        return (f"it trained {record.get('updates')} updates, but its dev curve ends at update "
                f"{curve[-1][0] if curve else None}")
    losses = [loss for _, loss in curve]
    # --maximize-best-checkpoint-metric (the tests' way to stop a tiny model early) makes the highest one best
    curve_best = (max if "--maximize-best-checkpoint-metric" in command else min)(losses)
    last_best_epoch = len(losses) - losses[::-1].index(curve_best)
    first_best_epoch = losses.index(curve_best) + 1
    if (best, best_loss, best_updates) != (last_best_epoch, curve_best, curve[last_best_epoch - 1][0]):
        return (f"its best checkpoint is epoch {best} (update {best_updates}, dev loss {best_loss:.3f}), but its "
                f"dev curve's best is epoch {last_best_epoch} "
                f"(update {curve[last_best_epoch - 1][0]}, {curve_best:.3f})")
    capped = stop == cap or (max_update > 0 and record["updates"] >= max_update)
    if by not in ("patience", "cap") or stop > cap or (by == "cap" and not capped) or (
            by == "patience" and stop - first_best_epoch < patience):
        return (f"it says it stopped at epoch {stop} by {by!r} (patience {patience}, cap {cap}), but its dev curve "
                f"reached its best loss at epoch {first_best_epoch}")
    return None


def read_command(run):
    """The fairseq-train command the launcher recorded for ``run`` (``run.json``), or []."""
    path = Path(run) / "run.json"
    return json.loads(path.read_text()).get("command") or [] if path.is_file() else []


def last_option(command, flag, default):
    """The value fairseq-train took for ``flag``: its last occurrence in ``command`` (the options after
    ``--`` of scripts/reproduce.sh come after the config's), else ``default``."""
    values = [command[i + 1] for i, word in enumerate(command[:-1]) if word == flag]
    return values[-1] if values else default


def record_protocol(record):
    """A record's protocol; records written before there were two are fixed-budget ones."""
    return record.get("protocol", FIXED_BUDGET)


def dev_loss(record):
    """(epochs trained, the dev loss of the scored checkpoint): the best one to convergence, the last
    one on a fixed budget (an average of checkpoints has no dev loss of its own: its last epoch's)."""
    if record_protocol(record) == TO_CONVERGENCE:
        return f"{record['stopping_epoch']} (best {record['best_epoch']})", record["best_valid_loss"]
    curve = record.get("valid_curve") or []
    return str(record.get("epochs", len(curve))), (curve[-1][1] if curve else None)


# a seed whose run differs from its Transformer at this randomization p is marked in the family summary
SIGNIFICANT = 0.05


def family_summary(runs, families, metrics, tests, subset):
    """Per family, over the seeds trained both ways (and whose Transformer was too, so that both
    protocols are compared on the same seeds): each protocol's mean and sample standard deviation of
    every metric, its mean difference to the Transformer of the same seed, and each seed's difference
    on the first metric with its randomization p. ``runs``: {(protocol, family, seed): record};
    ``metrics``: (name, value of a record, randomization p of a run's tests) per metric."""
    def scored_both_ways(fam, seed):
        keys = [(p, g, seed) for p in (FIXED_BUDGET, TO_CONVERGENCE) for g in (fam, BASELINE)]
        return all(k in runs and all(value(runs[k]) is not None for _, value, _ in metrics) for k in keys)

    out = []
    for fam in families:
        seeds = sorted({seed for (_, f, seed) in runs if f == fam and scored_both_ways(fam, seed)})
        if not seeds:
            continue
        entry = {"family": fam, "seeds": seeds}
        for proto in (FIXED_BUDGET, TO_CONVERGENCE):
            values = {name: [value(runs[(proto, fam, s)]) for s in seeds] for name, value, _ in metrics}
            part = {"mean_std": {name: mean_std(v) for name, v in values.items()}}
            if fam != BASELINE:
                part["delta"] = {name: [value(runs[(proto, fam, s)]) - value(runs[(proto, BASELINE, s)]) for s in seeds]
                                 for name, value, _ in metrics}
                part["randomization_p"] = {name: [p_of(tests[(proto, fam, s, subset)]) for s in seeds]
                                           for name, _, p_of in metrics}
            entry[proto] = part
        out.append(entry)
    return out


def family_summary_lines(summary, labels, metric_names):
    """The Markdown of :func:`family_summary`."""
    first = metric_names[0]

    def cells(part):
        spread = " / ".join(f"{m:.2f}" + (f" ± {sd:.2f}" if sd is not None else "")
                            for m, sd in (part["mean_std"][n] for n in metric_names))
        if "delta" not in part:
            return [spread, "baseline", "baseline"]
        mean_delta = " / ".join(f"{sum(d) / len(d):+.2f}" for d in (part["delta"][n] for n in metric_names))
        per_seed = ", ".join(f"{d:+.2f}" + ("*" if p < SIGNIFICANT else "")
                             for d, p in zip(part["delta"][first], part["randomization_p"][first]))
        return [spread, mean_delta, per_seed]

    rows = [[labels.get(e["family"], e["family"]), ", ".join(map(str, e["seeds"])),
             *cells(e[FIXED_BUDGET]), *cells(e[TO_CONVERGENCE])] for e in summary]
    names = " / ".join(metric_names)
    return ["Per family, over the seeds trained both ways (the Transformer's too): mean ± sample standard deviation "
            f"of {names}, the mean difference to the Transformer of the same seed and protocol, and each seed's "
            f"difference in {first} (* randomization p < {SIGNIFICANT}).", "",
            *markdown_table(["family", "seeds", "fixed budget: mean", "Δ (mean)", f"Δ {first} per seed",
                             "to convergence: mean", "Δ (mean)", f"Δ {first} per seed"], rows)]


def side_by_side(fixed, converged, converged_stale, families, labels, score_cells, p_cells, tests, subset, scores,
                 metrics):
    """(Markdown lines, per-family summary): per family and seed, the fixed-budget run beside the run
    to convergence (epochs, dev loss, ``scores`` on ``subset``, the two p's against the Transformer of
    the same seed and protocol), then per family the two protocols' means over the seeds run both ways
    (:func:`family_summary` of ``metrics``). ``score_cells(record)`` gives a record's score cell,
    ``p_cells(record, its tests)`` its p cell; ``tests`` maps (protocol, family, seed, subset) to the
    tests of a run. A run one protocol lacks is a dash."""
    runs = {(record_protocol(r), r["family"], r["seed"]): r for r in fixed + converged}
    lines = ["## Fixed budget | to convergence", "",
             "Each run beside the same family and seed trained to convergence (`scripts/reproduce.sh "
             "EXPERIMENT-converge`: until the dev loss has not improved for `patience` validations, at most "
             "`max-epoch` epochs, scored on its best checkpoint by dev loss; records in `results/EXPERIMENT-converge/`). "
             f"Scores: {scores}. p: paired bootstrap / approximate randomization against the Transformer of the "
             "same seed and protocol (the table's notes). Fixed-budget dev loss: its last epoch's.", ""]
    rows = []
    for fam in families:
        for seed in sorted({seed for (_, f, seed) in runs if f == fam}):
            cells = []
            for proto in (FIXED_BUDGET, TO_CONVERGENCE):
                r = runs.get((proto, fam, seed))
                if r is None:
                    cells += ["–"] * 4
                    continue
                epochs, loss = dev_loss(r)
                run_tests = tests.get((proto, fam, seed, subset))
                p = "baseline" if fam == BASELINE else (p_cells(r, run_tests) if run_tests else "–")
                cells += [epochs, "–" if loss is None else f"{loss:.3f}", score_cells(r), p]
            rows.append([labels.get(fam, fam), f"{seed}", *cells])
    lines += markdown_table(["family", "seed", "fixed budget: epochs", "dev loss", "scores", "p",
                             "to convergence: epochs (best)", "best dev loss", "scores", "p"], rows)
    lines += capped_lines(converged)
    summary = family_summary(runs, families, metrics, tests, subset)
    if summary:
        lines += [""] + family_summary_lines(summary, labels, [name for name, _, _ in metrics])
    if converged_stale:
        lines += ["", "Stale to-convergence records (another config or options; not in the table): "
                  + ", ".join(f"{r['family']}-seed{r['seed']} (`{r.get('fingerprint')}`)" for r in converged_stale) + "."]
    return lines + [""], summary


def capped_lines(converged):
    """A note naming the runs to convergence that the epoch cap stopped, not patience: their dev loss
    had improved within their last ``patience`` validations, so they are not shown to have converged.
    No note when there are none."""
    capped = [r for r in converged if r.get("stopped_by") == "cap"]
    if not capped:
        return []
    runs = ", ".join(f"{r['family']} seed {r['seed']} (epoch {r['stopping_epoch']}, best {r['best_epoch']})"
                     for r in capped)
    return ["", f"Stopped by the cap (`max-epoch`) while the dev loss still improved within the patience, so not "
            f"converged: {runs}."]


def saturated_mask_lines(records):
    """A note naming the calibrated runs whose perturbation mask ended saturated (mean m at least the
    training warning's threshold in the last epoch, from the record's ``mask_mean_curve``), of either
    protocol: such a run trained as a Transformer. No note when there are none."""
    from man_fairseq.criterions.calibrated_label_smoothed_cross_entropy import MaskSaturation

    saturated = [r for r in records
                 if r.get("mask_mean_curve") and r["mask_mean_curve"][-1][1] >= MaskSaturation.threshold]
    if not saturated:
        return []
    runs = ", ".join(f"{r['family']} seed {r['seed']} ({record_protocol(r)}: mean m {r['mask_mean_curve'][-1][1]:.3f})"
                     for r in saturated)
    return [f"Perturbation mask saturated in its last training epoch (mean m ≥ {MaskSaturation.threshold}): {runs}. "
            "Its calibrated attention is then the original one, so the run trained as a Transformer "
            "(docs/calibration.md#when-the-mask-saturates).", ""]


def protocol_payload(converged, converged_stale, tests, names, summary):
    """The JSON of a study table's to-convergence runs: each with its tests (``names``), the stale ones
    and the per-family ``summary`` of the two protocols (:func:`family_summary`)."""
    runs = [dict(r, **{name: {k[2]: v[name] for k, v in tests.items() if k[:2] == (r["family"], r["seed"])}
                       for name in names}) for r in converged]
    return {"runs": runs, "stale": [f"{r['family']}-seed{r['seed']}" for r in converged_stale], "families": summary}
