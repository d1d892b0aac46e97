"""An output step SIGKILLed after it published its bundle into the cache, and before the run
recorded it, leaves nothing visible once the next run has been: the killed run is marked failed
when the instance is next opened, and the next output step retires the view nobody recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg

from pipeline.bundle import format as fmt
from pipeline.defs.instance import prepare_instance
from tests.helpers.timing import limit

ROOT = Path(__file__).resolve().parents[2]

#: The whole chain in a child, killed by SIGKILL right after the output bundle is published
#: (where the output step writes its record), as a kill at the worst moment would land.
KILLED_RUN = """
import importlib, os, signal, sys
from pathlib import Path
import dagster as dg
from assets import CHAIN_ASSETS
from tests.helpers.chain import FAST_TRAINING, chain_resources

def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

# the module, not the asset of the same name the package exports
importlib.import_module("assets.output_bundle").write_record = killed
home, job_id, compute = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
dg.materialize(
    CHAIN_ASSETS,
    resources=chain_resources(home, job_id, compute_root=compute),
    run_config=FAST_TRAINING,
    instance=dg.DagsterInstance.get(),
)
"""


def _prediction_views(cache: Path) -> list[str]:
    views = []
    for view in (cache / "bundles").iterdir():
        manifest = view / fmt.MANIFEST_NAME
        if manifest.exists() and '"kind": "prediction"' in manifest.read_text():
            views.append(view.name)
    return views


def test_a_killed_output_step_leaves_nothing_visible_after_the_next_run(tmp_path, labelled_samples):
    from assets import CHAIN_ASSETS, output_bundle

    home = prepare_instance(tmp_path / "dagster")
    job_id = labelled_samples.jobs["wine"]
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    child = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(tmp_path), job_id,
         str(labelled_samples.compute_root)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit(600),
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    cache = tmp_path / "cache"
    orphans = _prediction_views(cache)
    assert len(orphans) == 1  # published, never recorded: the state the kill left

    prepare_instance(home)  # what every entry point does first: the killed run is failed
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (killed,) = instance.get_runs()
        assert killed.status == dg.DagsterRunStatus.FAILURE
        result = dg.materialize(
            CHAIN_ASSETS,
            selection=[output_bundle],
            resources=labelled_samples.resources(tmp_path, "wine"),
            instance=instance,
        )
        assert result.success
        recorded = result.output_for_node("output_bundle").identity.version_id

    assert _prediction_views(cache) == [recorded]  # the orphan retired, the new one kept
    assert orphans[0] != recorded
    assert list((cache / "staging").iterdir()) == []  # no staged bundle left behind
    hidden = [p for p in (cache / "bundles").iterdir() if p.name.startswith(".")]
    assert hidden == []
