"""Processes that die with the process that started them, and the launch wrapper that ties them.

    python -m pipeline.tethered PARENT_PID -- COMMAND [ARG ...]

A process whose parent is SIGKILLed runs no cleanup code, and nothing tells it. Linux's
parent-death signal (``prctl(PR_SET_PDEATHSIG)``) has the kernel kill such a process the moment
its parent ends. The training step launches ``torchrun`` through this module: the signal is
armed, then the command replaces this process (the signal survives ``exec``), so a step killed
by SIGKILL, alone or with its process group, takes ``torchrun`` with it, and ``torchrun``'s
ranks (each armed the same way in :mod:`pipeline.defs.train_launch`) and their DataLoader
workers (:mod:`pipeline.readers.lifetime`) follow.

Standard library only: every launch pays this module's start-up before the command's own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


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


def tethered(command: list[str]) -> list[str]:
    """``command`` run so that it dies with this process."""
    return [sys.executable, "-m", "pipeline.tethered", str(os.getpid()), "--", *command]


def main(argv: list[str] | None = None) -> int:
    """Arm the signal (or end at once if the parent is already gone), then exec the command."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m pipeline.tethered PARENT_PID -- COMMAND [ARG ...]")
        return 2
    die_with_parent(int(args[0]))
    os.execvp(args[2], args[2:])


if __name__ == "__main__":
    raise SystemExit(main())
