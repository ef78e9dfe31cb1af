"""``fairseq-train`` that stops before the end of an epoch no longer dies at exit.

A run ended by ``--max-update`` or ``--stop-time-hours`` could die with ``terminate called without an
active exception`` (SIGABRT, exit status -6) after its last checkpoint was written. fairseq collates
the next batches in a daemon thread (``iterators.BackgroundConsumer``); when the interpreter shuts
down while that thread is inside a torch operator that released the GIL, Python < 3.14 ends the
thread with ``pthread_exit`` as it takes the GIL back, and the unwinding through pybind11's GIL guard
calls ``std::terminate``. At exit those threads are now told to stop after the batch in hand and are
waited for (their queues drained so that none waits to put), before the interpreter shuts down.
"""

import atexit
import queue
import threading
import time
import weakref

from fairseq.data import iterators

from .install import install

_exiting = threading.Event()
_consumers = weakref.WeakSet()
CONSUMER_STOP_SECONDS = 60  # one batch in hand; a stuck source keeps fairseq's own behaviour after this


def _until_exit(source):
    for item in source:
        if _exiting.is_set():
            return
        yield item


def stopping_at_exit(fork_init):
    def __init__(self, queue_, source, max_len, cuda_device):
        fork_init(self, queue_, _until_exit(source), max_len, cuda_device)
        _consumers.add(self)

    return __init__


def stop_background_consumers(timeout=CONSUMER_STOP_SECONDS):
    """Stop fairseq's batch-collating threads before the interpreter shuts down."""
    _exiting.set()
    deadline = time.monotonic() + timeout
    for consumer in list(_consumers):
        while consumer.is_alive() and time.monotonic() < deadline:
            try:
                while True:  # room in its queue, so that a thread waiting to put goes on and sees the flag
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.05)


def apply():
    if install(iterators.BackgroundConsumer, "__init__", stopping_at_exit):
        atexit.register(stop_background_consumers)
