"""The README's "Train on your own bundle" commands, run as written, on a table never seen before.

The commands are read out of the README (so the README cannot drift from what is tested) and run
with bash in a scratch directory laid out like the repository root: the user's table there, the
installed ``.venv``, ``examples/`` and the checked-in ``dagster.yaml``. ``make setup`` is the one
line not run again (the suite's own environment is that install). With two torchrun ranks, so
the example trainer's distributed code runs too (on one rank, in-process, it is
``tests/training/test_example_trainer.py``). The table is scikit-learn's breast-cancer set (569
rows, shipped inside the package) with string ids that are not numbers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.bundle.verify import verify
from pipeline.training.record import OutputRecord, read_record
from resources.settings import REPO_ROOT
from tests.helpers.timing import limit


def readme_commands() -> list[str]:
    """The shell block under "## Train on your own bundle"."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Train on your own bundle") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the README section has no sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def my_table(path: Path) -> Path:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    columns = {"id": pa.array([f"BC/{i:04d}-x" for i in range(len(d.target))])}
    columns |= {name: pa.array(d.data[:, j]) for j, name in enumerate(d.feature_names)}
    columns["label"] = pa.array(d.target.astype(np.int64))
    pq.write_table(pa.table(columns), path)
    return path


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A directory laid out like the repository root, holding the user's table."""
    for name in (".venv", "examples"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    my_table(tmp_path / "my_table.parquet")  # and no DAGSTER_HOME: the recipe makes its own
    return tmp_path


def run_readme(scratch: Path, *, world_size: int) -> subprocess.CompletedProcess[str]:
    commands = readme_commands()
    assert len(commands) <= 7 and commands[0] == "make setup"
    script = "\n".join(["set -euo pipefail", *commands[1:]])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITHI_", "DAGSTER_"))}
    env |= {"LITHI_WORLD_SIZE": str(world_size), "LITHI_NUM_WORKERS": "0"}
    return subprocess.run(
        ["bash", "-c", script],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(540),
    )


def test_the_readme_goes_from_a_parquet_file_to_a_verified_output_bundle(scratch):
    world_size = 2
    out = run_readme(scratch, world_size=world_size)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "VALID " in out.stdout  # lithi-bundle verify said so
    bundle = Path(out.stdout.split("VALID ", 1)[1].split()[0])
    output = verify(bundle)
    # The recipe set up the fresh instance itself: the project's settings, telemetry off.
    instance_yaml = yaml.safe_load((scratch / "dagster_home" / "dagster.yaml").read_text())
    assert instance_yaml["telemetry"] == {"enabled": False}
    assert instance_yaml["run_monitoring"]["enabled"] is True
    # And it ends with one line saying what came out: the bundle, its digest, the metrics.
    summary = out.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"output bundle {bundle} ({output.identity.content_sha256})"), summary
    assert "final_weighted_loss 0." in summary and "reconciled 569/569" in summary, summary
    assert output.manifest.kind == "prediction" and output.manifest.counts.items == 569

    record_path = next((scratch / "work" / "artifacts" / "output_bundle").glob("*/record.json"))
    record = read_record(record_path, OutputRecord)
    training = record.training
    assert training.trainer.path == "examples.weighted_trainer:WeightedTrainer"
    assert training.trainer.version == "1.0" and training.world_size == world_size
    assert training.features.used == ["mean radius", "mean texture", "mean smoothness"]
    assert training.reconciliation.ok and training.reconciliation.items_iterated == 569
    assert training.reconciliation.owners == world_size
    source = verify(scratch / "work" / "bundles" / "mine-v1")
    assert training.snapshot == source.identity == output.manifest.input.snapshot
    assert set(training.checkpoint.files) == {"model.pt", "scaling.json"}
    # The predictions are the user's trainer's, keyed by the user's odd string ids.
    predictions = pa.concat_tables([pq.read_table(p) for p in output.part_paths()])
    assert predictions.column_names == ["id", "probability", "prediction"]
    assert predictions.column("id")[0].as_py().startswith("BC/")
    truth = pq.read_table(scratch / "my_table.parquet", columns=["id", "label"])
    joined = predictions.join(truth, "id")
    accuracy = float(np.mean(joined["prediction"].to_numpy() == joined["label"].to_numpy()))
    print(f"\nworld {world_size}: accuracy {accuracy:.3f} over {joined.num_rows} rows")
    assert accuracy > 0.85
    # The training record the output's record embeds is the file beside the checkpoint.
    assert json.loads(Path(record.training_record).read_text()) == training.model_dump(mode="json")
