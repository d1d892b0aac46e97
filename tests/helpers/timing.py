"""Time limits for tests: bounds on a hang, sized for a loaded 2-core machine, never measurements.

Every limit a test puts on a subprocess, a daemon or a wait goes through :func:`limit`, and so
does every ``pytest.mark.timeout`` (``tests/conftest.py`` scales them), so a slower machine or a
busier one stretches them all with one factor: ``LITHI_TEST_TIME_SCALE=3 make test``. A test
waits for a condition (:func:`wait_until`), never for a fixed time, so a generous limit costs
nothing when the machine is quick.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SCALE_VARIABLE = "LITHI_TEST_TIME_SCALE"


def _scale() -> float:
    text = os.environ.get(SCALE_VARIABLE, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 1:  # NaN fails this too
        raise ValueError(f"{SCALE_VARIABLE}={text!r}: expected a number >= 1 (a factor)")
    return value


#: How much longer than the defaults every limit is (1 unless ``LITHI_TEST_TIME_SCALE`` says).
TIME_SCALE = _scale()


def limit(seconds: float) -> float:
    """``seconds`` (a limit generous on a loaded 2-core machine) times the run's factor."""
    return seconds * TIME_SCALE


def wait_until(condition: Callable[[], T], *, timeout: float, what: str, every: float = 0.05) -> T:
    """Poll ``condition`` until it returns something true and return that; fail naming ``what``
    after ``timeout`` seconds (already scaled: pass ``limit(...)``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout:.0f} s")
        time.sleep(every)
