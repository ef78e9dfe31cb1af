"""``man-files2rouge``: files2rouge's command line on ROUGE-1.5.5, with no separate install.

Same arguments, defaults and output lines as ``files2rouge`` (github.com/pltrdy/files2rouge)::

    man-files2rouge REFERENCE SUMMARY [-n 2] [-nol] [-a ARGS] [-s FILE [--overwrite]] [-e EOS] [-nm] [-ir] [-is]

ROUGE-1.5.5 treats REFERENCE as its model summaries and SUMMARY as the system's. Summary-level
ROUGE-L is not symmetric: the MAN authors and fairseq's BART README pass the hypotheses first
(``files2rouge HYPOTHESES REFERENCES``); docs/summarization-scoring.md gives the difference.
By default WordNet's exception database is files2rouge's (empty, so irregular forms such as
"went" are not stemmed to "go"), and the scores are files2rouge's to the last digit;
``--exception-db wordnet`` uses its 5,930 entries instead (docs/summarization-scoring.md). One
difference: an error (files of unequal line counts, a file that is not UTF-8, options ROUGE
rejects, an unusable ``-s`` path, checked before ROUGE runs) is one ``ERROR: ...`` line on stderr
with exit status 2, not a traceback; ``-s`` writes a new file (``--overwrite`` replaces an existing
one); an empty ``-e`` (files2rouge: every token a sentence, ROUGE-L = ROUGE-1) is refused.
"""

import argparse
import io
import os
import sys
import time
from pathlib import Path

from man_recipes.logging_setup import quiet_logging
from man_recipes import rouge155, textfile
from man_recipes.options import resamples
from man_recipes.interrupt import one_line_on_ctrl_c


def read_lines(path):
    """The lines of ``path`` as files2rouge reads them (universal newlines, each line stripped
    later), through the project's one text reader: a file that is not UTF-8 is an error naming it
    and its first bad line, not a UnicodeDecodeError."""
    return list(io.StringIO(textfile.read_text(path), newline=None))


# -n's ceiling: ROUGE-1 .. ROUGE-9 (the literature reports up to ROUGE-4); ROUGE-1.5.5 counts every
# n-gram of every n up to N in every document, so -n 1000000 ran for hours.
MAX_N = 9


def n_gram_size(text):
    """``-n``: ROUGE-1 .. ROUGE-N; 0 leaves ROUGE-N out (ROUGE-L only). ROUGE-1.5.5 itself takes a
    negative N silently, as 0."""
    n = int(text)
    if n < 0 or n > MAX_N:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be >= 0 and <= {MAX_N} "
                                         "(0: no ROUGE-N, ROUGE-L only)")
    return n


def check_rouge_args(text):
    """``-a``'s ``-n`` and ``-r`` (ROUGE-1.5.5's bootstrap resamples) within the same ceilings as the
    command's own options, before ROUGE runs (``-r 10^12`` would run for days), read as ROUGE-1.5.5
    reads them (:func:`~man_recipes.rouge155.getopts`: ``-n1000000``, the value glued, is ``-n``)."""
    given = rouge155.getopts(text.split())
    for flag, parse in (("-n", n_gram_size), ("-r", resamples("-r"))):
        value = given.get(flag[1])
        if isinstance(value, str):
            try:
                parse(value)
            except (argparse.ArgumentTypeError, ValueError) as e:
                raise ValueError(f"-a {text!r}: ROUGE's {flag} {value}: "
                                 + (str(e).split(": ", 1)[-1] if isinstance(e, argparse.ArgumentTypeError)
                                    else "not an integer")) from None


