"""Every mode's records (:func:`new_record`) and the tables rebuilt from them: ``<experiment>.md`` (every
setting of one study) and the block of ``docs/speed.md`` (:data:`PAGE`, every study). Per family: words/s
(median of the logged ``wps`` after the warm-up intervals), peak memory, sentences/s, each the median over
repeats (min–max) and as a ratio to the Transformer *of the same repeat* (a load drift hits a repeat alike).
"""

import datetime
import json
import os
import statistics
from pathlib import Path

from man_recipes.provenance import cpu_model, git_commit
from man_recipes.atomic import write_text
from man_recipes.config import REPO
from man_recipes.tables import markdown_table

RECORD_KIND = "man-fairseq real-batch speed"
RECORD_VERSION = 1
PAGE = "docs/speed.md"  # the page that holds the generated block, relative to the repository
BLOCK_BEGIN = ("<!-- speed-table begin: generated from results/speed/*.json by "
               "`scripts/speed.sh EXPERIMENT --table-only --update-docs`; tests/test_speed.py checks it -->")
BLOCK_END = "<!-- speed-table end -->"
QUANTITIES = (("train", "training words/s"), ("memory", "peak training memory"), ("decode", "decoding sentences/s"))
# A family's floor: the same model with its method free. MAN's and SMAN2's is MAN with its DMAN (SMAN2)
# sublayer a plain self-attention (``man-nobias``: its second attention sublayer is the layer's, not the
# mask's cost); every other family's is the Transformer, the tables' own ratio (issue 80).
FLOORS = {"man": "man-nobias", "man-zeros": "man-nobias", "sman2": "man-nobias"}
FLOOR_NOTE = ("Each family's floor is the same model with its method free: MAN's and SMAN2's is MAN with its DMAN "
              "(SMAN2) sublayer a plain self-attention (`man-nobias`: the table below), every other family's the "
              "Transformer (the ratios above).")


class SpeedRecordError(ValueError):
    pass


def tag(threads, device="cpu", precision="fp32"):
    """A setting's part of file and folder names: ``threads<T>``, or ``cuda-<precision>`` on a GPU."""
    return f"cuda-{precision}" if device == "cuda" else f"threads{threads}"


def record_path(records_dir, experiment, threads, device="cpu", precision="fp32"):
    return Path(records_dir) / f"{experiment}-{tag(threads, device, precision)}.json"


def on_gpu(record):
    return record.get("device", "cpu") == "cuda"


def setting_name(record):
    """How a record's setting reads in a table: its thread count, or the GPU and precision."""
    if on_gpu(record):
        return f"{short_gpu(record.get('gpu'))} {record['precision']}"
    return str(record["threads"])


def setting_tag(record):
    return tag(record["threads"], record.get("device", "cpu"), record.get("precision", "fp32"))


def short_gpu(name):
    """'NVIDIA H200' -> 'H200' (the table's cell); the full name stays in the provenance line."""
    return (name or "GPU").replace("NVIDIA ", "")


def read_record(path):
    """A record of ours; :class:`SpeedRecordError` naming the file otherwise."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpeedRecordError(f"{path}: not a readable speed record ({e})") from e
    if not isinstance(record, dict) or record.get("kind") != RECORD_KIND:
        raise SpeedRecordError(f"{path}: not a speed record of scripts/speed.sh (no kind {RECORD_KIND!r})")
    return record


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def new_record(experiment, setting, command, data, configs, settings, gpu=None):
    """What every mode's record starts with: the setting measured ({threads, device, precision}), the
    command, the code and the machine before, the data, {family: config path} (the Transformer first) and
    the mode's ``settings``; the mode adds its ``runs`` (study, synthetic: ``train`` and ``decode`` of each
    repeat and family; profile --passes: ``phases`` of each batch and family), then :func:`finish`."""
    return {"kind": RECORD_KIND, "version": RECORD_VERSION, "experiment": experiment, "threads": setting["threads"],
            "device": setting["device"], "precision": setting["precision"], "gpu": gpu, "command": command,
            "commit": git_commit(), "cpu": cpu_model(), "cpu_count": os.cpu_count(), "date": now(),
            "loadavg_before": list(os.getloadavg()), "data": str(data), "families": list(configs),
            "configs": {f: os.path.relpath(path, REPO) for f, path in configs.items()}, "settings": settings}


def finish(record):
    record.update(loadavg_after=list(os.getloadavg()), finished=now())
    return record


def write_json(path, content):
    """Written whole or not at all (:func:`man_recipes.atomic.write_text`): a run stopped
    midway leaves the earlier record as it was."""

    write_text(path, json.dumps(content, indent=1) + "\n")


def read_records(records_dir, experiment=None):
    """Every record in ``records_dir`` (of ``experiment`` only, when given), by study then threads."""
    folder = Path(records_dir)
    paths = sorted(p for pattern in ("threads*", "cuda-*")
                   for p in folder.glob(f"{experiment or '*'}-{pattern}.json")) if folder.is_dir() else []
    records = [read_record(p) for p in paths]
    return sorted(records, key=lambda r: (r["experiment"], on_gpu(r), r.get("precision", "fp32"), r["threads"]))


# ------------------------------------------------------------------------------------ numbers

def train_words_per_s(run, warmup):
    """The median of fairseq's ``wps`` over the logged intervals after the ``warmup`` first ones."""
    return statistics.median(run["train"]["wps"][warmup:])


