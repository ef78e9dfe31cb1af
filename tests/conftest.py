"""Shared fixtures: a tiny binarized toy corpus and a runner for the real fairseq CLIs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
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


def run_cli(args, cwd=None, timeout=300, check=True, env=None):
    """Run a console command (fairseq-train, ...) with this interpreter's bin dir first on PATH.

    On failure the assertion message carries the command's output.
    """
    bindir = str(Path(sys.executable).parent)
    full_env = dict(os.environ)
    full_env["PATH"] = bindir + os.pathsep + full_env.get("PATH", "")
    full_env.setdefault("OMP_NUM_THREADS", "2")
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=full_env, timeout=timeout,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {' '.join(map(str, args))}\n{proc.stdout[-6000:]}")
    return proc


@pytest.fixture(scope="session")
def toy_raw(tmp_path_factory):
    from man_fairseq.toy_corpus import write_corpus

    return Path(write_corpus(str(tmp_path_factory.mktemp("toy_raw")), train=400, valid=40, test=20, max_len=10))


@pytest.fixture(scope="session")
def toy_data_bin(tmp_path_factory, toy_raw):
    """Binarized toy corpus with a joined dictionary (src -> tgt)."""
    out = tmp_path_factory.mktemp("toy_bin")
    run_cli([
        "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", toy_raw / "train", "--validpref", toy_raw / "valid", "--testpref", toy_raw / "test",
        "--destdir", out, "--joined-dictionary", "--workers", "1",
    ])
    return out


@pytest.fixture
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


def build_fairseq_model(arch, extra=(), dict_size=100, share_all=True, tmp_dir=None):
    """Build ``arch`` through fairseq's own parser / task / model path (as fairseq-train does).

    Returns (model, task, args). ``dict_size`` counts fairseq's 4 special symbols.
    """
    import tempfile

    from fairseq import options, tasks
    from fairseq.data import Dictionary

    import man_fairseq  # noqa: F401  (registers the archs)

    d = Dictionary()
    for i in range(dict_size - len(d)):
        d.add_symbol(f"w{i}")
    tmp = tmp_dir or tempfile.mkdtemp()
    d.save(os.path.join(tmp, "dict.src.txt"))
    d.save(os.path.join(tmp, "dict.tgt.txt"))
    argv = [tmp, "--arch", arch, "-s", "src", "-t", "tgt", "--user-dir", USER_DIR, *map(str, extra)]
    if share_all:
        argv.append("--share-all-embeddings")
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    task = tasks.setup_task(args)
    model = task.build_model(args)
    return model, task, args


def num_params(model):
    return sum(p.numel() for p in model.parameters())
