"""What a refusal says: every bad setting, path or value is refused in one line naming it."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def one_line_refusal(error: type[Exception], call: Callable[..., object], *args: object) -> str:
    """The message of the ``error`` that ``call(*args)`` raises, checked to be a single line."""
    with pytest.raises(error) as e:
        call(*args)
    message = str(e.value)
    assert "\n" not in message, message
    return message
