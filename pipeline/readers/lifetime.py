"""Processes that die with the process that started them.

A DataLoader worker or a torchrun rank whose parent is SIGKILLed runs no cleanup code, and
nothing tells it: torch's workers poll for their parent, but one blocked writing a batch into
a pipe that nobody reads any more never polls again (it holds the pipe's lock, so its siblings
block too), and a rank in a session of its own trains on. Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``) has the kernel kill such a process the moment its parent ends.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1

#: Whether a process forked now would be forked from the main thread. The kernel sends the
#: signal when the *thread* that forked the child ends, so a loader iterated from a short-lived
#: thread (with persistent workers) must not tie its workers to it. Set by the reader before it
#: starts workers; read in the worker, which inherits it through fork.
forked_from_main_thread = False


def die_with_parent(parent_pid: int | None = None) -> bool:
    """Have the kernel SIGKILL this process when its parent ends; ``True`` if armed.

    ``parent_pid`` is the parent this process must still have: one that ended before the
    signal was armed (its children are then re-parented) ends this process at once. Elsewhere
    than Linux nothing is armed, and the callers' own checks (torch's watchdog) stay the guard.
    """
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent is already gone: nothing would ever read what this does
    return True


def note_fork_thread() -> None:
    """Record, before a reader starts worker processes, whether this is the main thread."""
    global forked_from_main_thread
    forked_from_main_thread = threading.current_thread() is threading.main_thread()


def tie_worker_to_parent() -> bool:
    """In a DataLoader worker: die with the process that started it, when it was started from
    that process's main thread (see :data:`forked_from_main_thread`)."""
    parent = multiprocessing.parent_process()
    if parent is None or not forked_from_main_thread:
        return False
    return die_with_parent(parent.pid)