def run_values(run, warmup):
    """{quantity: value} of one (repeat, family) run."""
    memory = run["train"].get("peak_cuda_mib", run["train"]["peak_rss_mib"])
    return {"train": train_words_per_s(run, warmup), "memory": memory,
            "decode": run["decode"]["sentences_per_s"] if run["decode"] else None}


def spread(values):
    """{"median", "min", "max", "n"} of ``values``; None where a value was not measured."""
    if not values or any(v is None for v in values):
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(record):
    """[{family, threads, trained, same_batches, out_len, <quantity>: spread, <quantity>_ratio: spread}]
    of a record, its families in their order (the Transformer first); the Transformer's ratios are None."""
    warmup = record["settings"]["warmup_intervals"]
    baseline = record["families"][0]
    by_repeat = {}
    for run in record["runs"]:
        by_repeat.setdefault(run["repeat"], {})[run["family"]] = run
    rows = []
    for fam in record["families"]:
        repeats = [runs for runs in by_repeat.values() if fam in runs and baseline in runs]
        floor = FLOORS.get(fam)
        floor_repeats = [runs for runs in by_repeat.values() if fam in runs and floor in runs]
        values = [run_values(runs[fam], warmup) for runs in repeats]
        base = [run_values(runs[baseline], warmup) for runs in repeats]
        decoded = all(runs[fam]["decode"] for runs in repeats)
        trained = record["checkpoints"][fam]["trained"] if decoded else True
        row = {"family": fam, "threads": record["threads"], "trained": trained,
               # a trained model's outputs end where an untrained one's run to the length limit
               "decode_comparable": not decoded or trained == record["checkpoints"][baseline]["trained"],
               "same_batches": all(runs[fam]["train"]["wpb"] == runs[baseline]["train"]["wpb"] for runs in repeats),
               "out_len": spread([runs[fam]["decode"]["tokens"] / runs[fam]["decode"]["sentences"] for runs in repeats])
               if decoded else None}
        for q, _ in QUANTITIES:
            row[q] = spread([v[q] for v in values])
            row[q + "_ratio"] = None if fam == baseline or row[q] is None or (
                q == "decode" and not row["decode_comparable"]) else spread(
                [v[q] / b[q] for v, b in zip(values, base)])
        if floor_repeats:  # {quantity}_floor_ratio: to the floor of the same repeat
            row["floor"] = floor
            for q in ("train", "memory"):
                row[q + "_floor_ratio"] = spread([run_values(runs[fam], warmup)[q] / run_values(runs[floor], warmup)[q]
                                                  for runs in floor_repeats])
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------ text

def fmt_value(s, quantity):
    digits = {"train": 0, "memory": 0, "decode": 1}[quantity]
    one = (lambda v: f"{v:,.{digits}f}")
    unit = " MiB" if quantity == "memory" else ""
    text = one(s["median"]) + unit
    return text if s["n"] == 1 else f"{text} ({one(s['min'])}–{one(s['max'])})"


def fmt_ratio(s):
    if s is None:
        return "1"
    text = f"{s['median']:.2f}×"
    return text if s["n"] == 1 else f"{text} ({s['min']:.2f}–{s['max']:.2f})"


