"""The kNN labeller on hand-made data: votes, margins, abstentions, failures, verification."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from resources.compute.local.labeller import LabellerError, feature_columns, label_table


def _ref() -> pa.Table:
    # two clusters on the x axis, one extra column the input lacks (so it is not a feature)
    return pa.table(
        {
            "rid": [f"r{i}" for i in range(6)],
            "x": [0.0, 0.1, 0.2, 10.0, 10.1, 10.2],
            "only_ref": [1.0] * 6,
            "label": pa.array([3, 3, 3, 7, 7, 7], type=pa.int64()),
        }
    )


def test_votes_margins_abstentions_and_failures():
    inp = pa.table(
        {
            "id": ["near3", "near7", "middle", "broken"],
            "x": pa.array([0.05, 10.05, 5.12, None], type=pa.float64()),
            "note": ["a", "b", "c", "d"],  # not numeric: ignored
        }
    )
    out = label_table(inp, _ref(), id_field="id", reference_id_field="rid", k=3, abstain_margin=0.5)
    arrow = out.to_arrow()
    # "middle": nearest three are 10.0, 0.2, 10.1 -> votes 7,3,7 -> margin 1/3 < 0.5: abstains
    assert arrow["lithi_status"].to_pylist() == ["accepted", "accepted", "abstained", "failed"]
    assert arrow["lithi_label"].to_pylist() == [3, 7, None, None]
    assert arrow["lithi_confidence"].to_pylist()[:2] == [1.0, 1.0]
    assert arrow["lithi_confidence"][2].as_py() == pytest.approx(1 / 3)
    assert (
        arrow["lithi_confidence"].type == pa.float32() and arrow["lithi_label"].type == pa.int64()
    )
    assert arrow["lithi_confidence"][3].as_py() is None
    assert arrow["lithi_verification"].to_pylist() == ["agree", "agree", "agree", "not_run"]

    # k=6 over 3+3 neighbours: a tie, margin 0, below any positive threshold -> abstains
    tie = label_table(
        inp.slice(2, 1), _ref(), id_field="id", reference_id_field="rid", k=6, abstain_margin=0.1
    ).to_arrow()
    assert tie["lithi_status"].to_pylist() == ["abstained"]
    assert tie["lithi_label"].to_pylist() == [None] and tie["lithi_confidence"].to_pylist() == [0.0]


def test_fixed_size_list_features_and_nan_items():
    vec = pa.list_(pa.float32(), 2)
    ref = pa.table(
        {
            "id": ["a", "b", "c", "d"],
            "v": pa.array([[0, 0], [0, 1], [9, 9], [9, 8]], type=vec),
            "label": pa.array([0, 0, 1, 1], type=pa.int64()),
        }
    )
    inp = pa.table({"id": ["p", "q", "r"], "v": pa.array([[1, 0], [8, 9], [np.nan, 1]], type=vec)})
    out = label_table(inp, ref, id_field="id", reference_id_field="id", k=2, abstain_margin=0.5)
    assert out.to_arrow()["lithi_label"].to_pylist() == [0, 1, None]
    assert out.status.tolist() == ["accepted", "accepted", "failed"]


def test_feature_columns_need_the_same_type_on_both_sides():
    a = pa.schema([("id", pa.string()), ("x", pa.float64()), ("y", pa.int64())])
    b = pa.schema(
        [("id", pa.string()), ("x", pa.float32()), ("y", pa.int64()), ("label", pa.int64())]
    )
    assert feature_columns(a, b, id_field="id", reference_id_field="id") == ["y"]
    with pytest.raises(LabellerError, match="no numeric feature column"):
        feature_columns(a.remove(2), b, id_field="id", reference_id_field="id")
