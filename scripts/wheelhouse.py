#!/usr/bin/env python3
"""Offline install for machines without a package registry (GPU nodes with their own torch).

``build`` (run where pip reaches PyPI, see ``make wheelhouse``) fills a folder with wheels of every
requirement beside torch for a chosen Python version, the fairseq fork's sdist (it is compiled on
the node, against the node's torch) and a source archive of this checkout. ``install`` (``make
install-offline``) installs from that folder only (``pip --no-index``) into a venv that sees the
torch already installed, and fails with one line where that cannot work. Standard library only:
``install`` runs with the node's bare Python.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MANIFEST = "wheelhouse.json"
# pip/setuptools/wheel for the venv; setuptools, wheel, cython and numpy are also what the fairseq
# fork's pyproject.toml asks to build with (its torch>=1.10 is the node's own); requirements.txt
# has cython and numpy.
TOOLS = ["pip", "setuptools", "wheel"]
# Wheels that must never land in the wheelhouse: the node's torch is used as it is.
FORBIDDEN = re.compile(r"^(torch|torchaudio|torchvision|triton|nvidia_[a-z0-9_]+)-", re.I)


class Refusal(Exception):
    """A user's mistake or a missing prerequisite: reported in one line, exit status 1."""


def requirements(path):
    """The requirement lines of a requirements file, comments and blanks dropped."""
    lines = (line.split("#", 1)[0].strip() for line in Path(path).read_text().splitlines())
    return [line for line in lines if line]


def extras(pyproject=REPO / "pyproject.toml"):
    """The requirements of the package's extras (the test tools, matplotlib): requirements.txt holds
    only the runtime dependencies, and `make test` on the node needs these too."""
    try:
        import tomllib
    except ImportError:
        raise Refusal(f"Python {sys.version_info.major}.{sys.version_info.minor}: the offline install "
                      "reads pyproject.toml with tomllib, Python >= 3.11") from None
    table = tomllib.loads(Path(pyproject).read_text())["project"]["optional-dependencies"]
    return [req for name in sorted(table) for req in table[name]]


def platform_tags(glibc, arch="x86_64"):
    """pip --platform values for a Linux with this glibc: every manylinux_2_N up to it (pip does
    not expand a single manylinux_2_N downwards), and the legacy aliases of 2_17/2_12/2_5."""
    major, minor = (int(x) for x in glibc.split("."))
    if major != 2 or minor < 17:
        raise Refusal(f"--glibc {glibc}: give a glibc of 2.17 or newer (manylinux2014)")
    tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def run(cmd, **kwargs):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], **kwargs)


def pure(wheel_name):
    """A wheel that runs on any Python 3 (its tags are py3/py2.py3-none-any)."""
    return re.search(r"-(py3|py2\.py3)-none-any\.whl$", wheel_name) is not None


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(reqs, pins_file):
    """What an online install beside the node's torch resolves today, sdists allowed: (name,
    version, is_sdist) for each package, and those versions written as a constraints file.
    Without the pins, --only-binary quietly takes the newest release that has a wheel: rouge-score
    0.0.4 instead of 0.1.2, whose releases since are sdists only. torch is resolved (its metadata
    only) for its own caps on what we carry: torch 2.11 requires setuptools<82."""
    report = Path(pins_file).with_suffix(".report.json")
    proc = run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                "--report", report, *reqs])
    if proc.returncode != 0:
        raise Refusal("resolving requirements.txt failed (pip's message is above)")
    items = json.loads(report.read_text())["install"]
    report.unlink()
    found = sorted((canonical(i["metadata"]["name"]), i["metadata"]["version"],
                    not i["download_info"]["url"].endswith(".whl")) for i in items)
    Path(pins_file).write_text("".join(f"{name}=={version}\n" for name, version, _ in found))
    return found


