"""Every type of the v1 vocabulary, staged with its nulls, comes back through both readers in the
form docs/readers.md documents: every scalar, ``list<T>`` and ``fixed_size_list<T,N>`` of each,
nullable and not, a null row and an empty list included.

The expected batch is derived here from the documented rules and the staged Python values, never
from the readers' own tables, so a type the readers cannot turn into a batch fails here rather
than in a user's first epoch.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pyarrow as pa
import pytest
import torch

from pipeline.bundle import format as fmt
from pipeline.bundle.manifest import Schema, SchemaField
from pipeline.bundle.stage import stage
from pipeline.readers import Index, MapDataset, UnreadableType, collate_batches, make_loader
from pipeline.readers.tensors import POSITION_KEY, check_readable
from tests.readers.test_tensors import expected_dtype

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)

#: Two distinct non-null values of each scalar type, at the edges where a type has edges (the
#: extremes survive widening; a date before 1970 is a negative day count).
VALUES: dict[str, tuple[Any, Any]] = {
    "string": ("00042", "é"),
    "binary": (b"\x00\x01", b""),
    "bool": (True, False),
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (1, 2**8 - 1),
    "uint16": (1, 2**16 - 1),
    "uint32": (1, 2**32 - 1),
    "uint64": (1, 2**63 - 1),  # above 2**63-1 is refused (test_tensors)
    "float16": (1.5, -2.25),
    "float32": (1.5, -2.25),
    "float64": (0.1, -1e300),
    "date32": (dt.date(1969, 12, 31), dt.date(2000, 1, 1)),
    "timestamp[us,UTC]": (
        dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
        dt.datetime(2024, 2, 29, 12, 0, 0, 123456, tzinfo=UTC),
    ),
}
#: Element types a batch keeps as Python objects (docs/readers.md): never tensors, never masked.
PYTHON = ("string", "binary")
SIZE = 2  # of every fixed-size list
REPEAT = 3  # the four-row pattern, so the bundle has several parts and batches cut across them


def _columns(t: str) -> dict[str, tuple[str, bool, list[Any]]]:
    """The columns of scalar type ``t``: name -> (declared type, nullable, four rows)."""
    a, b = VALUES[t]
    return {
        f"s_{t}": (t, True, [a, None, b, a]),
        f"n_{t}": (t, False, [a, b, b, a]),
        f"l_{t}": (f"list<{t}>", True, [[a, b], None, [], [b, None]]),
        f"ln_{t}": (f"list<{t}>", False, [[a], [], [b, a], [a, b, a]]),
        f"f_{t}": (f"fixed_size_list<{t},{SIZE}>", True, [[a, b], None, [b, None], [a, a]]),
        f"fn_{t}": (f"fixed_size_list<{t},{SIZE}>", False, [[a, b], [b, a], [a, a], [b, b]]),
    }


COLUMNS = {name: col for t in fmt.SCALAR_TYPES for name, col in _columns(t).items()}
IDS = [f"{i:03d}" for i in range(4 * REPEAT)]


def _table() -> pa.Table:
    fields = [pa.field("item_id", pa.string(), nullable=False)]
    arrays = [pa.array(IDS, pa.string())]
    for name, (type_name, nullable, rows) in COLUMNS.items():
        fields.append(pa.field(name, fmt.to_arrow(type_name), nullable=nullable))
        arrays.append(pa.array(rows * REPEAT, fmt.to_arrow(type_name)))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


@pytest.fixture(scope="module")
def every_type(tmp_path_factory: pytest.TempPathFactory) -> Index:
    root = tmp_path_factory.mktemp("every-type")
    # 5 rows a part: 3 parts, and batches of 3 that straddle them
    snap = stage(_table(), root / "b", id_field="item_id", kind="input", rows_per_part=5)
    return Index.from_snapshot(snap)


# -- the documented form, from the staged values --------------------------------------------


def _fill(t: str) -> Any:
    """A null slot in a tensor: NaN in floats, False in bools, 0 elsewhere."""
    return math.nan if t.startswith("float") else (False if t == "bool" else 0)


def _number(v: Any, t: str) -> Any:
    """A staged scalar as the number its tensor holds."""
    if v is None:
        return _fill(t)
    if t == "date32":
        return (v - dt.date(1970, 1, 1)).days
    if t.startswith("timestamp"):
        return (v - EPOCH) // dt.timedelta(microseconds=1)
    return v


def _expected_value(type_name: str, v: Any) -> Any:
    """One row's documented batch value, in the comparable form :func:`_plain` gives a batch."""
    parsed = fmt.parse_type(type_name)
    t = parsed.element
    if t in PYTHON:
        return v  # str/bytes, lists of them, None where null: exactly as staged
    if parsed.shape == "scalar":
        return _plain(_number(v, t))
    if parsed.shape == "list":
        return [_plain(_number(x, t)) for x in v or []]  # a null list is an empty tensor
    return [_plain(_number(x, t)) for x in (v or [None] * SIZE)]  # a null vector is all fill


def _plain(v: Any) -> Any:
    """A batch value as comparable Python: tensors as lists, NaN as a marker (NaN != NaN)."""
    if isinstance(v, torch.Tensor):
        return _plain(v.tolist())
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return v


def _expected_keys() -> set[str]:
    keys = {"item_id", POSITION_KEY}
    for name, (type_name, nullable, _) in COLUMNS.items():
        keys.add(name)
        parsed = fmt.parse_type(type_name)
        if nullable and parsed.element not in PYTHON and parsed.shape != "list":
            keys.add(name + fmt.VALID_SUFFIX)
    return keys


