"""lab/gpu_session.sh stops at its first failing step (``set -euo pipefail``, issue 81), saying which, while the
steps whose failure the next one reports (the install, the fairseq build) are logged with their rc and passed.
The GPU, pip and Python are stand-ins here: the script is run up to its install check."""

import subprocess
import tarfile

import pytest

from conftest import REPO, child_env

# python3 / python: wheelhouse's extras succeed; pip, fairseq's build and the import check fail
PYTHON = """#!/bin/sh
case "$1 $2" in "-m pip"|"setup.py build_ext") exit 1;; esac
case "$1 $2" in "-c "*wheelhouse*) echo pytest; exit 0;; esac
exit 1
"""


@pytest.mark.parametrize("gpu", [True, False])
def test_the_session_stops_at_its_first_failing_step_and_logs_those_it_goes_past(gpu, tmp_path):
    stubs, wheelhouse = tmp_path / "bin", tmp_path / "wheelhouse"
    stubs.mkdir()
    (wheelhouse / "fairseq-0.12.3").mkdir(parents=True)
    with tarfile.open(wheelhouse / "fairseq_fixed-0.12.3.tar.gz", "w:gz") as tar:
        tar.add(wheelhouse / "fairseq-0.12.3", arcname="fairseq-0.12.3")
    for name, text in (("python3", PYTHON), ("python", PYTHON),
                       ("nvidia-smi", "#!/bin/sh\necho 'Stand-in GPU, 1 MiB, 0 %'\n" if gpu else "#!/bin/sh\nexit 9\n")):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    env = child_env({"OUT": str(tmp_path / "out"), "TMPDIR": str(tmp_path), "BUDGET": "120"})
    env["PATH"] = f"{stubs}:{env['PATH']}"
    proc = subprocess.run(["bash", str(REPO / "lab" / "gpu_session.sh"), str(wheelhouse)], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    log = (tmp_path / "out" / "session.log").read_text()
    assert proc.returncode != 0, log
    if gpu:  # past the failed install and build (each logged), stopped by the import check
        assert "requirements rc=1" in log and "fairseq build rc=1" in log and "the install is incomplete" in log
        assert "stopped:" not in log
    else:  # no GPU: nothing after it runs
        assert "stopped: `nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv,noheader` " \
               "failed (rc=9)" in log, log
        assert "install" not in log and proc.returncode == 9
    assert (tmp_path / "out" / "bundle.tgz").is_file()  # what it had is bundled either way
