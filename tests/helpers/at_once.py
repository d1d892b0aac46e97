"""Several copies of one command started at once, as racing entry points would be."""

from __future__ import annotations

import subprocess

from resources.settings import REPO_ROOT
from tests.helpers.timing import limit


def run_at_once(
    argv: list[str], copies: int, *, env: dict[str, str], timeout: float
) -> list[subprocess.CompletedProcess[str]]:
    """Start ``copies`` processes of ``argv`` from the repository root before waiting for any;
    wait at most ``timeout`` seconds (scaled by the run's time factor) for each."""
    procs = [
        subprocess.Popen(
            argv, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(copies)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=limit(timeout))
        done.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
    return done
