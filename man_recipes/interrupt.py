"""Ctrl-C in every command: one line on stderr and exit status 130 (128 + SIGINT, what a shell reports
for it), never a KeyboardInterrupt traceback, and no child process left running.

Every entry point (the console scripts, ``scripts/*.sh``, ``scripts/*.py``, ``data-prep``, the lab's
``python -m lab.*``) is wrapped in :func:`one_line_on_ctrl_c`; data-prep and ``scripts/reproduce.sh``
print their own line first (which step was interrupted, how to resume) with the same status.

Every child process a command starts (fairseq-train, fairseq-generate, fairseq-preprocess, ROUGE-1.5.5's
Perl, one of our own commands) is started by :func:`child_process` (or :func:`run_child`) in a process
group (a session) of its own: a terminal's Ctrl-C reaches the command alone, which stops the child's
whole group (:func:`stop_child`: SIGTERM, SIGKILL after a grace period) and waits for it before its one
line. So nothing the child started outlives the command, also when SIGINT reaches the command alone
(``kill -INT``), and nothing the child prints on its way out (a traceback, its own Ctrl-C line) follows
that line. A command of ours stopped so (SIGTERM: :class:`Terminated`; SIGHUP too, a closed terminal)
stops its own children and exits quietly with status 143: its parent says what happened.

Standard library only: data-prep imports it without fairseq.
"""

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM
STOP_GRACE_S = 10.0  # how long a child may take to end on SIGTERM before it is killed


class Terminated(BaseException):
    """SIGTERM in a command wrapped in :func:`one_line_on_ctrl_c` (a parent of ours stopping it, or
    ``kill``): not an Exception, so no ``except Exception`` takes it for an error, and not a
    KeyboardInterrupt, so no Ctrl-C line is printed; a :func:`child_process` block stops its child."""


_HANDLER_PID = None  # the process that installed _raise_terminated


def _raise_terminated(signum, frame):
    if os.getpid() != _HANDLER_PID:  # a forked worker (a multiprocessing Pool's) inherited the handler:
        signal.signal(signum, signal.SIG_DFL)  # it ends as it would have, without a traceback
        os.kill(os.getpid(), signum)
        return
    raise Terminated()


@contextlib.contextmanager
def terminated_as_exception():
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` where they would end the process
    (not where ignored: ``nohup``), in the main thread only (Python runs signal handlers there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _HANDLER_PID
    _HANDLER_PID = os.getpid()
    previous = {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(sig) == signal.SIG_DFL}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def interrupted_line(prog, detail=""):
    """The line a command prints for Ctrl-C: ``prog: interrupted (Ctrl-C)[; detail]``."""
    return f"{prog}: interrupted (Ctrl-C)" + (f"; {detail}" if detail else "")


def one_line_on_ctrl_c(prog, detail=""):
    """Decorate a command's ``main``: Ctrl-C (KeyboardInterrupt) anywhere in it returns
    :data:`EXIT_INTERRUPTED` after :func:`interrupted_line`; other results pass through."""

    def wrap(main):
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                with terminated_as_exception():
                    return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(interrupted_line(prog, detail), file=sys.stderr, flush=True)
                return EXIT_INTERRUPTED
            except Terminated:
                return EXIT_TERMINATED

        run.ctrl_c_is_one_line = True  # tests/test_interrupts.py checks every entry point has it
        return run

    return wrap


def stop_child(proc, grace=STOP_GRACE_S):
    """End the process group of ``proc`` (started by :func:`child_process`): SIGTERM, then SIGKILL when
    it has not ended within ``grace`` seconds; returns once ``proc`` has been waited for."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group has ended
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    proc.wait()


@contextlib.contextmanager
def child_process(cmd, **popen_kwargs):
    """``subprocess.Popen(cmd, **popen_kwargs)`` in a process group of its own, stopped
    (:func:`stop_child`) when the block ends in Ctrl-C, :class:`Terminated` or any error; the block
    waits for it on its normal way (``proc.wait()``, reading its output to the end)."""
    # a session of its own (so a process group of its own, on every Python the project supports)
    proc = subprocess.Popen([str(c) for c in cmd], start_new_session=True, **popen_kwargs)
    try:
        yield proc
    except BaseException:
        stop_child(proc)
        raise
    if proc.returncode is None:  # the block did not wait: neither may the child outlive it
        stop_child(proc)


def run_child(cmd, input=None, timeout=None, check=False, **popen_kwargs):
    """``subprocess.run`` through :func:`child_process`: the child's whole group is stopped on Ctrl-C
    and on ``timeout`` (``subprocess.TimeoutExpired``, as subprocess.run raises it)."""
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    if popen_kwargs.pop("capture_output", False):
        popen_kwargs["stdout"] = popen_kwargs["stderr"] = subprocess.PIPE
    with child_process(cmd, **popen_kwargs) as proc:
        out, err = proc.communicate(input, timeout=timeout)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        result.check_returncode()
    return result
