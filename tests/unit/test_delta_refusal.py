"""A commit delta-rs refused holds a Delta table on Spark's writer for a while, not
forever (delta-rs on a local table; no Spark, no JVM)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

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