def download_wheels(dest, reqs, python_version, glibc, pins_file):
    """pip download --only-binary for the target Python, at the pinned versions; the wheels that
    build() made here from sdist-only releases are found in dest (--find-links)."""
    cmd = [sys.executable, "-m", "pip", "download", "--dest", dest, "--find-links", dest,
           "--constraint", pins_file, "--only-binary=:all:", "--implementation", "cp",
           "--python-version", python_version]
    for tag in platform_tags(glibc):
        cmd += ["--platform", tag]
    if run(cmd + reqs).returncode != 0:
        raise Refusal(f"pip download for Python {python_version} failed (its message is above; a package "
                      f"with compiled code and no wheel for it needs the wheelhouse built with Python "
                      f"{python_version} itself)")


def build_wheel(dest, spec, python_version):
    """Build one sdist-only requirement into dest with this Python; a compiled result is only
    usable when this Python is the target's version."""
    with tempfile.TemporaryDirectory() as tmp:
        name = re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]
        proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-binary", name,
                    "--wheel-dir", tmp, spec])
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise Refusal(f"{spec}: no wheel for Python {python_version} and building one from its sdist failed")
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if not pure(wheels[0].name) and here != python_version:
            raise Refusal(f"{spec}: only an sdist with compiled code; build the wheelhouse with Python "
                          f"{python_version} itself (PYTHON=python{python_version})")
        shutil.copy2(wheels[0], dest)


def download_fairseq(dest, spec):
    """The fork's sdist, never a wheel (its C++ extensions link against one torch build: the
    node's). pip reads its metadata with setup.py, which imports torch: no build isolation here,
    so this Python's torch is used instead of a fresh multi-GB one in a build environment."""
    before = set(Path(dest).glob("*.tar.gz"))
    proc = run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
                "--no-binary", re.split(r"[<>=!~ ]", spec, maxsplit=1)[0], "--dest", dest, spec])
    name = re.split(r"[<>=!~ ]", spec, maxsplit=1)[0].replace("-", "_")
    found = sorted(p for p in Path(dest).glob("*.tar.gz") if p.name.lower().startswith(name.lower() + "-"))
    if proc.returncode != 0 or not found:
        raise Refusal(f"{spec}: downloading its sdist failed (pip's message is above)")
    new = [p for p in found if p not in before]
    return (new or found)[-1].name


