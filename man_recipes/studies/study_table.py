"""What every study table shares (the BLEU studies' :mod:`bleu_table`, the summarization studies'
:mod:`summarization_table`), each rebuilt from its committed run records (:mod:`study_records`) alone:
the families' runs by seed and the start of their summary entries, the per-seed tests' columns (both
paired tests measure test-set sampling, not training noise: the verdict is :mod:`seed_level`'s), the
head of the table (title, build, devices, commits, the command of one run), the stale records listed
below the table and never mixed into it, and the writing of ``<experiment>.md`` and ``.json``.
"""

import datetime
import json
import os
import shlex
from pathlib import Path

from man_recipes.atomic import write_text
from man_recipes.config import REPO
from man_recipes.studies.experiments import BASELINE
from man_recipes.tables import markdown_table, mean_std

def pm(values):
    """Mean ± sample standard deviation over seeds, as the tables print it."""
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f} (1 seed)"


def fmt_p(p):
    """A p-value as the tables print it: 3 decimals, 4 below 0.001 (an AR's smallest, 1/10,001, is not 0)."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.4f}"


def params(n):
    """A parameter count as the tables print it (8.04M, 54.5k)."""
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


# the two paired tests of every study table, as its JSON names them: sacreBLEU's p and randomization's
TESTS = ("paired_bootstrap", "paired_randomization")
# what they measure, in their column headers: two trained networks on these sentences, not two architectures
SAMPLING = "test-set sampling, not training noise"


def same_seed_pairs(records, subsets):
    """(run, the Transformer of its seed, test set) of every run but the Transformers', on every test set of
    ``subsets`` both scored: the pairs the significance tests compare."""
    base = {r["seed"]: r for r in records if r["family"] == BASELINE}
    for r in records:
        b = base.get(r["seed"])
        if r["family"] != BASELINE and b is not None:
            for subset in r["test_sets"]:
                if subset in b["test_sets"] and subset in subsets:
                    yield r, b, subset


def seed_tests(family, runs, subset, boot):
    """{test: its result per seed of ``runs`` (the family's, by seed) on ``subset``}, from ``boot`` as
    the table's ``significance`` gives it; none for the Transformer, the baseline of every test."""
    if family == BASELINE:
        return {}
    return {test: [(boot.get((family, r["seed"], subset)) or {}).get(test) for r in runs] for test in TESTS}


def family_rows(summary, subset):
    """(family, its summary entry, its scores on ``subset``, its mean train minutes) of every family
    scored on ``subset``: the rows of a study table's section."""
    for fam, e in summary.items():
        s = e["test_sets"].get(subset)
        if s is not None:
            yield fam, e, s, f"{sum(e['train_minutes']) / len(e['train_minutes']):.1f}"


def family_runs(families, records, labels):
    """(family, its records by seed, the start of its summary entry) of every family of ``families``
    with records (:func:`family_entry`)."""
    for fam in families:
        fr, entry = family_entry(fam, records, labels)
        if fr:
            yield fam, fr, entry


def family_entry(family, records, labels):
    """(the family's records by seed, the start of its summary entry): what every study table says of
    a family besides its scores; ([], None) for a family without records."""
    fr = sorted((r for r in records if r["family"] == family), key=lambda r: r["seed"])
    if not fr:
        return fr, None
    return fr, {"label": labels.get(family, family), "arch": fr[0]["arch"], "seeds": [r["seed"] for r in fr],
                "params": fr[0]["params"], "train_minutes": [round(r["train_seconds"] / 60, 1) for r in fr],
                "updates": [r["updates"] for r in fr], "test_sets": {}}


def table_meta(exp, records, records_dir, args):
    """The head of a study table's ``meta``: title, build date, where the records are, their devices
    and commits, the configs and the extra fairseq options."""
    return {"title": exp["title"] + overrides_note(args), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "records": shown_path(records_dir),
            "devices": sorted({f"{r['device']} (threads {r.get('threads')})" for r in records}),
            "commits": sorted({r["commit"] for r in records}),
            "configs": os.path.relpath(exp["configs"], REPO), "fairseq_args": args.fairseq_args}


def overrides_note(args):
    """What a study's headings add when its runs read another data folder than the experiment's (its
    path and subword model: the title names the experiment's data) or had fairseq options after ``--``
    (the title says the configs' sizes and budget, "d=256, 3+3 layers", which those options may override)."""
    note = ""
    if other_data(args):
        from man_recipes.data.subword import read_subword

        note += f" [data `{shown_path(args.data)}`, {read_subword(args.data)['kind']} subwords]"
    if getattr(args, "fairseq_args", None):
        note += f" [with fairseq options `{shlex.join(args.fairseq_args)}`, which override the configs' values above]"
    return note


def other_data(args):
    """Whether ``args.data`` is another folder than the experiment's default."""
    from man_recipes.studies.experiments import EXPERIMENTS

    exp = EXPERIMENTS.get(getattr(args, "experiment", None))
    return exp is not None and Path(args.data).resolve() != Path(exp["data"]).resolve()


def shown_path(path):
    """``path`` relative to the checkout when inside it (a table names no machine's folders)."""
    path = Path(path).resolve()
    return os.path.relpath(path, REPO) if path.is_relative_to(REPO) else str(path)


def one_run_command(study, seeds, flags, args):
    """The table's command for one run of it: the study, the options that change a score (``flags``)
    and where the table's runs read and write when not at the defaults (``--data``, ``--results-dir``),
    shell-quoted, so that it runs as printed (a path with a space, ``--adam-betas '(0.9, 0.98)'``)."""
    where = f" --data {shlex.quote(shown_path(args.data))}" if other_data(args) else ""
    if Path(args.results_dir).resolve() != (REPO / "results").resolve():
        where += f" --results-dir {shlex.quote(shown_path(args.results_dir))}"
    return (f"scripts/reproduce.sh {study} --seeds {seeds} --families FAMILY{where}{flags}"
            + (" -- " + shlex.join(args.fairseq_args) if args.fairseq_args else ""))


def header_lines(meta, sources):
    """The Markdown head of a study table; ``sources``: what the commits line says after the configs."""
    return [f"# {meta['title']}", "",
            f"- built: {meta['date']} from the run records in `{meta['records']}` (each names its commit, "
            "device, threads and command)",
            f"- devices: {'; '.join(meta['devices'])}",
            f"- commits: {', '.join(meta['commits'])}; configs: `{meta['configs']}`; {sources}",
            f"- one run: `{meta['command']}`", ""]


# the last line of every table this module writes: what tells a table of ours, which a rebuild replaces, from
# a file of the same name someone else put in --results-dir (tables written before it: their .json's title)
MARKER = "<!-- written by scripts/reproduce.sh from the run records; a rebuild replaces this file -->"


def foreign_table(results_dir, study, png):
    """The first of ``<study>.md``, ``.json`` and the figure ``png`` in ``results_dir`` that this module
    did not write (so a rebuild must not replace it), or None. Ours: a Markdown table with
    :data:`MARKER`, or one whose title is that of the ``.json`` table beside it (written before the
    marker); a figure only beside a table of ours."""
    md, table = results_dir / f"{study}.md", results_dir / f"{study}.json"
    title = _json_title(table)
    if md.exists():
        try:
            text = md.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return md
        if MARKER not in text and (title is None or not text.startswith(f"# {title}\n")):
            return md
    if table.exists() and title is None:
        return table
    return png if png.exists() and not md.exists() and not table.exists() else None


def _json_title(path):
    """The title of the study table ``path`` (its ``meta``), or None when it is no table of ours."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        return table["meta"]["title"] if "runs" in table and isinstance(table["meta"]["title"], str) else None
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return None


STALE_WHY = ("Their fingerprint differs from what today's configs give with this table's options: the config "
             "changed after they ran, or they were made with other options. Rerun them, or rebuild the table with "
             "their options, to bring them back.")


def write_without_runs(results_dir, experiment, title, stale, png, log):
    """Every record is stale under the default options (the configs changed after they ran):
    ``<experiment>.md`` and ``.json`` say that no run is current and list the stale ones, and the last
    table's figure ``png`` is removed, so no table of this study shows what today's configs did not give.
    The records stay."""
    lines = [f"# {title}", "", "No run record matches today's configs: no table until one does.", ""]
    write_text(results_dir / f"{experiment}.md", "\n".join(lines + stale_lines(stale, STALE_WHY) + [MARKER, ""]))
    write_text(results_dir / f"{experiment}.json", json.dumps(
        {"meta": {"title": title}, "summary": [], "runs": [],
         "stale": [f"{r['family']}-seed{r['seed']}" for r in stale]}, indent=1) + "\n")
    png.unlink(missing_ok=True)
    log(f"no current record: wrote {results_dir / (experiment + '.md')} and .json listing {len(stale)} stale")
    return results_dir / f"{experiment}.md"


def stale_lines(stale, why):
    """The section listing the stale records (never in the table); ``why`` explains them."""
    if not stale:
        return []
    return ["## Stale records (not in the table)", "", why, ""] + markdown_table(
        ["run", "fingerprint", "commit", "date"],
        [[f"{r['family']}-seed{r['seed']}", f"`{r.get('fingerprint')}`", f"`{r.get('commit')}`", f"{r.get('date')}"]
         for r in stale]) + [""]


def write_table(results_dir, experiment, markdown, payload, boot, current, stale, png, log):
    """Write ``<experiment>.md`` and ``.json`` (``payload``, then every run with its two paired tests,
    ``boot`` as the table's ``significance`` returns them, and the stale runs' names); returns the Markdown file."""
    runs = [dict(r, **{test: {k[2]: v[test] for k, v in boot.items() if k[:2] == (r["family"], r["seed"])}
                       for test in TESTS}) for r in current]
    write_text(results_dir / f"{experiment}.md", f"{markdown.rstrip()}\n\n{MARKER}\n")
    write_text(results_dir / f"{experiment}.json", json.dumps(
        dict(payload, runs=runs, stale=[f"{r['family']}-seed{r['seed']}" for r in stale]), indent=1) + "\n")
    log(f"wrote {results_dir / (experiment + '.md')}, .json and {png.name}")
    return results_dir / f"{experiment}.md"
