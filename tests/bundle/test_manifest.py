"""The manifest model: every rule checkable from the manifest alone, and the checked-in schema."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle.digest import content_sha256
from pipeline.bundle.errors import CountMismatch, ManifestInvalid, StatusMismatch, UnsafePath
from pipeline.bundle.manifest import Manifest, json_schema, json_schema_text, parse_manifest
from pipeline.cli import main as bundle_cli

REPO = Path(__file__).resolve().parents[2]
SHA = "b" * 64
#: Where the generated JSON Schema is checked in.
SCHEMA_DOC = "docs/result-manifest.schema.json"


def result_manifest() -> dict:
    """A valid PARTIAL result manifest, as JSON data."""
    parts = [
        {"path": fmt.part_path(i), "sha256": f"{i}" * 64, "bytes": 100 + i, "rows": 10}
        for i in range(2)
    ]
    out = {"path": fmt.OUTSTANDING_NAME, "sha256": "c" * 64, "bytes": 50, "rows": 3}
    return {
        "manifest_version": 1,
        "kind": "result",
        "snapshot": {
            "version_id": "result-1",
            "content_sha256": content_sha256((e["sha256"], e["path"]) for e in [*parts, out]),
        },
        "job": {
            "job_id": "job-1",
            "status": "PARTIAL",
            "attempt": 1,
            "parent_version_id": None,
            "next_action": {"action": "resubmit_outstanding", "items": 3},
        },
        "input": {"version_id": "input-1", "content_sha256": SHA, "credential_ref": None},
        "item_id_field": "id",
        "schema": {
            "fields": [
                {"name": "id", "type": "string", "nullable": False},
                {"name": "pixels", "type": "fixed_size_list<uint8,64>", "nullable": False},
                {"name": fmt.STATUS_COLUMN, "type": "string", "nullable": False},
                {"name": fmt.CONFIDENCE_COLUMN, "type": "float32", "nullable": True},
                {"name": fmt.VERIFICATION_COLUMN, "type": "string", "nullable": True},
            ]
        },
        "parts": parts,
        "outstanding": out,
        "counts": {"items": 20, "accepted": 15, "failed": 3, "abstained": 2, "outstanding": 3},
        "created_at": "2026-09-05T12:00:00.000001Z",
    }


def input_manifest() -> dict:
    m = result_manifest()
    m.update(kind="input", job=None, input=None, outstanding=None, counts={"items": 20})
    m["schema"]["fields"] = m["schema"]["fields"][:2]
    return m


def parse(data: dict) -> Manifest:
    return parse_manifest(json.dumps(data))


def test_valid_manifests_parse_and_round_trip():
    for data in (result_manifest(), input_manifest()):
        m = parse(data)
        assert parse_manifest(m.to_json()) == m
        assert json.loads(m.to_json()) == data  # the canonical text is the documented shape
    m = parse(result_manifest())
    assert m.is_partial and [f.path for f in m.bound_files][-1] == fmt.OUTSTANDING_NAME
    assert m.created_at == datetime(2026, 9, 5, 12, 0, 0, 1, tzinfo=UTC)


def edited(base, edit) -> dict:
    data = copy.deepcopy(base())
    edit(data)
    return data


def _set(path: str, value):
    def edit(d):
        *head, last = path.split(".")
        for k in head:
            d = d[int(k)] if k.isdigit() else d[k]
        d[int(last) if last.isdigit() else last] = value

    return edit


@pytest.mark.parametrize(
    ("base", "edit", "cls", "match"),
    [
        (result_manifest, _set("manifest_version", 2), ManifestInvalid, "manifest_version"),
        (result_manifest, _set("kind", "model"), ManifestInvalid, "kind"),
        (result_manifest, _set("snapshot.content_sha256", "ABC"), ManifestInvalid, "content_sha"),
        (result_manifest, _set("snapshot.content_sha256", "A" * 64), ManifestInvalid, "pattern"),
        (result_manifest, _set("extra", 1), ManifestInvalid, "Extra inputs"),
        (result_manifest, _set("created_at", "2026-09-05T12:00:00"), ManifestInvalid, "timezone"),
        (result_manifest, _set("created_at", "2026-09-05T14:00:00+02:00"), ManifestInvalid, "UTC"),
        (result_manifest, _set("job.attempt", 0), ManifestInvalid, "attempt"),
        (result_manifest, _set("job", None), ManifestInvalid, "must describe its job"),
        (result_manifest, _set("input", None), ManifestInvalid, "must name its input"),
        (result_manifest, _set("item_id_field", "nope"), ManifestInvalid, "not a declared"),
        (result_manifest, _set("schema.fields.0.nullable", True), ManifestInvalid, "non-null"),
        (result_manifest, _set("schema.fields.0.type", "binary"), ManifestInvalid, "string"),
        (result_manifest, _set("schema.fields.1.type", "uint128"), ManifestInvalid, "vocabulary"),
        (result_manifest, _set("schema.fields.1.name", "id"), ManifestInvalid, "declared twice"),
        (result_manifest, _set("schema.fields.3.type", "string"), ManifestInvalid, "float"),
        (result_manifest, _set("schema.fields.2.type", "int8"), ManifestInvalid, "lithi_status"),
        (
            result_manifest,
            lambda d: d["schema"]["fields"].pop(4),
            ManifestInvalid,
            "lithi_verification",
        ),
        (result_manifest, _set("parts.1.path", fmt.part_path(5)), ManifestInvalid, "part 1"),
        (result_manifest, _set("outstanding.path", "o.parquet"), ManifestInvalid, "outstanding"),
        (result_manifest, _set("parts.0.path", "/abs.parquet"), UnsafePath, "inside the bundle"),
        (result_manifest, _set("parts.0.path", "../x.parquet"), UnsafePath, "inside the bundle"),
        (result_manifest, _set("parts.0.path", "parts//p"), UnsafePath, "normalised"),
        (result_manifest, _set("parts.0.bytes", -1), ManifestInvalid, "bytes"),
        (result_manifest, _set("counts.items", 21), CountMismatch, "parts hold 20 rows"),
        (result_manifest, _set("counts.failed", 4), CountMismatch, "!= items 20"),
        (result_manifest, _set("counts.outstanding", 2), CountMismatch, "outstanding file has 3"),
        (result_manifest, _set("counts.accepted", None), ManifestInvalid, "counts need"),
        (result_manifest, _set("job.status", "SUCCEEDED"), StatusMismatch, "PARTIAL exactly"),
        (result_manifest, _set("job.next_action", None), StatusMismatch, "needs next_action"),
        (result_manifest, _set("job.next_action.items", 2), StatusMismatch, "items=3"),
        (
            result_manifest,
            lambda d: (
                d.update(outstanding=None),
                d["counts"].update(outstanding=0),
                d["job"].update(next_action=None),
            ),
            StatusMismatch,
            "PARTIAL exactly",
        ),
        (
            result_manifest,
            lambda d: (
                d.update(outstanding=None),
                d["counts"].update(outstanding=0),
                d["job"].update(status="SUCCEEDED"),
            ),
            StatusMismatch,
            "has no next_action",
        ),
        (
            input_manifest,
            _set("input", {"version_id": "v", "content_sha256": SHA}),
            ManifestInvalid,
            "no input",
        ),  # noqa: E501
        (input_manifest, _set("job", result_manifest()["job"]), ManifestInvalid, "only for result"),
        (input_manifest, _set("counts.failed", 0), ManifestInvalid, "only for result"),
    ],
)
def test_rules(base, edit, cls, match):
    with pytest.raises(cls, match=match) as info:
        parse(edited(base, edit))
    assert type(info.value) is cls
    assert fmt.MANIFEST_NAME in str(info.value)  # every message names the file


def test_mixed_problems_are_manifest_invalid_listing_each():
    data = result_manifest()
    data["parts"][0]["path"] = "/abs"
    data["kind"] = "weird"
    with pytest.raises(ManifestInvalid) as info:
        parse(data)
    assert type(info.value) is ManifestInvalid
    assert "kind" in str(info.value) and "parts.0.path" in str(info.value)


@pytest.mark.parametrize("text", ["", "{", "[1, 2", '{"a": 1} x'])
def test_not_json(text):
    with pytest.raises(ManifestInvalid, match="is not JSON"):
        parse_manifest(text)


def test_json_schema_checked_in_is_current():
    # Regenerate with: lithi-bundle schema docs/result-manifest.schema.json
    assert (REPO / SCHEMA_DOC).read_text() == json_schema_text()
    assert bundle_cli(["schema", "--check", str(REPO / SCHEMA_DOC)]) == 0


def test_json_schema_regeneration(tmp_path):
    target = tmp_path / "schema.json"
    assert bundle_cli(["schema", "--check", str(target)]) == 1
    assert bundle_cli(["schema", str(target)]) == 0
    assert json.loads(target.read_text()) == json_schema()
    assert bundle_cli(["schema", "--check", str(target)]) == 0


def test_json_schema_describes_the_documented_fields():
    schema = json_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert set(schema["required"]) == {
        "manifest_version", "kind", "snapshot", "job", "input", "item_id_field", "schema",
        "parts", "outstanding", "counts", "created_at",
    }  # fmt: skip
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["SnapshotId"]["properties"]["content_sha256"]["pattern"] == (
        "^[0-9a-f]{64}$"
    )


# -- strict parsing: a manifest is untrusted input ---------------------------------------------


def _text(edit) -> bytes:
    data = result_manifest()
    edit(data)
    return json.dumps(data).encode()


def _nest(depth: int) -> bytes:
    text = json.dumps(result_manifest())
    return (text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}").encode()


HOSTILE = {
    "string number": _text(lambda d: d["parts"][0].update(bytes="1034")),
    "float number": _text(lambda d: d["parts"][0].update(rows=10.0)),
    "manifest_version true": _text(lambda d: d.update(manifest_version=True)),
    "manifest_version string": _text(lambda d: d.update(manifest_version="1")),
    "manifest_version float": _text(lambda d: d.update(manifest_version=1.0)),
    "NUL in job_id": _text(lambda d: d["job"].update(job_id="job\u0000x")),
    "escape in job_id": _text(lambda d: d["job"].update(job_id="job\u001b[31m")),
    "DEL in a column name": _text(lambda d: d["schema"]["fields"][1].update(name="x\u007f")),
    "tab in a credential ref": _text(lambda d: d["input"].update(credential_ref="env:\tX")),
    "nullable yes": _text(lambda d: d["schema"]["fields"][1].update(nullable="yes")),
    "created_at epoch number": _text(lambda d: d.update(created_at=1_790_000_000)),
    "created_at epoch text": _text(lambda d: d.update(created_at="1790000000")),
    "count beyond int64": _text(lambda d: d["parts"][0].update(bytes=2**63)),
    "5000-digit integer": json.dumps(result_manifest())
    .replace('"bytes": 100', '"bytes": ' + "9" * 5000)
    .encode(),
    "200,000-deep nesting": _nest(200_000),
    "list size beyond int32": _text(
        lambda d: d["schema"]["fields"][1].update(type="fixed_size_list<int8,99999999999>")
    ),
    "list size of 5000 digits": _text(
        lambda d: d["schema"]["fields"][1].update(type="fixed_size_list<int8," + "9" * 5000 + ">")
    ),
    "UTF-16": json.dumps(result_manifest()).encode("utf-16"),
    "UTF-32": json.dumps(result_manifest()).encode("utf-32"),
    "UTF-8 byte-order mark": b"\xef\xbb\xbf" + json.dumps(result_manifest()).encode(),
    "Latin-1 byte": _text(lambda d: d["job"].update(job_id="caf\u00e9")).replace(
        b"\\u00e9", b"\xe9"
    ),
    "duplicate key": json.dumps(result_manifest())
    .replace('"kind": "result"', '"kind": "input", "kind": "result"')
    .encode(),
    "lone surrogate": _text(lambda d: d["job"].update(job_id="x")).replace(
        b'"job_id": "x"', b'"job_id": "\\ud800"'
    ),
    "version_id traversal": _text(lambda d: d["snapshot"].update(version_id="../../etc/x")),
    "version_id empty": _text(lambda d: d["snapshot"].update(version_id="")),
    "version_id with a newline": _text(lambda d: d["snapshot"].update(version_id="v\nVALID")),
    "name too long": _text(lambda d: d["job"].update(job_id="j" * 5000)),
    "NaN": json.dumps(result_manifest()).replace('"rows": 10', '"rows": NaN', 1).encode(),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_manifest_text_is_refused_with_one_line(name):
    with pytest.raises(ManifestInvalid) as info:
        parse_manifest(HOSTILE[name])
    message = str(info.value)
    assert fmt.MANIFEST_NAME in message and "\n" not in message and len(message) < 2000


def test_the_valid_text_behind_the_hostile_cases_parses():
    # The cases above are refused for what was changed, not for something else.
    assert parse_manifest(_text(lambda d: None)).counts.items == 20
    assert parse_manifest(json.dumps(result_manifest()).encode("utf-8")).kind == "result"


def test_errors_say_what_was_expected_and_found():
    with pytest.raises(ManifestInvalid, match=r"parts\.0\.bytes: .*integer.*found \"1034\""):
        parse_manifest(HOSTILE["string number"])
    with pytest.raises(ManifestInvalid, match="key 'kind' appears twice"):
        parse_manifest(HOSTILE["duplicate key"])
    with pytest.raises(ManifestInvalid, match="not UTF-8.*UTF-16 or UTF-32"):
        parse_manifest(HOSTILE["UTF-16"])
    with pytest.raises(ManifestInvalid, match="found a 16610-bit integer|not JSON"):
        parse_manifest(HOSTILE["5000-digit integer"])


def test_a_manifest_larger_than_the_limit_is_refused_unread(monkeypatch):
    monkeypatch.setattr(fmt, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(ManifestInvalid, match="expected at most 1000"):
        parse_manifest(json.dumps(result_manifest()))


def test_a_valid_column_beside_its_nullable_base_is_refused_naming_both():
    def add(d):
        d["schema"]["fields"].insert(2, {"name": "x", "type": "int64", "nullable": True})
        d["schema"]["fields"].insert(3, {"name": "x__valid", "type": "bool", "nullable": False})

    with pytest.raises(ManifestInvalid, match="'x__valid'.*nullable column 'x'"):
        parse_manifest(_text(add))

    def non_null_base(d):
        add(d)
        d["schema"]["fields"][2]["nullable"] = False

    assert "x__valid" in parse_manifest(_text(non_null_base)).schema_.names


def test_a_snapshot_tag_is_version_and_digest():
    from pipeline.bundle.manifest import SnapshotId

    assert SnapshotId(version_id="v1", content_sha256=SHA).tag == f"v1:{SHA}"


@pytest.mark.parametrize(
    ("kind", "has_input", "has_job", "match"),
    [
        ("input", True, False, "derives from nothing.*: drop it"),
        ("result", False, True, "must name its input snapshot: name it"),
        ("result", True, False, "must describe its job: describe it"),
        ("prediction", True, True, "only for result bundles, not prediction: drop the job"),
        ("model", False, False, "kind must be input, result or prediction"),
    ],
)
def test_the_lineage_rule_ends_with_the_callers_hint(kind, has_input, has_job, match):
    from pipeline.bundle.manifest import LineageHints, check_lineage

    hints = LineageHints("drop it", "name it", "describe it", "drop the job")
    with pytest.raises(ValueError, match=match):
        check_lineage(kind, has_input=has_input, has_job=has_job, hints=hints)
    check_lineage("prediction", has_input=True, has_job=False, hints=hints)


def test_the_schema_command_needs_a_path(capsys):
    assert bundle_cli(["schema"]) == 2
    assert "PATH" in capsys.readouterr().err


def test_a_validation_error_is_one_line_naming_each_field():
    from pydantic import ValidationError

    from pipeline.bundle.errors import one_line
    from pipeline.bundle.manifest import JobInfo, Schema

    with pytest.raises(ValidationError) as job:
        JobInfo.model_validate({"job_id": "", "status": "DONE", "attempt": 1})
    line = one_line(job.value)
    assert "\n" not in line and line.startswith("job_id: ") and "; status: " in line
    with pytest.raises(ValidationError) as schema:
        Schema.model_validate({"fields": [{"name": "a", "type": "int8", "nullable": True}] * 2})
    assert one_line(schema.value) == "fields: column 'a' is declared twice"  # no "Value error"
    assert one_line(schema.value, locations=False) == "column 'a' is declared twice"
