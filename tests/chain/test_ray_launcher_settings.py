"""``LITHI_LAUNCHER=ray`` without what it needs fails ``training_run`` in one line saying what
to set, before anything is published or submitted. The launcher itself, on a real Ray cluster,
is tests/integration/test_ray_cluster.py."""

from __future__ import annotations

import dagster as dg
import pytest

from assets import CHAIN_ASSETS
from tests.helpers.chain import FAST_TRAINING


def _failure(resources: dict) -> str:
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            CHAIN_ASSETS,
            resources=resources,
            run_config=FAST_TRAINING,
            instance=instance,
            raise_on_error=False,
        )
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == "training_run"
    return failure.step_failure_data.error.message


@pytest.mark.parametrize(
    ("ray_address", "url", "says"),
    [
        ("", "s3://bucket/exchange", "LITHI_LAUNCHER=ray needs RAY_ADDRESS"),
        ("http://127.0.0.1:1", "", "LITHI_LAUNCHER=ray needs LITHI_RAY_ARTIFACTS_URL"),
    ],
)
def test_the_ray_launcher_names_what_is_missing(
    tmp_path, labelled_samples, monkeypatch, ray_address, url, says
):
    monkeypatch.setenv("RAY_ADDRESS", ray_address)
    resources = labelled_samples.resources(
        tmp_path, "wine", world_size=2, launcher="ray", ray_artifacts_url=url
    )
    message = _failure(resources)
    assert says in message
    assert "\n" not in message.strip()  # one line, no stack of Ray's own