def build_parser():
    p = argparse.ArgumentParser(prog="man-files2rouge",
                                description="Calculating ROUGE score between two files (line-by-line)")
    p.add_argument("reference", help="Path of references file")
    p.add_argument("summary", help="Path of summary file")
    p.add_argument("-v", "--verbose", action="store_true", help="Prints the ROUGE command")
    p.add_argument("-n", "--rouge_n", type=n_gram_size, default=rouge155.FILES2ROUGE_DEFAULT_N,
                   help="Maximum n_gram size to consider")
    p.add_argument("-nol", "--no_rouge_l", action="store_true", help="Do not calculate ROUGE-L")
    p.add_argument("-a", "--args", help="ROUGE Arguments (replace '-c 95 -r 1000 -n 2 -a')")
    p.add_argument("-s", "--saveto", dest="saveto", help="File to save scores (a new file; see --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="let -s replace an existing file")
    p.add_argument("-e", "--eos", dest="eos", default=".",
                   help='End of sentence separator (for multisentence). Default: "."')
    p.add_argument("-m", "--stemming", action="store_true", help="DEPRECATED: stemming is now default behavior")
    p.add_argument("-nm", "--no_stemming", action="store_true", help="Switch off stemming")
    p.add_argument("--exception-db", choices=sorted(rouge155.EXCEPTION_DBS), default=rouge155.DEFAULT_EXCEPTION_DB,
                   help="WordNet exception database of ROUGE's stemmer: files2rouge (default; empty, as files2rouge "
                        "ships it, so the scores are files2rouge's) or wordnet (its 5,930 irregular forms: went -> go)")
    p.add_argument("-ir", "--ignore_empty_reference", action="store_true")
    p.add_argument("-is", "--ignore_empty_summary", action="store_true")
    return p


def check_saveto(path, inputs, overwrite=False):
    """Refuse an ``-s`` path the scores cannot be written to, before ROUGE runs (minutes on a
    large test set): a folder, a missing or read-only folder, one of the input files, or an
    existing file without ``overwrite`` (as man-average-checkpoints' --output)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"-s {path}: is a folder; name the file to save the scores in")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"-s {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"-s {path}: not writable")
    for name in inputs:
        if path.exists() and path.resolve() == Path(name).resolve():
            raise ValueError(f"-s {path}: is an input file; it would be replaced by the scores")
    if os.path.lexists(path) and not overwrite:
        raise ValueError(f"-s {path}: exists; pass --overwrite to replace it, or choose a new file")


@one_line_on_ctrl_c("man-files2rouge")
def main(argv=None):
    quiet_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rouge_n == 0 and args.no_rouge_l:
        parser.error("-n 0 with -nol leaves nothing to score")
    if not args.eos.strip() or len(args.eos.split()) != 1 or args.eos != args.eos.strip():
        # "" would end a sentence after every token (ROUGE-L = ROUGE-1), a space none
        parser.error(f"-e/--eos {args.eos!r}: the end-of-sentence token must be one token without spaces, "
                     "such as '.' (the default)")
    if args.stemming:
        parser.error("files2rouge uses stemming by default so --stemming is deprecated. "
                     "You can turn it off with -nm/--no_stemming")
    start = time.time()
    line_open = []  # "Preparing documents..." printed and its line not ended yet

    def prepared(ignored):
        line_open.clear()
        print("%d line(s) ignored\nRunning ROUGE..." % len(ignored), flush=True)

    try:
        if args.args is not None:
            check_rouge_args(args.args)
        if args.saveto:
            check_saveto(args.saveto, (args.reference, args.summary), args.overwrite)
        refs, summaries = read_lines(args.reference), read_lines(args.summary)
        print("Preparing documents...", end=" ", flush=True)
        line_open.append(True)
        output, ignored = rouge155.run(
            refs, summaries, eos=args.eos, stemming=not args.no_stemming, rouge_args=args.args,
            rouge_n=args.rouge_n, no_rouge_l=args.no_rouge_l,
            ignore_empty_reference=args.ignore_empty_reference, ignore_empty_summary=args.ignore_empty_summary,
            on_prepared=prepared, verbose=args.verbose, exception_db=args.exception_db,
            names=(f"REFERENCE {args.reference}", f"SUMMARY {args.summary}"))
        print(output)
        if args.saveto:
            with open(args.saveto, "w") as f:
                print(output, file=f)
    except (OSError, ValueError, rouge155.Rouge155Unavailable, rouge155.Rouge155Failed) as e:
        if line_open:
            print(flush=True)  # ends the "Preparing documents..." line
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    print("Elapsed time: %.3f seconds" % (time.time() - start))
    return 0


cli_main = main  # the console script, which exits with main's status


if __name__ == "__main__":
    sys.exit(cli_main())