def source_archive(dest):
    """This checkout's committed tree (HEAD) as man-fairseq-<commit>.tar.gz, for a node that has
    no checkout; None outside a git checkout."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return None, None, False
    commit = head.stdout.strip()
    dirty = bool(subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    name = f"man-fairseq-{commit}.tar.gz"
    subprocess.run(git + ["archive", "--format=tar.gz", f"--prefix=man-fairseq-{commit}/",
                          "-o", str(Path(dest).resolve() / name), "HEAD"], check=True)
    return name, commit, dirty


def build(args):
    if not re.fullmatch(r"3\.\d+", args.python_version):
        raise Refusal(f"--python-version {args.python_version}: give MAJOR.MINOR, e.g. 3.12")
    platform_tags(args.glibc)
    dest = Path(args.dest)
    manifest = dest / MANIFEST
    if manifest.exists():
        old = json.loads(manifest.read_text())
        if old.get("python") != args.python_version:
            raise Refusal(f"{dest}: holds a wheelhouse for Python {old.get('python')}, not "
                          f"{args.python_version}; give another WHEELHOUSE= or remove it")
        manifest.unlink()  # rewritten only when this run succeeds
    elif dest.exists() and any(dest.iterdir()):
        raise Refusal(f"{dest}: exists, is not empty and has no {MANIFEST}; give another WHEELHOUSE=")
    dest.mkdir(parents=True, exist_ok=True)
    reqs = requirements(args.requirements) + extras() + TOOLS
    pins_file = dest / "pins.txt"
    resolved = resolve(reqs + [f"torch=={args.torch}"], pins_file)
    built = [f"{name}=={version}" for name, version, sdist in resolved if sdist and not FORBIDDEN.match(name + "-")]
    for spec in built:
        build_wheel(dest, spec, args.python_version)
    download_wheels(dest, reqs, args.python_version, args.glibc, pins_file)
    forbidden = sorted(p.name for p in dest.iterdir() if FORBIDDEN.match(p.name))
    if forbidden:
        raise Refusal(f"{dest}: a requirement pulled {forbidden[0]}; the node's own torch is to be used, "
                      "so remove what pulls it from requirements.txt")
    sdist = download_fairseq(dest, args.fairseq)
    source, commit, dirty = source_archive(dest)
    files = sorted(p for p in dest.iterdir() if p.is_file())
    info = {"python": args.python_version, "glibc": args.glibc, "arch": "x86_64", "torch": args.torch,
            "fairseq": args.fairseq, "fairseq_sdist": sdist, "built_here": built,
            "source": source, "commit": commit, "uncommitted_changes_left_out": dirty,
            "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "files": len(files), "bytes": sum(p.stat().st_size for p in files)}
    manifest.write_text(json.dumps(info, indent=1) + "\n")
    print(f"{dest}: {info['files']} files, {info['bytes'] / 2**20:.0f} MiB, for Python "
          f"{args.python_version} on glibc >= {args.glibc} (built here from sdists: {', '.join(built) or 'none'})")
    if dirty:
        print(f"note: {source} holds commit {commit}; uncommitted changes are not in it")
    return 0


# ---- install (on the node) -----------------------------------------------------------------

def probe(python, code):
    """Run code with that Python; (returncode, stdout)."""
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return proc.returncode, proc.stdout.strip()


NODE_FACTS = """import importlib.util, json, os, platform, sys, sysconfig
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], "libc": platform.libc_ver(),
                  "header": os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
                  "fairseq": importlib.util.find_spec("fairseq") is not None}))"""


# The torch version, and its own requirements as constraints (name and version range only: pip
# takes no extras or markers there), so that the install does not replace what torch needs:
# torch 2.11 requires setuptools<82. pip's vendored packaging evaluates the markers.
# A torch without pip metadata (conda, a source build) or a Python without pip: no such caps.
TORCH_FACTS = """import importlib.metadata, json, torch
reqs = []
try:
    from pip._vendor.packaging.requirements import Requirement
    for line in importlib.metadata.requires("torch") or []:
        req = Requirement(line)
        if req.specifier and (req.marker is None or req.marker.evaluate({"extra": ""})):
            reqs.append(req.name + str(req.specifier))
except (ImportError, importlib.metadata.PackageNotFoundError):
    pass
print(json.dumps([torch.__version__, reqs]))"""


def check_node(python, info):
    """Everything the install needs from the node, checked before anything is written (cheap
    facts first: importing torch takes seconds). Returns (torch version, fairseq to build)."""
    rc, out = probe(python, NODE_FACTS)
    if rc != 0:
        raise Refusal(f"{python}: does not run")
    facts = json.loads(out)
    if facts["python"] != info["python"]:
        raise Refusal(f"{python} is Python {facts['python']} but the wheelhouse is for Python {info['python']}: "
                      f"make one with WHEELHOUSE_PYTHON={facts['python']}")
    name, version = facts["libc"]
    if name == "glibc" and tuple(map(int, version.split(".")[:2])) < tuple(map(int, info["glibc"].split("."))):
        raise Refusal(f"this machine has glibc {version} but the wheelhouse is for glibc >= {info['glibc']}: "
                      f"make one with WHEELHOUSE_GLIBC={version}")
    rc, torch_version = probe(python, TORCH_FACTS)
    if rc != 0:
        raise Refusal(f"{python} cannot import torch: the offline install uses the torch already "
                      "installed and fetches none; install it first, or give PYTHON= (or VENV=) one that has it")
    need_build = not facts["fairseq"]
    if need_build and not facts["header"]:
        raise Refusal(f"{python}: no Python.h, which building {info['fairseq']} needs "
                      f"(Debian/Ubuntu: apt-get install python{info['python']}-dev)")
    if need_build and not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")):
        raise Refusal(f"no C++ compiler (c++, g++ or $CXX), which building {info['fairseq']} needs")
    return json.loads(torch_version), need_build


def pip_install(python, wheelhouse, constraints, *args):
    """pip install from the wheelhouse only: --no-index, the node's torch pinned by a constraint."""
    cmd = [python, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse,
           "--constraint", constraints, *args]
    if run(cmd).returncode != 0:
        raise Refusal("pip install from the wheelhouse failed (its message is above)")


