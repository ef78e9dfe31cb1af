"""Every command the guide quotes runs as written: the README's and docs/'s ```bash blocks and inline
commands. A command of this checkout (scripts/, data-prep/, a man-* console command, ``python -m`` of
man_recipes or lab, a make target) must exist and answer ``--help``, and every option it is quoted
with must be one its ``--help`` names; fairseq's own commands must name archs and criteria that are
registered. Options after a bare ``--`` (handed on to fairseq) are fairseq's and not checked here.
The study notebooks in results/ are dated records: their commands are left as they were run."""

import re
import shlex
import subprocess
import sys
import tomllib
from functools import lru_cache

import pytest
from conftest import REPO, child_env

PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
CONSOLE = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
OURS = ("scripts/", "data-prep/")
SPEED_MODES = {"study", "synthetic", "profile"}  # the speed command's modes: the mode picks the options


def bash_blocks(text):
    """The commands of every ```bash block, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split("  #")[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def inline_commands(text):
    """Inline code spans that are a command of ours (`scripts/evaluate.sh RUN --cpu`)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", text)
    # a command, not a file or folder named in passing: a program of ours with at least one argument
    return [s for s in spans if re.match(r"(?:[A-Z_]+=\S+ )*(?:scripts/|data-prep/|man-[a-z-]+ |python -m )\S+ ", s)
            and "*" not in s.split()[0]]


def segments(command):
    """The simple commands of a line (split at &&, ;, |), leading VAR=value and ``time`` dropped."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # an unclosed quote: a placeholder such as RUN/'s; checked by words
        words = command.split()
    out, current = [], []
    for word in words + [";"]:
        if word in ("&&", ";", "|", "||", "&"):
            while current and (re.fullmatch(r"[A-Z_]+=\S*", current[0]) or current[0] in ("time", "nohup")):
                current.pop(0)
            if current:
                out.append(current)
            current = []
        else:
            current.append(word)
    return out


def program(words):
    """(the program's argv prefix for --help, the words after it) or None when it is not ours."""
    head = words[0]
    if head.startswith(OURS):
        argv, rest = (head,), words[1:]
    elif head in CONSOLE:
        argv, rest = (head,), words[1:]
    elif (head in ("python", "python3") and len(words) > 2 and words[1] == "-m"
          and re.fullmatch(r"(man_recipes|lab)(\.\w+)*", words[2])):
        argv, rest = ("python", "-m", words[2]), words[3:]
    else:
        return None
    if argv[-1] == "man-analyze" and rest:  # its subcommand picks the options
        return argv + (rest[0],), rest[1:]
    if argv[-1] in ("scripts/speed.sh", "lab.speed"):
        mode = rest[0] if rest and rest[0] in SPEED_MODES else "study"
        return argv + (mode,), rest[1:] if rest and rest[0] == mode else rest
    return argv, rest


def quoted():
    """[(page, command words)] of every command of ours in the guide."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for command in bash_blocks(text) + inline_commands(text):
            for words in segments(command):
                out.append((page.relative_to(REPO).as_posix(), words))
    return out


QUOTED = quoted()


@lru_cache(maxsize=None)
def help_text(argv):
    if argv[0] == "python":
        cmd = [sys.executable, *argv[1:]]
    elif argv[0] in CONSOLE:
        cmd = [str(REPO / ".venv" / "bin" / argv[0]) if (REPO / ".venv" / "bin" / argv[0]).exists() else argv[0],
               *argv[1:]]
    elif argv[0].endswith(".py"):
        cmd = [sys.executable, str(REPO / argv[0]), *argv[1:]]
    else:
        cmd = [str(REPO / argv[0]), *argv[1:]]
    proc = subprocess.run([*cmd, "--help"], cwd=REPO, capture_output=True, text=True,
                          env=child_env({"PYTHON": sys.executable}), timeout=300)
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), (argv, proc.stderr[-2000:])
    return proc.stdout


def ours():
    found = {}
    for page, words in QUOTED:
        picked = program(words)
        if picked is not None:
            argv, rest = picked
            found.setdefault(argv, []).append((page, rest))
    return found


OURS_QUOTED = ours()


def test_the_guide_quotes_commands_of_every_kind():
    kinds = {argv[0] if argv[0] != "python" else "python -m" for argv in OURS_QUOTED}
    assert {"scripts/reproduce.sh", "scripts/train.sh", "scripts/evaluate.sh", "python -m", "man-analyze"} <= kinds


@pytest.mark.parametrize("argv", sorted(OURS_QUOTED), ids=lambda argv: " ".join(argv))
def test_each_quoted_command_answers_help_and_takes_its_options(argv):
    text = help_text(argv)
    unknown = set()
    for page, rest in OURS_QUOTED[argv]:
        before = rest[: rest.index("--")] if "--" in rest else rest
        for word in before:
            option = word.split("=", 1)[0]
            if re.fullmatch(r"--[a-z][a-z0-9-]*", option) and not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])",
                                                                          text):
                unknown.add(f"{page}: {option}")
    assert sorted(unknown) == []


def make_targets():
    return set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), flags=re.M))


def test_each_quoted_make_target_exists():
    targets = make_targets()
    quoted_targets = {(page, w) for page, words in QUOTED if words[0] == "make"
                      for w in words[1:] if not w.startswith("-") and "=" not in w}
    assert {f"{page}: make {t}" for page, t in quoted_targets if t not in targets} == set()


def test_fairseq_commands_name_registered_archs_and_criteria():
    import man_fairseq  # noqa: F401  (registers the plugin's)
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY

    wrong = []
    for page, words in QUOTED:
        if not words[0].startswith("fairseq-"):
            continue
        for flag, registry in (("--arch", ARCH_MODEL_REGISTRY), ("--criterion", CRITERION_REGISTRY)):
            if flag in words[:-1]:
                value = words[words.index(flag) + 1]
                if value.isidentifier() and value not in registry:
                    wrong.append(f"{page}: {flag} {value}")
    assert wrong == []


def _module_files(module):
    path = module.replace(".", "/")
    return [f"{path}.py", f"{path}/__main__.py", f"{path}/__init__.py"]


@pytest.mark.skipif(subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"],
                                   capture_output=True, text=True).stdout.strip() != "false",
                    reason="needs the checkout's whole git history")
def test_the_notebooks_quote_modules_that_were_run():
    """results/'s notebooks keep their commands as they were run, so each ``python -m`` of this project
    there names a module of today's checkout or of its history (results/speed/README.md quoted
    ``man_recipes.studies.profile_update`` "as run": no such module ever existed, issue 81)."""
    quoted = {m.rstrip(".") for page in sorted((REPO / "results").rglob("*.md"))
              for m in re.findall(r"python -m ((?:man_fairseq|man_recipes|lab)\.[\w.]*\w)", page.read_text())}
    assert quoted, "no python -m quoted in results/: the pattern is stale"
    never = [m for m in sorted(quoted) if not any((REPO / f).is_file() for f in _module_files(m))
             and not subprocess.run(["git", "-C", str(REPO), "log", "--all", "-1", "--format=%h", "--",
                                     *_module_files(m)], capture_output=True, text=True).stdout.strip()]
    assert never == []