def table_rows(rows, labels, lead=()):
    """The cells of each row: ``lead`` cells, the family, then each quantity's value and ratio."""
    out = []
    for row in rows:
        cells = list(lead) + [labels.get(row["family"], row["family"])]
        for q, _ in QUANTITIES:
            if row[q] is None:
                cells += ["—", "—"]
                continue
            ratio = fmt_ratio(row[q + "_ratio"])
            if q == "train" and not row["same_batches"]:
                ratio += " ‡"
            if q == "decode" and not row["decode_comparable"]:
                ratio = "— §"
            elif q == "decode" and not row["trained"]:
                ratio += " †"
            cells += [fmt_value(row[q], q), ratio]
        out.append(cells)
    return out


def table(lead, rows):
    """The Markdown table of ``rows`` (:func:`table_rows`) under ``lead``'s columns: the numbers right-aligned."""
    names = list(lead) + ["family"] + [c for _, name in QUANTITIES for c in (name, "× Transformer")]
    return markdown_table(names, rows, "l" * (len(lead) + 1) + "r" * (len(names) - len(lead) - 1))


def floor_table(lead, records, summaries, labels, lead_cells):
    """The families whose floor is not the Transformer, against their floor (a line and the table; [] when no
    record holds a family with its floor). ``lead_cells(record)``: each row's ``lead`` cells."""
    rows = [lead_cells(record) + [labels.get(row["family"], row["family"]), labels.get(row["floor"], row["floor"]),
                                  fmt_ratio(row["train_floor_ratio"]), fmt_ratio(row["memory_floor_ratio"])]
            for record, rows in zip(records, summaries) for row in rows if "floor" in row]
    if not rows:
        return []
    return [FLOOR_NOTE, ""] + markdown_table(list(lead) + ["family", "its floor", "training words/s × floor",
                                                           "peak training memory × floor"],
                                             rows, "l" * (len(lead) + 2) + "rr") + [""]


def footnotes(summaries):
    notes = []
    if any(not row["trained"] and row["decode_comparable"] for rows in summaries for row in rows):
        notes.append("† decoded an **untrained** model (no trained checkpoint of the study was found): its output "
                     "lengths are not a trained model's, so its decoding speed says little of what users pay.")
    if any(not row["decode_comparable"] for rows in summaries for row in rows):
        notes.append("§ one of this family's and the Transformer's decoded models was trained and the other not: "
                     "their outputs differ in length, so no decoding ratio is given.")
    if any(not row["same_batches"] for rows in summaries for row in rows):
        notes.append("‡ its batches differed from the Transformer's (fairseq's words per batch differ): "
                     "the training ratio compares different work.")
    return notes


def provenance(record):
    s = record["settings"]
    load = lambda v: f"{v[0]:.2f}"  # noqa: E731  (the 1-minute load average)
    threads = f"{record['threads']} thread{'s' if record['threads'] > 1 else ''}"
    where = (f"{record['gpu']}, --{record['precision']}, {threads} on {record['cpu']} ({record['cpu_count']} cores)"
             if on_gpu(record) else f"{record['cpu']} ({record['cpu_count']} cores)")
    decoded = ("no decoding" if s.get("skip_decoding")
               else f"{s['decode_sentences']} sentences of `{s['test_set']}` decoded at batch {s['batch_size']}")
    trained = sorted(f for f, c in record.get("checkpoints", {}).items() if c.get("trained"))
    if trained and not s.get("skip_decoding"):
        decoded += (f" (the study's trained seed-{s.get('checkpoint_seed', 1)} checkpoints of "
                    f"{', '.join(trained)})")
    return (f"{setting_name(record) if on_gpu(record) else threads}: `{record['command']}` — commit "
            f"{record['commit']}, {where}, {record['date']}, load average "
            f"{load(record['loadavg_before'])} before → {load(record['loadavg_after'])} after; {s['repeats']} repeat(s), "
            f"{s['updates']} updates logged every {s['log_interval']} (first {s['warmup_intervals']} interval(s) "
            f"warm-up), {decoded}")


GPU_RATIO_NOTE = (
    "On a GPU the ratios compare implementations as well as methods: fairseq's Transformer runs fairseq's "
    "`MultiheadAttention`, whose SDPA calls take cuDNN's kernel on Hopper, and cuDNN builds an execution graph "
    "for every new batch shape (one bf16 update on CNN/DM batches on an H200: 357 ms where the shapes were new, "
    "49 ms with cuDNN attention off, results/gpu/2026-11-29-h200.md); the plugin's core leaves cuDNN out. "
    "`scripts/speed.sh profile EXPERIMENT --device cuda --families transformer,core,FAMILY` adds the core without "
    "a bias as a second baseline.")


