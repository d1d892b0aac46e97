"""Every vocabulary type becomes the dtype its declaration maps to, never an inferred one."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.bundle import format as fmt
from pipeline.bundle.manifest import Schema
from pipeline.bundle.stage import stage
from pipeline.readers import MapDataset, PartIterableDataset
from pipeline.readers.index import Index
from pipeline.readers.tensors import ValueOverflow, to_batch
from tests.helpers.bundles import INPUT_REF

#: Every scalar a tensor can hold (strings and binary stay Python lists).
NUMERIC = fmt.NUMERIC_TYPES


def expected_dtype(name: str) -> torch.dtype:
    """The documented rule (docs/readers.md), derived here rather than copied from the code's
    table: dates and instants are their integer storage; an unsigned type wider than 8 bits (which
    torch barely computes with) widens to the narrowest signed dtype that holds its whole range,
    ``uint64`` stopping at ``int64`` (a larger value is refused); every other type keeps the
    torch dtype of its own name."""
    arrow = fmt.to_arrow(name)
    if pa.types.is_date(arrow) or pa.types.is_timestamp(arrow):
        return {32: torch.int32, 64: torch.int64}[arrow.bit_width]
    if pa.types.is_unsigned_integer(arrow) and arrow.bit_width > 8:
        top = 2**arrow.bit_width - 1
        signed = (torch.int16, torch.int32, torch.int64)
        return next((d for d in signed if torch.iinfo(d).max >= top), torch.int64)
    return getattr(torch, name)


UTC = dt.UTC


def _table() -> pa.Table:
    cols = {"id": pa.array(["007", "010", "000"], pa.string())}
    for name in NUMERIC:
        arrow = (
            Schema.model_validate({"fields": [{"name": "c", "type": name, "nullable": True}]})
            .fields[0]
            .arrow_type
        )
        if name == "bool":
            values = [True, None, False]
        elif name == "date32":
            values = [dt.date(1970, 1, 2), None, dt.date(2000, 1, 1)]
        elif name.startswith("timestamp"):
            values = [dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), None, None]
        elif name.startswith("float"):
            values = [1.5, None, -2.0]
        else:
            values = [1, None, 3]
        cols[f"c_{name}"] = pa.array(values, arrow)
        cols[f"n_{name}"] = pa.array([v if v is not None else values[0] for v in values], arrow)
    cols["s"] = pa.array(["a", None, "00042"], pa.string())
    cols["b"] = pa.array([b"\x00\x01", b"", None], pa.binary())
    cols["fsl_f"] = pa.array([[1.0, 2.0], None, [5.0, 6.0]], pa.list_(pa.float32(), 2))
    cols["fsl_i"] = pa.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], pa.list_(pa.int16(), 3))
    cols["lst"] = pa.array([[1, 2], [], None], pa.list_(pa.int64()))
    cols["lst_f"] = pa.array([[0.5], [1.5, 2.5], [3.5]], pa.list_(pa.float64()))
    table = pa.table(cols)
    nonnull = {f"n_{k}" for k in NUMERIC} | {"fsl_i", "lst_f", "id"}
    return table.cast(
        pa.schema([pa.field(f.name, f.type, nullable=f.name not in nonnull) for f in table.schema])
    )


@pytest.fixture(scope="module")
def bundle_index(tmp_path_factory) -> Index:
    root = tmp_path_factory.mktemp("types")
    snap = stage(_table(), root / "b", id_field="id", kind="prediction", input=INPUT_REF)
    return Index.from_snapshot(snap)


@pytest.fixture(scope="module", params=["map", "iterable"])
def batch(request, bundle_index) -> dict:
    if request.param == "map":
        return MapDataset(bundle_index).__getitems__([0, 1, 2])
    return next(iter(PartIterableDataset(bundle_index, batch_size=3)))


@pytest.mark.parametrize("name", NUMERIC)
def test_scalar_types_map_to_declared_dtype(batch, bundle_index, name):
    assert bundle_index.schema.field(f"c_{name}").type == name
    assert batch[f"c_{name}"].dtype == expected_dtype(name)
    assert batch[f"n_{name}"].dtype == expected_dtype(name)
    assert batch[f"c_{name}"].shape == (3,)
    # a nullable column carries its mask whatever the data; a non-null one carries none
    assert batch[f"c_{name}__valid"].tolist() == [True, False, name not in ("timestamp[us,UTC]",)]
    assert f"n_{name}__valid" not in batch


def test_values_and_null_fills(batch):
    assert batch["c_float32"][0].item() == 1.5 and torch.isnan(batch["c_float32"][1])
    assert torch.isnan(batch["c_float16"][1]) and batch["c_float16"][2].item() == -2.0
    assert batch["c_int8"].tolist() == [1, 0, 3]
    assert batch["c_uint64"].tolist() == [1, 0, 3]
    assert batch["c_bool"].tolist() == [True, False, False]
    assert batch["c_date32"].tolist() == [1, 0, 10957]  # days since the epoch
    assert batch["c_timestamp[us,UTC]"][0].item() == 1_000_000  # microseconds


def test_strings_binary_and_ids(batch):
    assert batch["id"] == ["007", "010", "000"]
    assert batch["s"] == ["a", None, "00042"]
    assert batch["b"] == [b"\x00\x01", b"", None]


def test_fixed_size_lists_are_2d_and_lists_are_lists_of_1d(batch):
    assert batch["fsl_f"].dtype == torch.float32 and batch["fsl_f"].shape == (3, 2)
    assert batch["fsl_f"][0].tolist() == [1.0, 2.0] and batch["fsl_f"][2].tolist() == [5.0, 6.0]
    assert torch.isnan(batch["fsl_f"][1]).all()  # a null float vector is NaN, as documented
    assert batch["fsl_f__valid"].tolist() == [True, False, True]
    assert batch["fsl_i"].dtype == torch.int16 and batch["fsl_i"].shape == (3, 3)
    assert batch["fsl_i"][2].tolist() == [7, 8, 9]
    lst = batch["lst"]
    assert isinstance(lst, list) and [t.tolist() for t in lst] == [[1, 2], [], []]
    assert all(t.dtype == torch.int64 and t.dim() == 1 for t in lst)
    assert [t.tolist() for t in batch["lst_f"]] == [[0.5], [1.5, 2.5], [3.5]]


def test_uint64_above_int64_is_refused_not_wrapped():
    schema = Schema.model_validate({"fields": [{"name": "u", "type": "uint64", "nullable": False}]})
    ok = pa.table({"u": pa.array([2**63 - 1], pa.uint64())})
    assert to_batch(ok, schema)["u"].tolist() == [2**63 - 1]
    bad = pa.table({"u": pa.array([2**63], pa.uint64())})
    with pytest.raises(ValueOverflow, match="uint64"):
        to_batch(bad, schema)


def test_wide_unsigned_values_survive_widening():
    schema = Schema.model_validate(
        {
            "fields": [
                {"name": "a", "type": "uint16", "nullable": False},
                {"name": "b", "type": "uint32", "nullable": False},
            ]
        }
    )
    t = pa.table({"a": pa.array([65535], pa.uint16()), "b": pa.array([2**32 - 1], pa.uint32())})
    b = to_batch(t, schema)
    assert b["a"].tolist() == [65535] and b["b"].tolist() == [2**32 - 1]


def test_declared_type_wins_over_what_the_data_holds():
    schema = Schema.model_validate(
        {"fields": [{"name": "x", "type": "float32", "nullable": False}]}
    )
    with pytest.raises(TypeError, match="declared float32"):
        to_batch(pa.table({"x": pa.array([1.0], pa.float64())}), schema)


def test_sliced_fixed_size_list_respects_the_slice():
    schema = Schema.model_validate(
        {"fields": [{"name": "v", "type": "fixed_size_list<float32,2>", "nullable": False}]}
    )
    arr = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8, dtype=np.float32)), 2)
    b = to_batch(pa.table({"v": arr}).slice(1, 2), schema)
    assert b["v"].tolist() == [[2.0, 3.0], [4.0, 5.0]]


def test_equal_length_list_rows_stay_a_list_when_collated(tmp_path):
    """Per-row samples of a list<int32> column: a list of 1-D tensors whatever the lengths."""
    from torch.utils.data import DataLoader

    from pipeline.readers.batches import collate_batches

    table = pa.table(
        {
            "id": pa.array(["a", "b", "c", "d"], pa.string()),
            "tokens": pa.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 2]], pa.list_(pa.int32())),
            "v": pa.array([[1.0, 2.0]] * 4, pa.list_(pa.float32(), 2)),
        }
    )
    ds = MapDataset(Index.from_snapshot(stage(table, tmp_path / "b", id_field="id", kind="input")))
    equal = collate_batches([ds[0], ds[1], ds[2]])  # three rows of length 3
    assert isinstance(equal["tokens"], list) and len(equal["tokens"]) == 3
    assert [t.tolist() for t in equal["tokens"]] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert all(t.dtype == torch.int32 for t in equal["tokens"])
    assert equal["v"].shape == (3, 2)  # a fixed-size list is still stacked
    built = ds.__getitems__([0, 1, 2])
    assert type(built["tokens"]) is type(equal["tokens"])  # same form as a fetched batch
    for batch in DataLoader(ds, batch_size=2, collate_fn=collate_batches, num_workers=1):
        assert isinstance(batch["tokens"], list)  # a Row survives the trip from a worker


def test_a_wire_batch_of_a_slice_carries_only_its_own_rows():
    """What a worker sends for 100 rows of a 10,000-row chunk is about 100 rows' bytes."""
    import pickle

    from pipeline.readers.tensors import to_wire, wire_to_batch

    schema = Schema.model_validate(
        {
            "fields": [
                {"name": "s", "type": "string", "nullable": False},
                {"name": "v", "type": "fixed_size_list<float32,4>", "nullable": True},
            ]
        }
    )
    n = 10_000
    big = pa.table(
        {
            "s": pa.array([f"{i:08d}" for i in range(n)], pa.string()),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(4 * n, np.float32)), 4),
        }
    )
    batch = big.to_batches()[0]  # a record batch's columns are plain (sliceable) arrays
    whole = len(pickle.dumps(to_wire(big.slice(0, 100).combine_chunks(), schema)))
    sliced = to_wire(batch.slice(5_000, 100), schema)
    assert len(pickle.dumps(sliced)) < 2 * whole  # not the parent's 10,000 rows
    assert wire_to_batch(sliced)["s"] == [f"{i:08d}" for i in range(5_000, 5_100)]


