"""Float32 values below the smallest normal one, flushed to zero on the CPU during a fit.

Training on the CPU breeds denormals: Adam's moments of a weight whose gradient has gone to
zero, and the gradients of units that have stopped firing, decay through the denormal range
over thousands of steps. x86 and ARM cores handle each denormal operand in microcode, tens of
times slower than a normal one, so a long fit slows as it goes (docs/performance.md: at 10⁷
items the backward pass took most of the step). Flushing them (FTZ and DAZ) changes only values
smaller than 1.2e-38, which no model's outcome rests on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def flushed_denormals(on: bool = True) -> Iterator[bool]:
    """Denormals flushed to zero in this thread inside the block (``on``), off again after it.

    Yields whether the CPU could flush them (x86 with SSE3, ARM with an FPU: most; else the
    block runs unchanged). The mode is per thread and inherited by threads started inside the
    block: torch has no getter for it, and it is off unless set, so the block leaves it off.
    """
    if not on:
        yield False
        return
    flushing = torch.set_flush_denormal(True)
    try:
        yield flushing
    finally:
        if flushing:
            torch.set_flush_denormal(False)
