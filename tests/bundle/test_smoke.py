"""Stage a small table and verify it: the contract's happy path."""

import pyarrow as pa

from pipeline.bundle.stage import stage
from pipeline.bundle.verify import verify


def test_stage_then_verify_round_trip(tmp_path):
    table = pa.table({"id": [f"{i:03d}" for i in range(10)], "x": list(range(10))})
    staged = stage(table, tmp_path / "b", id_field="id", kind="input", rows_per_part=3)
    again = verify(tmp_path / "b")
    assert again.identity == staged.identity
    assert [p.rows for p in again.manifest.parts] == [3, 3, 3, 1]