def _check_batch_form(batch: dict[str, Any]) -> None:
    """Keys from the schema alone; tensors of the documented dtype and shape; lists as lists."""
    assert set(batch) == _expected_keys()
    n = len(batch["item_id"])
    assert batch[POSITION_KEY].dtype == torch.int64 and batch[POSITION_KEY].shape == (n,)
    for name, (type_name, _, _) in COLUMNS.items():
        parsed, value = fmt.parse_type(type_name), batch[name]
        want = None if parsed.element in PYTHON else expected_dtype(parsed.element)
        if want is None or parsed.shape == "list":
            assert isinstance(value, list) and len(value) == n, name
            if want is not None:
                assert all(x.dtype == want and x.dim() == 1 for x in value), name
            else:
                assert all(x is None or isinstance(x, (str, bytes, list)) for x in value), name
        else:
            assert isinstance(value, torch.Tensor) and value.dtype == want, name
            assert value.shape == ((n,) if parsed.shape == "scalar" else (n, SIZE)), name
        mask = batch.get(name + fmt.VALID_SUFFIX)
        if mask is not None:
            assert mask.dtype == torch.bool and mask.shape == (n,), name


def _rows(batches: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every row the batches hold, by id, each column in comparable form."""
    rows: dict[str, dict[str, Any]] = {}
    for batch in batches:
        _check_batch_form(batch)
        for i, item in enumerate(batch["item_id"]):
            assert item not in rows, f"{item} delivered twice"
            rows[item] = {
                k: _plain(v[i]) for k, v in batch.items() if k not in ("item_id", POSITION_KEY)
            }
    return rows


def _expected_row(i: int) -> dict[str, Any]:
    row: dict[str, Any] = {}
    masked = _expected_keys()
    for name, (type_name, _, values) in COLUMNS.items():
        v = values[i % 4]
        row[name] = _expected_value(type_name, v)
        if name + fmt.VALID_SUFFIX in masked:
            row[name + fmt.VALID_SUFFIX] = v is not None
    return row


# -- the tests --------------------------------------------------------------------------------


def test_the_table_covers_the_whole_vocabulary(every_type: Index) -> None:
    """A scalar added to v1 without a value here fails this test, not a user's read."""
    assert set(VALUES) == set(fmt.SCALAR_TYPES)
    declared = {f.name: (f.type, f.nullable) for f in every_type.schema.fields}
    assert declared == {"item_id": ("string", False)} | {
        name: (type_name, nullable) for name, (type_name, nullable, _) in COLUMNS.items()
    }


@pytest.mark.parametrize(
    ("style", "workers"), [("map", 0), ("iterable", 0), ("map", 1), ("iterable", 1)]
)
def test_every_type_round_trips_through_the_readers(
    every_type: Index, style: str, workers: int
) -> None:
    """Both readers, in one process and through a worker (the wire form, messages cut into
    batches in the main process): each row's every column is its documented form."""
    kw: dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
    loader = make_loader(
        every_type, style=style, batch_size=3, num_workers=workers, shuffle=False, **kw
    )
    rows = _rows(list(loader))
    assert sorted(rows) == IDS
    for i, item in enumerate(IDS):
        assert rows[item] == _expected_row(i), item


def test_null_rows_of_string_and_bytes_lists_are_none(every_type: Index) -> None:
    """The issue's reproducer, spelled out: a null list of strings or bytes is ``None``, an
    empty one ``[]``, a null element ``None`` inside its list."""
    batch = MapDataset(every_type).__getitems__([0, 1, 2, 3])
    assert batch["l_string"] == [["00042", "é"], None, [], ["é", None]]
    assert batch["l_binary"] == [[b"\x00\x01", b""], None, [], [b"", None]]
    assert batch["f_string"] == [["00042", "é"], None, ["é", None], ["00042", "00042"]]
    assert batch["fn_binary"][1] == [b"", b"\x00\x01"]


def test_rows_collate_to_the_batch_a_reader_builds(every_type: Index) -> None:
    """Per-row samples (``__getitem__``, as through ``ConcatDataset``) collate to the same batch
    ``__getitems__`` fetches, lists of strings included."""
    ds = MapDataset(every_type)
    positions = list(range(len(IDS)))
    collated = collate_batches([ds[i] for i in positions])
    fetched = ds.__getitems__(positions)
    assert set(collated) == set(fetched)
    for key in fetched:
        assert _plain(collated[key]) == _plain(fetched[key]), key
        assert type(collated[key]) is type(fetched[key]), key


def test_every_vocabulary_type_has_a_batch_form() -> None:
    """Each scalar, and each as a list and a fixed-size list element, passes the check every
    reader runs at construction."""
    fields = [
        {"name": f"{shape}_{t}", "type": type_name, "nullable": True}
        for t in fmt.SCALAR_TYPES
        for shape, type_name in (("s", t), ("l", f"list<{t}>"), ("f", f"fixed_size_list<{t},3>"))
    ]
    schema = Schema.model_validate({"fields": fields})
    check_readable(schema, schema.names)  # raises for a type without one


def test_a_type_without_a_batch_form_is_refused_at_construction_in_one_line(
    every_type: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the vocabulary to grow a type the readers do not convert, building a reader names
    the column and its type, before any part is read."""
    future = SchemaField.model_construct(name="price", type="decimal128(9,2)", nullable=True)
    schema = Schema.model_construct(fields=[*every_type.schema.fields, future])
    with pytest.raises(UnreadableType) as refused:
        check_readable(schema, ["item_id", "price"])
    message = str(refused.value)
    assert "\n" not in message and "'price'" in message and "decimal128(9,2)" in message
    monkeypatch.setattr(Index, "schema", property(lambda self: schema))
    for style in ("map", "iterable"):
        with pytest.raises(UnreadableType, match="'price'"):
            make_loader(every_type, style=style, batch_size=2, num_workers=0)