def lead_name(records):
    return "threads / GPU" if any(on_gpu(r) for r in records) else "threads"


def short_setting(record):
    return setting_name(record) if on_gpu(record) else f"{record['threads']} thr."


def to_markdown(experiment, records, labels, title=None):
    """``results/speed/<experiment>.md`` from the experiment's records."""
    summaries = [summarize(r) for r in records]
    synthetic = bool(records and records[0].get("synthetic"))
    lines = [f"# Speed on {'random' if synthetic else 'real'} batches: {experiment}", ""] + ([title, ""] if title else [])
    where = "a folder of random sentences" if synthetic else "the study's data-bin"
    lines += ["Written by `scripts/speed.sh` from the records beside this file (never by hand). Each family "
              f"trains fairseq-train on {where} with its own config (the same batches: seed 1) "
              "and decodes a fixed test sample with fairseq-generate at its config's beam, length penalty and "
              "length limits, interleaved with the Transformer of the same study in every repeat. Training "
              "words/s: fairseq's `wps` (target tokens per second), median over the logged intervals after "
              "the warm-up; peak training memory: the peak resident set of the fairseq-train process "
              "(`ru_maxrss` from `os.wait4`), on a GPU the peak CUDA memory torch allocated over the run; "
              "decoding: fairseq-generate's own sentences/s (generation time only). Values: median over repeats (min–max); ratios: to the Transformer of the same repeat, "
              "median (min–max).", ""]
    lines += [f"- {provenance(r)}" for r in records] + [""]
    lines += table([lead_name(records)], [cells for record, rows in zip(records, summaries)
                                           for cells in table_rows(rows, labels, lead=[setting_name(record)])]) + [""]
    lines += floor_table([lead_name(records)], records, summaries, labels, lambda r: [setting_name(r)])
    lines += [n + "\n" for n in footnotes(summaries)]
    if any(on_gpu(r) for r in records):
        lines += [GPU_RATIO_NOTE + "\n"]
    lengths = [f"{labels.get(row['family'], row['family'])} {row['out_len']['median']:.1f} ({short_setting(rec)})"
               for rec, rows in zip(records, summaries) for row in rows if row["out_len"]]
    if lengths:
        lines += ["Output length (tokens per decoded sentence, median over repeats): " + "; ".join(lengths) + ".", ""]
    return "\n".join(lines)


def page_block(records_dir, labels):
    """:data:`PAGE`'s generated block: every study's records in one table (a line saying so when none)."""
    records = read_records(records_dir)
    lines = [BLOCK_BEGIN]
    if not records:
        lines += ["No real-batch measurement is recorded yet (`results/speed/` holds no record): the numbers "
                  "must come from an idle machine, see [results/speed/](../results/speed/README.md#real-batches-of-the-studies-scriptsspeedsh)."]
    else:
        summaries = [summarize(r) for r in records]
        lines += ["Made by `scripts/speed.sh EXPERIMENT` on each study's own data-bin and configs (method in "
                  "[results/speed/](../results/speed/README.md#real-batches-of-the-studies-scriptsspeedsh)): median over "
                  "repeats (min–max), ratios to the Transformer of the same repeat.", ""]
        lines += table(["study", lead_name(records)],
                       [cells for record, rows in zip(records, summaries)
                        for cells in table_rows(rows, labels, lead=[record["experiment"], setting_name(record)])])
        lines += [""] + floor_table(["study", lead_name(records)], records, summaries, labels,
                                    lambda r: [r["experiment"], setting_name(r)])
        lines += [n + "\n" for n in footnotes(summaries)] + [
            "Machines: " + "; ".join(f"{r['experiment']} {short_setting(r)}: {r['gpu'] + ', ' if on_gpu(r) else ''}"
                                     f"{r['cpu']}, {r['date'][:10]}, commit {r['commit']}" for r in records)
            + ". Details: `results/speed/EXPERIMENT.md`."]
    return "\n".join(lines + [BLOCK_END])


def replace_page_block(text, block, where=PAGE):
    """``text`` with its generated block replaced by ``block``."""
    return text.replace(page_section(text, where), block, 1)


def page_section(text, where=PAGE):
    """The generated block as ``text`` has it."""
    start, end = text.find(BLOCK_BEGIN), text.find(BLOCK_END)
    if start < 0 or end < start:
        raise SpeedRecordError(f"{where}: no speed-table block (the lines {BLOCK_BEGIN!r} ... {BLOCK_END!r})")
    return text[start:end + len(BLOCK_END)]
