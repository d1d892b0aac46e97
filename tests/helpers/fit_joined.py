"""``tests.helpers.fit_once`` under torchrun, recording the steps each rank took under ``Join``.

``python -m tests.helpers.fit_joined ...`` takes fit_once's arguments. A rank that enters an
enabled ``Join`` writes ``rank-N`` in the folder ``$JOIN_MARKS``, holding how many of its DDP
forwards ran while Join was on (DDP notifies the join context on every forward, which then
all-reduces a flag; outside Join the notice does nothing).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch.distributed.algorithms as algorithms
from torch.distributed.algorithms.join import Join

from tests.helpers import fit_once

_entered = False
_joined_steps = 0
_notify = Join.notify_join_context


class _Recorded(algorithms.Join):
    def __enter__(self) -> None:
        global _entered
        _entered = _entered or self._enable  # a disabled Join changes nothing
        super().__enter__()


def _counted(joinable):  # noqa: ANN001, ANN202
    global _joined_steps
    work = _notify(joinable)
    if work is not None:  # Join is on for this forward
        _joined_steps += 1
    return work


if __name__ == "__main__":
    algorithms.Join = _Recorded  # type: ignore[misc]  # the fit looks it up when an epoch starts
    Join.notify_join_context = staticmethod(_counted)  # type: ignore[method-assign]
    fit_once.main(*sys.argv[1:])
    if _entered:
        Path(os.environ["JOIN_MARKS"], f"rank-{os.environ['RANK']}").write_text(str(_joined_steps))
