"""Shared fixtures: a tiny binarized toy corpus and a runner for the real fairseq CLIs.

Tests that need the real data samples in ``../shared/data``
---------------------------------------------------------
A test declares it by taking the ``shared_data`` fixture (it returns the folder) or, when it
only *prefers* real data, by the ``@pytest.mark.shared_data`` marker (skip it yourself with
``pytest.skip(...)`` when ``SHARED_DATA`` is absent). Without the folder such a test skips with
a reason (``make test`` prints skip reasons, ``-rs``). With the folder present a skip is a
defect: when ``MAN_FAIRSEQ_REQUIRE_SHARED_DATA=1`` (``.ci/run`` sets it) and ``../shared/data``
exists, any skipped shared-data test makes the session fail. Never switch silently to synthetic
data: write a synthetic test and a separate shared-data test instead.

Tests write only under ``tmp_path``: no bytecode is written (``sys.dont_write_bytecode``, and
``PYTHONDONTWRITEBYTECODE`` for the subprocesses), and every helper takes a folder to write in.
"""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# No __pycache__ next to the sources: neither this process nor the CLIs it starts write bytecode.
sys.dont_write_bytecode = True

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # lab/ (the project's instruments) is imported from the checkout, never installed
USER_DIR = str(REPO / "man_fairseq")
SHARED_DATA = REPO.parent / "shared" / "data"

# Small model flags every CLI test can append to its own (fast on 2 CPU cores).
TINY_MODEL = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--encoder-layers", "2", "--decoder-layers", "2",
]
# Training flags for a few quick updates on the toy corpus.
TINY_TRAIN = [
    "--optimizer", "adam", "--lr", "0.003", "--lr-scheduler", "inverse_sqrt",
    "--warmup-updates", "10", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--max-tokens", "1000", "--dropout", "0.1",
    "--no-progress-bar", "--log-interval", "5", "--num-workers", "0",
    "--seed", "1", "--cpu", "--no-epoch-checkpoints",
]


