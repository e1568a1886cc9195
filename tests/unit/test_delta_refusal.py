"""A commit delta-rs refused holds a Delta table on Spark's writer for a while, not
forever (delta-rs on a local table; no Spark, no JVM)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from lakesink.tables import delta_files
from lakesink.tables.delta import DeltaTableWriter
from lakesink.tables.layout import TableLayout


def _writer(tmp_path: Path) -> DeltaTableWriter:
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "events"), pa.table({"id": [1]}))
    writer = DeltaTableWriter.__new__(DeltaTableWriter)  # the refusal state only
    writer.layout = TableLayout.of(str(tmp_path), "events")
    writer.task_filesystem = ("local", {})
    writer._table = None
    return writer


def test_a_refusal_holds_then_expires(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    writer = _writer(tmp_path)
    writer._refused = ("delta-rs refused a commit twice (x)", time.monotonic())
    assert writer.files_refusal() == "delta-rs refused a commit twice (x)"
    monkeypatch.setattr(delta_files, "REFUSAL_HOLD_S", 0.0)
    assert writer.files_refusal() is None  # tried again: the table has no refusing feature
    assert writer._refused is None


def test_a_table_delta_rs_makes_has_only_types_that_need_no_table_feature() -> None:
    """delta-rs makes a new table at start only with the nullable columns Spark's first
    append would store under protocol 1/2; a type that needs a table feature, or column
    metadata (char and varchar), leaves the table to Delta's builder."""
    from lakesink.tables.delta_create import plain_nullable

    def struct(*fields: dict) -> dict:
        return {"type": "struct", "fields": list(fields)}

    def field(name: str, data_type: object, metadata: dict | None = None) -> dict:
        return {"name": name, "type": data_type, "nullable": False,
                "metadata": metadata or {}}

    nested = struct(field("id", "long"), field("price", "decimal(10,2)"),
                    field("tags", {"type": "array", "elementType": "string",
                                   "containsNull": False}),
                    field("attrs", {"type": "map", "keyType": "string",
                                    "valueType": struct(field("at", "timestamp")),
                                    "valueContainsNull": False}))
    assert plain_nullable(nested) == struct(
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "price", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
        {"name": "tags", "type": {"type": "array", "elementType": "string",
                                  "containsNull": True}, "nullable": True, "metadata": {}},
        {"name": "attrs", "type": {"type": "map", "keyType": "string", "valueType": struct(
            {"name": "at", "type": "timestamp", "nullable": True, "metadata": {}}),
            "valueContainsNull": True}, "nullable": True, "metadata": {}})
    assert plain_nullable(struct(field("at", "timestamp_ntz"))) is None
    assert plain_nullable(struct(field("v", "variant"))) is None
    assert plain_nullable(struct(field("code", "string",
                                       {"__CHAR_VARCHAR_TYPE_STRING": "char(3)"}))) is None
    assert plain_nullable(struct(field("xs", {"type": "array", "elementType":
                                              "timestamp_ntz", "containsNull": True}))) is None


@pytest.mark.parametrize("names", [["a b"], ["a,b"], ["x=1"], ["tab\there"], ["(x)"],
                                   ["Id", "id"]])
def test_column_names_delta_refuses_leave_the_table_to_delta_s_builder(names) -> None:
    """Delta refuses these names without column mapping; its builder says so at start,
    where a table delta-rs made would fail only at a batch Spark's writer takes."""
    from lakesink.tables.delta_create import plain_nullable

    fields = [{"name": n, "type": "long", "nullable": True, "metadata": {}} for n in names]
    assert plain_nullable({"type": "struct", "fields": fields}) is None
    nested = {"type": "struct", "fields": [{"name": "outer", "nullable": True,
                                            "metadata": {}, "type": {"type": "struct",
                                                                     "fields": fields}}]}
    assert plain_nullable(nested) is None
    fine = [{"name": "ok_name", "type": "long", "nullable": True, "metadata": {}}]
    assert plain_nullable({"type": "struct", "fields": fine}) is not None
