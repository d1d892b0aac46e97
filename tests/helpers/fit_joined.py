"""``tests.helpers.fit_once`` under torchrun, recording which ranks ran an epoch under ``Join``.

``python -m tests.helpers.fit_joined ...`` takes fit_once's arguments; a rank that enters
``Join`` touches ``rank-N`` in the folder ``$JOIN_MARKS``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch.distributed.algorithms as algorithms

from tests.helpers import fit_once


class _Recorded(algorithms.Join):
    def __enter__(self) -> None:
        Path(os.environ["JOIN_MARKS"], f"rank-{os.environ['RANK']}").touch()
        super().__enter__()


if __name__ == "__main__":
    algorithms.Join = _Recorded  # type: ignore[misc]  # the fit looks it up when an epoch starts
    fit_once.main(*sys.argv[1:])