def default_ctrl_c():
    """``preexec_fn`` of a child that a test interrupts with SIGINT: Ctrl-C acts as in a terminal even
    when the tests themselves run as a background job (whose children inherit SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_bounded(args, timeout, input=None, **kwargs):
    """subprocess.run in its own process group; on timeout the whole group (torchrun's workers,
    fairseq's spawned processes) is killed, not only the direct child."""
    proc = subprocess.Popen([str(a) for a in args], start_new_session=True, text=True,
                            stdin=subprocess.PIPE if input is not None else None, **kwargs)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(map(str, args))}\n{(out or '')[-6000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def child_env(env=None):
    """os.environ plus this interpreter's bin dir first on PATH, no bytecode, and ``env``."""
    full_env = dict(os.environ)
    full_env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + full_env.get("PATH", "")
    full_env.setdefault("OMP_NUM_THREADS", "2")
    full_env["PYTHONDONTWRITEBYTECODE"] = "1"
    if env:
        full_env.update(env)
    return full_env


def run_cli(args, cwd=None, timeout=900, check=True, env=None):
    """Run a console command (fairseq-train, ...) with this interpreter's bin dir first on PATH.

    On failure the assertion message carries the command's output; past ``timeout`` seconds the
    command and everything it started are killed (a hang guard, not a speed check: a 2-epoch toy
    training took over 300 s on 2 cores shared with two trainings and other tests).
    """
    proc = run_bounded(args, timeout, cwd=cwd, env=child_env(env),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if check and proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {' '.join(map(str, args))}\n{proc.stdout[-6000:]}")
    return proc


def call_entry_point(func, argv, prog="prog", merge_stderr=False):
    """Run a console command's entry point in this process, as its console script would
    (``sys.argv = [prog, *argv]; sys.exit(func())``), without the 4-6 s of torch/fairseq import a
    new interpreter pays. For tests that check a command's output and exit code and need no process
    of its own (fairseq-train/generate keep running through ``run_cli``).

    Returns a CompletedProcess: ``returncode`` is the exit code (an uncaught exception is 1 with
    its traceback on stderr, as in a subprocess); ``stdout``/``stderr`` are what was printed
    (stderr inside stdout with ``merge_stderr``, as ``run_cli`` does). Output of logging handlers
    set up before the call is not captured. sys.argv, sys.path and the root logger's level and
    handlers are restored afterwards (entry points call ``quiet_logging()``).
    """
    import contextlib
    import io
    import logging
    import traceback

    argv = [str(a) for a in argv]
    out = io.StringIO()
    err = out if merge_stderr else io.StringIO()
    root = logging.getLogger()
    saved = sys.argv, list(sys.path), root.level, list(root.handlers)
    sys.argv = [prog, *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = func()
            except SystemExit as e:
                code = e.code
            except Exception:
                traceback.print_exc()
                code = 1
            if isinstance(code, str):  # sys.exit("message"): printed, exit status 1
                print(code, file=sys.stderr)
                code = 1
    finally:
        sys.argv, sys.path[:], level, root.handlers[:] = saved
        root.setLevel(level)
    return subprocess.CompletedProcess([prog, *argv], code or 0, out.getvalue(),
                                       None if merge_stderr else err.getvalue())


def run_files2rouge(argv, capsys):
    """(exit status, stdout, stderr) of ``man-files2rouge argv`` run in this process (argparse's own
    errors are its SystemExit)."""
    from man_recipes.cli import files2rouge

    try:
        code = files2rouge.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def built_once(tmp_path_factory, name, build):
    """The folder ``name`` made by ``build(folder)`` once per test session, whatever the workers.

    pytest-xdist runs each worker as its own process, so a session fixture alone is built once per
    worker; the folder lives next to the workers' own temporary folders (``pytest-N/``, not
    ``pytest-N/popen-gwK/``) and a file lock lets the first worker build it while the others wait.
    A build that failed leaves no folder, so the next test that needs it builds it again.
    """
    import fcntl
    import shutil

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this session's base, shared by its workers only
    folder = root / f"shared-{name}"
    with open(root / f".shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not folder.is_dir():  # it appears complete or not at all (renamed when built)
            partial = root / f".shared-{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)  # only ever made here, by a build that failed
            partial.mkdir()
            build(partial)
            partial.rename(folder)
    return folder


@pytest.fixture(scope="session")
def toy_raw(tmp_path_factory):
    from man_recipes.toy_corpus import write_corpus

    return built_once(tmp_path_factory, "toy_raw",
                      lambda out: write_corpus(str(out), train=400, valid=40, test=20, max_len=10))


@pytest.fixture(scope="session")
def toy_data_bin(tmp_path_factory, toy_raw):
    """Binarized toy corpus with a joined dictionary (src -> tgt), binarized once per session."""
    return built_once(tmp_path_factory, "toy_bin", lambda out: run_cli([
        "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", toy_raw / "train", "--validpref", toy_raw / "valid", "--testpref", toy_raw / "test",
        "--destdir", out, "--joined-dictionary", "--workers", "1",
    ]))


@pytest.fixture(scope="module")
def gigaword_like_bin(toy_raw, tmp_path_factory):
    """The toy corpus as a Gigaword data folder (article -> title, joined dictionary, its record)."""
    from man_recipes.data.manifest import write_manifest

    root = tmp_path_factory.mktemp("giga")
    for split in ("train", "valid", "test"):
        for side, lang in (("src", "article"), ("tgt", "title")):
            os.symlink(toy_raw / f"{split}.{side}", root / f"{split}.{lang}")
    data = root / "bin"
    run_cli(["fairseq-preprocess", "--source-lang", "article", "--target-lang", "title", "--trainpref", root / "train",
             "--validpref", root / "valid", "--testpref", root / "test", "--destdir", data, "--joined-dictionary",
             "--workers", "1"])
    counts = {"train": 400, "valid": 40, "test": 20}
    write_manifest(data, "gigaword", "article", "title", counts, counts, {"train": None}, {"test": "toy test"})
    return data


@pytest.fixture
def shared_data():
    """The ``../shared/data`` folder; the test skips (with the reason) when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is not present (real data samples)")
    return SHARED_DATA


REQUIRE_SHARED_DATA_ENV = "MAN_FAIRSEQ_REQUIRE_SHARED_DATA"
REQUIRE_ROUGE155_ENV = "MAN_FAIRSEQ_REQUIRE_ROUGE155"


@pytest.fixture(scope="session", autouse=True)
def _rouge_data_in_tmp(tmp_path_factory):
    """ROUGE-1.5.5's data folder (built on first use) goes under the session's tmp, not ~/.cache."""
    os.environ["MAN_FAIRSEQ_ROUGE_DATA"] = str(tmp_path_factory.mktemp("rouge-data"))


@pytest.fixture
def rouge155_perl():
    """Skips (with what to install) when Perl cannot run ROUGE-1.5.5; with
    ``MAN_FAIRSEQ_REQUIRE_ROUGE155=1`` (``.ci/run`` sets it and installs Perl's XML::Parser) fails."""
    from man_recipes.rouge155 import Rouge155Unavailable, check_perl

    try:
        check_perl()
    except Rouge155Unavailable as e:
        (pytest.fail if os.environ.get(REQUIRE_ROUGE155_ENV) == "1" else pytest.skip)(str(e))
_shared_data_skips = []


def pytest_configure(config):
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # for subprocesses started directly
    config.addinivalue_line("markers", "shared_data: the test needs ../shared/data (see conftest.py)")


# The files that take longest, longest first (CPU seconds of each file, measured 2026-11-24 with
# one thread: test_multi30k 84, test_workflow 82, test_data_prep 71, test_attention_backend 67,
# test_localness 63, test_demo 60, test_analysis 55, test_recipes 50, ...; each file not listed < 16;
# test_multi30k_real 32 needs ../shared/data; test_compile, added after, 179; test_python_api, 58, and
# test_packaging, 18, on 2026-11-28).
# `make test` hands whole files to its two workers in collection order (--dist loadfile
# --no-loadscope-reorder; xdist's default order is by number of tests, which says little about
# time), so starting the long ones first lets both workers finish together instead of one
# starting a long file near the end. The other files follow in their usual order; a file missing
# here or out of date only costs time, never a result.
SLOW_FILES_FIRST = [
    "test_compile.py", "test_multi30k.py", "test_workflow.py", "test_data_prep.py", "test_attention_backend.py",
    "test_localness.py", "test_demo.py", "test_python_api.py", "test_analysis.py", "test_recipes.py",
    "test_benchmark_script.py", "test_packaging.py",
    "test_cli_man.py", "test_half_precision.py", "test_diff_window.py", "test_calibration.py", "test_hydra.py",
    "test_multi30k_real.py", "test_averaging.py", "test_attention_locality.py", "test_rouge155.py",
]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within a file kept


@pytest.fixture(autouse=True)
def _seed_every_test():
    """Every test starts from the same RNG state, whatever ran before it (order independence)."""
    torch.manual_seed(0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    needs = "shared_data" in getattr(item, "fixturenames", ()) or item.get_closest_marker("shared_data")
    if needs and report.skipped:
        # tagged on the report, which pytest-xdist sends from its workers to the controlling process
        report.user_properties.append(("shared_data_skip", True))


def pytest_runtest_logreport(report):
    if report.skipped and ("shared_data_skip", True) in report.user_properties:
        _shared_data_skips.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(REQUIRE_SHARED_DATA_ENV) == "1" and SHARED_DATA.is_dir() and _shared_data_skips:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line("")
        reporter.write_sep("=", "shared-data tests skipped", red=True)
        reporter.write_line(
            f"FAILED: {SHARED_DATA} exists but these shared-data tests skipped: "
            + ", ".join(_shared_data_skips), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def build_fairseq_model(arch, extra=(), dict_size=100, share_all=True, tmp_dir=None, criterion=False):
    """Build ``arch`` through fairseq's own parser / task / model path (as fairseq-train does).

    Returns (model, task, args), plus the criterion built by the task when ``criterion``.
    ``dict_size`` counts fairseq's 4 special symbols. The dictionaries are written to ``tmp_dir``
    (or a temporary folder removed afterwards: building reads them only once).
    """
    if tmp_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            return build_fairseq_model(arch, extra, dict_size, share_all, tmp, criterion)

    from fairseq import options, tasks
    from fairseq.data import Dictionary

    import man_fairseq  # noqa: F401  (registers the archs)

    d = Dictionary()
    for i in range(dict_size - len(d)):
        d.add_symbol(f"w{i}")
    tmp = str(tmp_dir)
    d.save(os.path.join(tmp, "dict.src.txt"))
    d.save(os.path.join(tmp, "dict.tgt.txt"))
    argv = [tmp, "--arch", arch, "-s", "src", "-t", "tgt", "--user-dir", USER_DIR, *map(str, extra)]
    if arch.startswith("transformer_calibrated") and "--criterion" not in argv:
        argv += ["--criterion", "calibrated_label_smoothed_cross_entropy"]  # the one it trains with
    if share_all:
        argv.append("--share-all-embeddings")
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    task = tasks.setup_task(args)
    model = task.build_model(args)
    if criterion:
        return model, task, args, task.build_criterion(args)
    return model, task, args


def num_params(model):
    return sum(p.numel() for p in model.parameters())
