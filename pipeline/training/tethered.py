"""Run a command that dies with the process that started it, whatever kills that one.

    python -m pipeline.training.tethered PARENT_PID -- COMMAND [ARG ...]

The training step launches ``torchrun`` through this: the parent-death signal is armed, then
the command replaces this process (the signal survives ``exec``), so a step killed by SIGKILL,
alone or with its process group, takes ``torchrun`` with it, and ``torchrun``'s ranks (each
armed the same way in :mod:`pipeline.defs.train_launch`) and their DataLoader workers follow.
"""

from __future__ import annotations

import os
import sys

from pipeline.readers.lifetime import die_with_parent


def tethered(command: list[str]) -> list[str]:
    """``command`` run so that it dies with this process."""
    return [sys.executable, "-m", "pipeline.training.tethered", str(os.getpid()), "--", *command]


def main(argv: list[str] | None = None) -> int:
    """Arm the signal (or end at once if the parent is already gone), then exec the command."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m pipeline.training.tethered PARENT_PID -- COMMAND [ARG ...]")
        return 2
    die_with_parent(int(args[0]))
    os.execvp(args[2], args[2:])


if __name__ == "__main__":
    raise SystemExit(main())
