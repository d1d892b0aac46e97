"""Processes that die with the process that started them.

A DataLoader worker or a torchrun rank whose parent is SIGKILLed runs no cleanup code, and
nothing tells it: torch's workers poll for their parent, but one blocked writing a batch into
a pipe that nobody reads any more never polls again (it holds the pipe's lock, so its siblings
block too), and a rank in a session of its own trains on. Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``, :func:`pipeline.tethered.die_with_parent`) has the kernel kill
such a process the moment its parent ends.
"""

from __future__ import annotations

import multiprocessing
import threading

from pipeline.tethered import die_with_parent

#: Whether a process forked now would be forked from the main thread. The kernel sends the
#: signal when the *thread* that forked the child ends, so a loader iterated from a short-lived
#: thread (with persistent workers) must not tie its workers to it. Set by the reader before it
#: starts workers; read in the worker, which inherits it through fork.
forked_from_main_thread = False


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