def _string_schema(nullable: bool = True) -> Schema:
    return Schema.model_validate(
        {"fields": [{"name": "s", "type": "string", "nullable": nullable}]}
    )


def test_a_dictionary_encoded_string_column_still_yields_python_strings_and_nulls():
    plain = pa.array(["b", None, "a", "b", None, "c"], pa.string())
    table = pa.table({"s": plain.dictionary_encode()})
    batch = to_batch(table, _string_schema())
    assert batch["s"] == plain.to_pylist()
    assert all(type(x) is str for x in batch["s"] if x is not None)
    assert to_batch(table.slice(2, 3), _string_schema())["s"] == ["a", "b", None]
    assert "s__valid" not in batch  # as for a plain string column


def test_a_dictionary_of_another_value_type_is_refused():
    table = pa.table({"s": pa.array([1, 2, 1], pa.int32()).dictionary_encode()})
    with pytest.raises(TypeError, match="declared string"):
        to_batch(table, _string_schema())


def test_a_null_list_row_that_covers_values_is_an_empty_tensor():
    """Arrow lets a null ``list<T>`` row's offsets cover values in the child array (other
    writers than Parquet's make such arrays); those values are not the row's, and the rows after
    it keep their own."""
    schema = Schema.model_validate(
        {"fields": [{"name": "l", "type": "list<int64>", "nullable": True}]}
    )
    arr = pa.ListArray.from_arrays(
        pa.array([0, 2, 4, 5], pa.int32()),
        pa.array([1, 2, 3, 4, 5], pa.int64()),
        mask=pa.array([False, True, False]),
    )
    assert arr.to_pylist() == [[1, 2], None, [5]]
    batch = to_batch(pa.table({"l": arr}), schema)
    assert [t.tolist() for t in batch["l"]] == [[1, 2], [], [5]]
