"""The v1 type vocabulary and its Arrow mapping: every name round-trips, nothing else is named."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.bundle import format as fmt

SCALARS = list(fmt.SCALAR_TYPES)
EVERY_TYPE = (
    SCALARS + [f"list<{t}>" for t in SCALARS] + [f"fixed_size_list<{t},4>" for t in SCALARS]
)


def test_vocabulary_is_the_documented_one():
    assert SCALARS == [
        "string", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
        "uint64", "float16", "float32", "float64", "binary", "date32", "timestamp[us,UTC]",
    ]  # fmt: skip


@pytest.mark.parametrize("name", EVERY_TYPE)
def test_every_type_round_trips(name):
    assert fmt.from_arrow(fmt.to_arrow(name)) == name


def test_specific_mappings():
    assert fmt.to_arrow("timestamp[us,UTC]") == pa.timestamp("us", tz="UTC")
    assert fmt.to_arrow("fixed_size_list<float32,64>") == pa.list_(pa.float32(), 64)
    assert fmt.to_arrow("list<timestamp[us,UTC]>") == pa.list_(pa.timestamp("us", tz="UTC"))
    assert fmt.to_arrow("fixed_size_list<timestamp[us,UTC],2>") == pa.list_(
        pa.timestamp("us", tz="UTC"), 2
    )


def test_dictionary_strings_count_as_strings():
    assert fmt.from_arrow(pa.dictionary(pa.int32(), pa.string())) == "string"


@pytest.mark.parametrize(
    "name",
    [
        "int", "str", "float", "timestamp[ns,UTC]", "timestamp[us]", "list<list<int8>>",
        "fixed_size_list<int8,0>", "fixed_size_list<int8>", "list<>", "List<int8>",
        "large_string", " string", "fixed_size_list<int8,-1>",
    ],
)  # fmt: skip
def test_unknown_names_are_rejected(name):
    with pytest.raises(fmt.UnknownType, match="v1"):
        fmt.to_arrow(name)


@pytest.mark.parametrize(
    "dtype",
    [
        pa.large_string(),
        pa.timestamp("ns", tz="UTC"),
        pa.timestamp("us"),
        pa.date64(),
        pa.decimal128(10, 2),
        pa.list_(pa.list_(pa.int8())),
        pa.struct([("a", pa.int8())]),
        pa.large_list(pa.int8()),
    ],
)
def test_arrow_types_outside_the_vocabulary_have_no_name(dtype):
    with pytest.raises(fmt.UnknownType):
        fmt.from_arrow(dtype)


def test_part_paths():
    assert fmt.part_path(0) == "parts/part-00000.parquet"
    assert fmt.part_path(123) == "parts/part-00123.parquet"
    with pytest.raises(ValueError):
        fmt.part_path(100000)
    with pytest.raises(ValueError):
        fmt.part_path(-1)


@pytest.mark.parametrize(
    ("name", "element", "width", "is_list", "is_fixed"),
    [
        ("int8", "int8", 1, False, False),
        ("timestamp[us,UTC]", "timestamp[us,UTC]", 1, False, False),
        ("list<timestamp[us,UTC]>", "timestamp[us,UTC]", None, True, False),
        ("fixed_size_list<float32,1>", "float32", 1, False, True),
        ("fixed_size_list<float32,64>", "float32", 64, False, True),
    ],
)
def test_a_type_string_is_taken_apart_once(name, element, width, is_list, is_fixed):
    from pipeline.bundle.manifest import SchemaField

    parsed = fmt.parse_type(name)
    assert (parsed.element, parsed.width, parsed.is_list, parsed.is_fixed_size_list) == (
        element,
        width,
        is_list,
        is_fixed,
    )
    f = SchemaField(name="c", type=name, nullable=True)
    assert (f.element, f.width, f.is_list, f.is_fixed_size_list) == (
        element,
        width,
        is_list,
        is_fixed,
    )


def test_numeric_and_float_types_come_from_the_vocabulary():
    assert set(fmt.NUMERIC_TYPES) == set(fmt.SCALAR_TYPES) - {"string", "binary"}
    assert set(fmt.FLOAT_TYPES) <= set(fmt.NUMERIC_TYPES)


def test_conform_decodes_orders_and_casts_safely():
    target = pa.schema([pa.field("a", pa.int32()), pa.field("s", pa.string())])
    batch = pa.RecordBatch.from_pydict(
        {"s": pa.array(["x", "y"]).dictionary_encode(), "a": pa.array([1, 2], pa.int64())}
    )
    out = fmt.conform(batch, target)
    assert out.schema == target and out.column(0).to_pylist() == [1, 2]
    too_big = pa.RecordBatch.from_pydict({"a": pa.array([2**40]), "s": pa.array(["x"])})
    with pytest.raises(fmt.CastRefused, match="column 'a': cannot store int64 values as int32"):
        fmt.conform(too_big, target)
