"""The docs stand alone: every ``docs/X.md#anchor`` that the code, scripts, configs or tests cite,
and every ``[text](X.md#anchor)`` link of README.md and docs/, names a file that exists and a
heading of it that slugifies to the anchor; nothing cites the maintainers' notes kept outside the
repository (``SPEC §N``, ``SPEC.md``, ``paper-tables.md``), which a user of the repository does
not have."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ["man_fairseq", "man_recipes", "scripts", "configs", "data-prep", "tests"]
SOURCE_SUFFIXES = {".py", ".yaml", ".sh", ".md"}
THIS = Path(__file__).resolve()

CODE_CITATION = re.compile(r"\bdocs/([\w.-]+\.md)(?:#([\w-]+))?")
MD_LINK = re.compile(r"\]\(((?:docs/)?[\w.-]*?\.md|)#([^)\s]+)\)")
OUTSIDE = re.compile(r"\bSPEC\b|paper-tables\.md")
# A line naming one of these is not a citation: the two files that parse the maintainers' transcription
# of the paper tables, when it is present beside the repository, name it (tests/test_configs.py skips
# without it).
NOT_CITATIONS = {
    "man_recipes/evaluation/paper_rows.py": "paper-tables.md",
    "tests/test_configs.py": "paper-tables.md",
}


def slug(heading):
    """GitHub's anchor of a Markdown heading: lowercase, punctuation (anything but letters, digits,
    ``_``, ``-`` and spaces) removed, each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(md):
    """The anchors of a Markdown file's headings (outside fenced code), with GitHub's ``-1``,
    ``-2`` ... suffixes for repeated headings."""
    seen, out, fenced = {}, set(), False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def source_files():
    for d in SOURCE_DIRS:
        for path in sorted((REPO / d).rglob("*")):
            if path.is_file() and path.suffix in SOURCE_SUFFIXES and path.resolve() != THIS:
                yield path
    yield REPO / "Makefile"


def doc_files():
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_slug_follows_github():
    assert slug("### How the configs follow the authors".lstrip("# ")) == "how-the-configs-follow-the-authors"
    assert slug("`localness`: centres and windows (localness paper Figures 2–3)") == \
        "localness-centres-and-windows-localness-paper-figures-23"
    assert slug("What the authors' code ran") == "what-the-authors-code-ran"
    assert slug("Dynamic mask (DMAN)") == "dynamic-mask-dman"


def test_repeated_headings_get_numbered_anchors(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n")
    assert anchors(md) == {"a", "notes", "notes-1"}


def _broken(path, text, pattern, base):
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in pattern.finditer(line):
            name, anchor = m.group(1), m.group(2)
            target = (base / name) if name else path
            where = f"{path.relative_to(REPO)}:{n}"
            if not target.is_file():
                bad.append(f"{where}: {name} does not exist")
            elif anchor and anchor not in anchors(target):
                bad.append(f"{where}: {target.relative_to(REPO)} has no heading with anchor #{anchor}")
    return bad


def test_code_citations_of_docs_name_existing_files_and_headings():
    bad, cited = [], 0
    for path in source_files():
        text = path.read_text(encoding="utf-8")
        cited += len(CODE_CITATION.findall(text))
        bad += _broken(path, text, CODE_CITATION, REPO / "docs")
    assert cited, "no docs/ citation found: the scan is not looking where the citations are"
    assert not bad, "\n".join(bad)


def test_markdown_links_to_anchors_resolve():
    bad = []
    for path in doc_files():
        # a link is relative to its own file; README's links say docs/ themselves
        bad += _broken(path, path.read_text(encoding="utf-8"), MD_LINK, path.parent)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("group", ["sources", "docs"])
def test_nothing_cites_notes_outside_the_repository(group):
    files = list(source_files()) if group == "sources" else doc_files()
    bad = []
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        allowed = NOT_CITATIONS.get(rel)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            rest = line.replace(allowed, "") if allowed else line
            if OUTSIDE.search(rest):
                bad.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not bad, "cite docs/ (or the paper and its table) instead:\n" + "\n".join(bad)


def test_the_docs_index_lists_every_page_and_each_link_exists():
    """docs/README.md, the page GitHub shows for docs/, links every page there (a new page is listed
    when it is added), and every relative link of it names a file that exists."""
    index = REPO / "docs" / "README.md"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)", index.read_text(encoding="utf-8"))
    missing = [link for link in links if not (index.parent / link).is_file()]
    assert not missing, f"docs/README.md links files that do not exist: {missing}"
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert not pages - set(links), f"docs/README.md does not list: {sorted(pages - set(links))}"


ANY_LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]+))?\)")


def test_every_relative_link_of_the_guide_and_the_notebooks_resolves():
    """README.md, docs/ and the studies' notebooks (results/**/README.md): every relative link names a
    file or folder that exists, and a heading of it where the link has an anchor."""
    pages = doc_files() + sorted((REPO / "results").rglob("README.md"))
    bad = []
    for page in pages:
        fenced = False
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for m in ANY_LINK.finditer(line):
                name, anchor = m.group(1), m.group(2)
                if re.match(r"[a-z]+:", name):
                    continue
                target = (page.parent / name).resolve() if name else page
                where = f"{page.relative_to(REPO)}:{n}"
                if not target.exists():
                    bad.append(f"{where}: {name} does not exist")
                elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                    bad.append(f"{where}: {name or page.name} has no heading with anchor #{anchor}")
    assert not bad, "\n".join(bad)


def test_every_docs_page_opens_with_its_title():
    untitled = [p.name for p in (REPO / "docs").glob("*.md") if not p.read_text(encoding="utf-8").startswith("# ")]
    assert untitled == []
