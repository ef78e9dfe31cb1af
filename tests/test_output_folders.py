"""Every output folder is checked writable before the work starts (issue #72 item 6): a read-only
``--dest``/``--work`` (data-prep), ``--output`` (speed.sh profile), ``--results-dir``, a run folder or
``--output-dir FILE`` is one line and exit status 2, not a traceback after the work. One check does it
(man_recipes.paths.output_folder_problem). As root every folder is writable, so the read-only cases run
as the unprivileged user ``nobody`` (setpriv) in a folder that user can enter."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, child_env
from man_recipes.paths import output_folder_problem

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []


@pytest.fixture
def shared_tmp():
    """A folder the unprivileged user can enter, with ``ro/`` read-only for that user."""
    if AS_NOBODY and not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: no user for whom a folder is read-only")
    folder = Path(tempfile.mkdtemp(prefix="man-fairseq-ro-", dir="/tmp"))
    folder.chmod(0o777)
    (folder / "ro").mkdir()
    (folder / "ro").chmod(0o555)
    yield folder
    shutil.rmtree(folder)


def run_unprivileged(argv, cwd=REPO):
    return subprocess.run(AS_NOBODY + [sys.executable, *argv], cwd=cwd, env=child_env({"PYTHONPATH": str(REPO)}),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)


def test_the_one_check(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    assert output_folder_problem(tmp_path / "new" / "folder") is None
    assert output_folder_problem(tmp_path) is None
    assert output_folder_problem(afile) == f"{afile} is a file, not a folder"
    assert output_folder_problem(afile / "sub") == f"{afile} is a file, not a folder"


def test_the_one_check_finds_a_read_only_folder(shared_tmp):
    code = ("from man_recipes.paths import output_folder_problem as p; import sys; "
            "print(p(sys.argv[1])); print(p(sys.argv[1] + '/new'))")
    proc = run_unprivileged(["-c", code, str(shared_tmp / "ro")])
    assert proc.stdout.splitlines() == [f"{shared_tmp / 'ro'} is not writable"] * 2, proc.stderr[-2000:]


def test_data_prep_refuses_a_read_only_dest_before_any_step(shared_tmp):
    source = shared_tmp / "from"
    source.mkdir(mode=0o777)
    source.chmod(0o777)
    work = shared_tmp / "work"
    proc = run_unprivileged(["-m", "man_recipes.data.multi30k", "--from", str(source),
                             "--dest", str(shared_tmp / "ro" / "dest"), "--work", str(work)])
    assert proc.returncode == 2
    assert proc.stderr == (f"ERROR: --dest {shared_tmp / 'ro' / 'dest'}: {shared_tmp / 'ro'} is not writable; "
                           "nothing was prepared\n")
    assert not work.exists()  # the first step never ran


def test_data_prep_refuses_a_work_folder_beneath_a_file(tmp_path, capsys):
    from man_recipes.data import prepare

    afile = tmp_path / "file"
    afile.write_text("x")
    (tmp_path / "from").mkdir()
    assert prepare.main(["gigaword", "--from", str(tmp_path / "from"), "--dest", str(tmp_path / "dest"),
                         "--work", str(afile / "work")]) == 2
    assert capsys.readouterr().err == f"ERROR: --work {afile / 'work'}: {afile} is a file, not a folder; nothing was prepared\n"
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("command", ["attention_locality", "diffwin_windows", "export_calibration"])
def test_analysis_output_dir_that_is_a_file_is_refused_before_loading(tmp_path, monkeypatch, command):
    import importlib

    cli = importlib.import_module(f"man_recipes.cli.{command}")
    afile = tmp_path / "locality.md"
    afile.write_text("mine\n")

    def work(args):
        raise AssertionError("the checkpoints were loaded before the output folder was checked")

    monkeypatch.setattr(cli, "main", work)
    with pytest.raises(SystemExit) as e:
        cli.cli_main([str(tmp_path), "--path", str(tmp_path / "x.pt"), "--output-dir", str(afile)])
    assert str(e.value.code) == f"--output-dir {afile}: {afile} is a file, not a folder"
    assert afile.read_text() == "mine\n"


def test_speed_profile_refuses_an_output_it_cannot_write_before_profiling(tmp_path, capsys):
    from lab.speed import profile

    data = tmp_path / "data"
    data.mkdir()
    (data / "dict.txt").write_text("a 1\n")
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(SystemExit) as e:
        profile.parse(["gigaword-cpu", "--data", str(data), "--output", str(afile / "profile.md")], "scripts/speed.sh profile")
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"scripts/speed.sh profile: error: --output {afile / 'profile.md'}: {afile} is a file, not a folder")


def test_reproduce_refuses_a_read_only_results_dir_before_training(shared_tmp):
    proc = run_unprivileged(["-m", "man_recipes.studies.reproduce", "multi30k", "--data", str(shared_tmp),
                             "--runs-dir", str(shared_tmp / "runs"), "--results-dir", str(shared_tmp / "ro" / "results")])
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (f"scripts/reproduce.sh: error: --results-dir {shared_tmp / 'ro' / 'results'}: "
                                            f"{shared_tmp / 'ro'} is not writable")
    assert not (shared_tmp / "runs").exists()


def test_evaluate_refuses_a_read_only_run_folder_before_decoding(shared_tmp):
    run = shared_tmp / "ro"
    os.chmod(run, 0o755)
    (run / "config.yaml").write_text("name: x\n")
    os.chmod(run, 0o555)
    proc = run_unprivileged(["-m", "man_recipes.evaluation.evaluate", str(run), "--cpu"])
    assert proc.returncode == 2
    assert proc.stderr == f"ERROR: {run}: {run} is not writable; nothing was evaluated\n"


def test_demo_refuses_an_out_folder_beneath_a_file(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import demo

    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(SystemExit) as e:
        demo.main(["--out", str(afile / "out")])
    assert str(e.value.code) == f"demo: {afile / 'out'}: {afile} is a file, not a folder"
