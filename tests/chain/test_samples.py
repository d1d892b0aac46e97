"""Sample data sets: real, deterministic, differently shaped, staged as input bundles."""

from __future__ import annotations

import pyarrow as pa

from pipeline.bundle.verify import verify
from pipeline.defs.samples import load, stage_sample


def test_digits_tables_shape_and_reference():
    digits = load("digits")
    inp, ref = digits.input, digits.reference
    assert inp.num_rows == 1797 and inp.column_names == ["image_id", "pixels"]
    assert inp.schema.field("pixels").type == pa.list_(pa.float32(), 64)
    assert inp["image_id"][42].as_py() == "digit-00042"
    assert ref.column_names == ["image_id", "pixels", "label"]
    assert ref.schema.field("label").type == pa.int64()
    assert 0.10 * 1797 <= ref.num_rows <= 0.15 * 1797
    assert set(ref["label"].to_pylist()) == set(range(10))  # every class is represented
    assert set(ref["image_id"].to_pylist()) <= set(inp["image_id"].to_pylist())
    again = load("digits")
    again_inp, again_ref = again.input, again.reference
    assert again_ref.equals(ref) and again_inp.equals(inp)  # deterministic, no seed involved
    truth = digits.truth
    labels = dict(zip(truth["image_id"].to_pylist(), truth["label"].to_pylist(), strict=True))
    assert all(
        labels[i] == y
        for i, y in zip(*ref.select(["image_id", "label"]).to_pydict().values(), strict=True)
    )


def test_wine_is_shaped_differently():
    wine = load("wine")
    inp, ref = wine.input, wine.reference
    assert inp.num_rows == 178 and inp.column_names[0] == "wine_id"
    assert inp["wine_id"][0].as_py() == "W/0001"
    assert len(inp.column_names) == 14
    assert all(inp.schema.field(n).type == pa.float64() for n in inp.column_names[1:])
    assert set(ref["label"].to_pylist()) == {0, 1, 2}


def test_stage_sample_writes_two_verified_input_bundles(tmp_path):
    inp, ref = stage_sample("wine", tmp_path, rows_per_part=50)
    assert inp.manifest.kind == ref.manifest.kind == "input"
    assert inp.manifest.item_id_field == "wine_id" and inp.manifest.counts.items == 178
    assert [p.rows for p in inp.manifest.parts] == [50, 50, 50, 28]
    assert inp.root.parent == tmp_path and inp.root.name == inp.identity.version_id
    assert verify(ref.root).identity == ref.identity
    assert "label" in ref.manifest.schema_.names and "label" not in inp.manifest.schema_.names