def install(args):
    wheelhouse = Path(args.wheelhouse).resolve()
    if not (wheelhouse / MANIFEST).is_file():
        raise Refusal(f"{args.wheelhouse}: no {MANIFEST}; make the wheelhouse with `make wheelhouse` "
                      "on a machine that reaches PyPI, then copy it here")
    info = json.loads((wheelhouse / MANIFEST).read_text())
    if not (wheelhouse / info["fairseq_sdist"]).is_file():
        raise Refusal(f"{args.wheelhouse}: {info['fairseq_sdist']} is missing (copied only in part?)")
    if info["fairseq"] != args.fairseq:
        raise Refusal(f"{args.wheelhouse}: carries {info['fairseq']}, not {args.fairseq}")
    extra_reqs = extras()
    venv = Path(args.venv)
    venv_python = venv / "bin" / "python"
    created = not venv_python.exists()
    python = venv_python if not created else Path(args.python)
    (torch_version, torch_reqs), need_build = check_node(python, info)
    if info.get("torch") and torch_version.split("+")[0] != info["torch"]:
        print(f"note: the wheelhouse was made for torch {info['torch']}, this is torch {torch_version}; should "
              f"pip find no version this torch allows, make it with WHEELHOUSE_TORCH={torch_version.split('+')[0]}")
    if created:
        # --system-site-packages: the venv sees the node's torch (and installs nothing over it).
        if run([args.python, "-m", "venv", "--system-site-packages", venv]).returncode != 0:
            raise Refusal(f"{args.python} -m venv {venv} failed (its message is above)")
        if probe(venv_python, "import torch")[0] != 0:
            shutil.rmtree(venv)
            raise Refusal(f"{args.python}'s torch is not visible from a venv made with --system-site-packages "
                          "(is that Python itself a venv?): give VENV= the environment that has torch")
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "torch.txt"
        constraints.write_text("".join(f"{line}\n" for line in [f"torch=={torch_version}", *torch_reqs]))
        pip_install(venv_python, wheelhouse, constraints, "--upgrade", *TOOLS)
        pip_install(venv_python, wheelhouse, constraints, "-r", args.requirements, *extra_reqs)
        if need_build:
            pip_install(venv_python, wheelhouse, constraints, "--no-deps", "--no-build-isolation", args.fairseq)
        pip_install(venv_python, wheelhouse, constraints, "--no-deps", "--no-build-isolation", "-e", REPO)
    rc, out = probe(venv_python, "import torch, fairseq, man_fairseq; "
                                 "print(torch.__version__, fairseq.__version__)")
    if rc != 0 or out.split()[0] != torch_version:
        raise Refusal(f"{venv}: after the install, torch, fairseq and man_fairseq do not all import "
                      f"with torch {torch_version}")
    print(f"{venv}: torch {torch_version} (the node's), fairseq {out.split()[1]}, man_fairseq from {REPO}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fill a wheelhouse folder (needs PyPI)")
    b.add_argument("--dest", default="wheelhouse")
    b.add_argument("--python-version", default="3.12", help="MAJOR.MINOR of the node's Python")
    b.add_argument("--glibc", default="2.28", help="oldest glibc the wheels must run on")
    b.add_argument("--fairseq", default="fairseq-fixed==0.12.3.1")
    b.add_argument("--torch", default="2.11.0", help="the node's torch version (whose caps the wheels must meet)")
    b.add_argument("--requirements", default=str(REPO / "requirements.txt"))
    i = sub.add_parser("install", help="install from a wheelhouse only (no network)")
    i.add_argument("--wheelhouse", default="wheelhouse")
    i.add_argument("--venv", default=".venv")
    i.add_argument("--python", default="python3", help="the Python (with torch) that makes the venv")
    i.add_argument("--fairseq", default="fairseq-fixed==0.12.3.1")
    i.add_argument("--requirements", default=str(REPO / "requirements.txt"))
    args = parser.parse_args(argv)
    try:
        return build(args) if args.command == "build" else install(args)
    except Refusal as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
