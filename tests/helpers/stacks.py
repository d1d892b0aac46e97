"""What a hung process tree was doing, for a test's failure message.

Started with ``PYTHONFAULTHANDLER=1`` in its environment, a Python process prints every
thread's traceback to its stderr when it gets SIGABRT. A test that gives up on a process tree
aborts each of its processes, children first (a parent aborted first could not report them),
so the log the test then reads ends with where each one was stuck.
"""

from __future__ import annotations

import signal

import psutil

from tests.helpers.timing import limit, wait_until

#: The environment that has a Python process dump its threads' stacks on SIGABRT.
DUMP_ON_ABORT = {"PYTHONFAULTHANDLER": "1"}


def abort_tree(pid: int) -> list[str]:
    """SIGABRT ``pid`` and every process below it, deepest first; wait until they are gone and
    return what each one was (pid and command line), for the failure message."""
    try:
        root = psutil.Process(pid)
        tree = [*reversed(root.children(recursive=True)), root]
    except psutil.NoSuchProcess:
        return []
    seen = []
    for proc in tree:
        try:
            seen.append(f"{proc.pid}: {' '.join(proc.cmdline())[:200]}")
            proc.send_signal(signal.SIGABRT)
        except psutil.NoSuchProcess:
            continue
    wait_until(
        lambda: not any(_alive(p) for p in tree),
        timeout=limit(30),
        what="the aborted processes to print their stacks and end",
    )
    return seen


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
