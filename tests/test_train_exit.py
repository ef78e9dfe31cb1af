"""fairseq's batch-collating thread is stopped before the interpreter shuts down.

A ``fairseq-train`` that stops mid-epoch exited with SIGABRT ("terminate called without an active
exception") when its daemon ``BackgroundConsumer`` was inside a torch operator at shutdown (see
:mod:`man_fairseq.patches.exit_threads`). The abort itself depends on timing; what the
fix guarantees does not: no consumer thread is alive once the interpreter's exit handlers have
run. Each script below registers its check before fairseq (and the plugin) are imported, so the
check runs after every other exit handler, the plugin's included.
"""

import subprocess
import sys

from conftest import REPO, TINY_MODEL, USER_DIR, child_env, run_bounded

CHECK_AT_EXIT = """
import atexit, sys, threading
def report():
    alive = [t for t in threading.enumerate() if type(t).__name__ == "BackgroundConsumer" and t.is_alive()]
    print(f"consumers alive at exit: {len(alive)}", flush=True)
atexit.register(report)
sys.path.insert(0, REPO)
"""

BUFFERED = """
import time
from fairseq.data.iterators import BufferedIterator
if PLUGIN:
    import man_fairseq
class Source:
    def __len__(self):
        return 1000
    def __iter__(self):
        for i in range(1000):
            time.sleep(DELAY)  # a batch being collated
            yield i
items = BufferedIterator(2, Source())
assert next(items) == 0
time.sleep(0.3)
print("main thread done", flush=True)
"""


def run_script(body, **values):
    code = "".join(f"{k} = {v!r}\n" for k, v in {"REPO": str(REPO), **values}.items()) + CHECK_AT_EXIT + body
    return run_bounded([sys.executable, "-c", code], 300, env=child_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)


def test_a_consumer_busy_collating_is_stopped_at_exit():
    proc = run_script(BUFFERED, PLUGIN=True, DELAY=0.2)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines()[-2:] == ["main thread done", "consumers alive at exit: 0"]


def test_a_consumer_waiting_on_its_full_queue_is_stopped_at_exit():
    proc = run_script(BUFFERED, PLUGIN=True, DELAY=0.0)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines()[-2:] == ["main thread done", "consumers alive at exit: 0"]


def test_without_the_plugin_both_consumers_outlive_the_exit_handlers():
    """What the two tests above guard against (fairseq alone), so that they can fail."""
    for delay in (0.2, 0.0):
        proc = run_script(BUFFERED, PLUGIN=False, DELAY=delay)
        assert proc.stdout.splitlines()[-1] == "consumers alive at exit: 1", proc.stdout


def test_fairseq_train_stopping_mid_epoch_leaves_no_consumer(toy_data_bin, tmp_path):
    """The real fairseq-train with --user-dir, one update of an epoch of many batches."""
    argv = ["fairseq-train", str(toy_data_bin), "--user-dir", USER_DIR, "--arch", "transformer", *TINY_MODEL,
            "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "100", "--max-update", "1", "--num-workers", "0",
            "--cpu", "--seed", "1", "--disable-validation", "--save-dir", str(tmp_path / "ckpt")]
    body = f"sys.argv = {argv!r}\nfrom fairseq_cli.train import cli_main\ncli_main()\n"
    proc = run_script(body)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "Stopping training due to num_updates: 1 >= max_update: 1" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "consumers alive at exit: 0", proc.stdout[-3000:]
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").is_file()
