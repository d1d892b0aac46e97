"""The integration tier: everything under this folder starts real processes (torchrun ranks, the
Dagster daemon and webserver, Chromium, the ``dagster`` CLI, SIGKILLed children, a fresh venv).

Every test here is marked ``integration`` by its place, so nobody has to remember the marker.
``addopts`` deselects the marker (``make test-fast``, a bare ``pytest``); ``make test`` selects
everything with ``-m "integration or not integration"``; ``pytest -m integration`` runs this tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.integration)
