"""``repair --apply`` beside a stream (audit-2 #12), on a Parquet table on local disk
through a filesystem double that writes with pyarrow (no Spark): a batch a restarted
stream redoes while repair runs, and a repair host whose clock runs ahead, never lose a
file to the quarantine."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from lakesink.maintenance import parquet_repair as maintenance
from lakesink.runtime.arrow_fs import ArrowFS
from lakesink.tables.layout import TableLayout


class LocalFS(ArrowFS):
    """:class:`ArrowFS` with its local-disk writes and moves (what repair makes)."""

    def __init__(self) -> None:
        super().__init__(pafs.LocalFileSystem(), writes=True)


HOUR_AGO = time.time() - 3600


def _lake(tmp_path: Path) -> tuple[LocalFS, TableLayout, str]:
    """Batch 0 committed; batch 1's attempt crashed an hour ago mid-publish (its pending
    record and published file old): an orphan for repair."""
    fs, layout = LocalFS(), TableLayout.of(str(tmp_path / "lake"), "events")
    table = Path(fs._native(layout.table))
    meta = Path(fs._native(layout.meta))
    folder = table / "location=a"
    folder.mkdir(parents=True)
    committed = folder / "part-0000000000-run1-00000.parquet"
    pq.write_table(pa.table({"id": [0]}), committed)
    (meta / "manifests" / "run1").mkdir(parents=True)
    (meta / "manifests" / "run1" / "0000000000.json").write_text(json.dumps({
        "batch_id": 0, "app_id": "app1", "files": [{
            "path": "location=a/part-0000000000-run1-00000.parquet", "rows": 1,
            "bytes": committed.stat().st_size}]}))
    crashed = folder / "part-0000000001-run1-00000.parquet"
    pq.write_table(pa.table({"id": [1]}), crashed)
    pending = meta / "pending" / "run1" / "0000000001.json"
    pending.parent.mkdir(parents=True)
    pending.write_text(json.dumps({"batch_id": 1, "files": [f"file:{crashed}"]}))
    for p in (crashed, pending):
        os.utime(p, (HOUR_AGO, HOUR_AGO))
    return fs, layout, "location=a/part-0000000001-run1-00000.parquet"


def test_a_crashed_attempts_file_is_quarantined(tmp_path: Path) -> None:
    fs, layout, orphan = _lake(tmp_path)
    report = maintenance.repair(fs, layout, apply=True, min_age_s=60)
    assert report.orphans == [orphan] and report.applied
    assert not (Path(fs._native(layout.table)) / orphan).exists()


def test_a_batch_redone_while_repair_runs_keeps_its_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The stream restarts after repair listed the table: its begin() rewrites the
    pending record and its redo publishes the same name again, then commits. Before the
    fix, repair moved the new file (the batch was not committed yet) and the manifest
    listed a missing file."""
    fs, layout, orphan = _lake(tmp_path)
    meta = Path(fs._native(layout.meta))
    committed_since = maintenance._committed_since

    def redo_then_check(*args: Any) -> bool:  # noqa: ANN401
        pending = meta / "pending" / "run1" / "0000000001.json"
        pending.write_text(json.dumps({"batch_id": 1, "files": []}))  # begin()
        pq.write_table(pa.table({"id": [1]}), Path(fs._native(layout.table)) / orphan)
        return committed_since(*args)

    monkeypatch.setattr(maintenance, "_committed_since", redo_then_check)
    maintenance.repair(fs, layout, apply=True, min_age_s=60)
    assert (Path(fs._native(layout.table)) / orphan).exists(), "the redo's file was moved"


def test_a_repair_host_ahead_of_the_store_moves_no_live_file(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A live batch: pending record and file just written. A repair host two hours
    ahead took them for old, so the live file for an orphan; ages now come from the
    store's clock (a probe file's modification time)."""
    fs, layout, _ = _lake(tmp_path)
    table = Path(fs._native(layout.table))
    meta = Path(fs._native(layout.meta))
    live = "location=a/part-0000000002-run1-00000.parquet"
    pq.write_table(pa.table({"id": [2]}), table / live)
    (meta / "pending" / "run1" / "0000000002.json").write_text(
        json.dumps({"batch_id": 2, "files": [f"file:{table / live}"]}))
    real = time.time
    monkeypatch.setattr(maintenance.time, "time", lambda: real() + 7200)
    report = maintenance.repair(fs, layout, apply=True, min_age_s=60)
    assert (table / live).exists(), report
    assert live not in report.orphans


def test_a_redo_that_begins_between_the_listings_keeps_its_file(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """The restarted stream's begin() lands after repair listed the table and before it
    listed the pending records: its new record (young) names no file yet, and the redo
    publishes the same name before repair moves it (on S3 the record's rewrite may keep
    its one-second mtime). The batch is in flight as a whole: nothing of it is moved."""
    fs, layout, orphan = _lake(tmp_path)
    table, meta = Path(fs._native(layout.table)), Path(fs._native(layout.meta))
    record = meta / "pending" / "run1" / "0000000001.json"
    listed = fs.list_files
    began: list[bool] = []

    def list_files(path: str, *, suffix: str = "") -> Any:  # noqa: ANN401
        if path.endswith("/pending") and not began:
            began.append(True)  # begin(): the crashed attempt's file goes, a new record
            (table / orphan).unlink()
            record.write_text(json.dumps({"batch_id": 1, "files": []}))
        return listed(path, suffix=suffix)

    monkeypatch.setattr(fs, "list_files", list_files)
    committed_since = maintenance._committed_since

    def republished(*args: Any) -> bool:  # noqa: ANN401
        if not (table / orphan).exists():
            stamp = record.stat().st_mtime
            pq.write_table(pa.table({"id": [1]}), table / orphan)
            record.write_text(json.dumps({"batch_id": 1, "files": [str(table / orphan)]}))
            os.utime(record, (stamp, stamp))  # the same (one-second) mtime
        return committed_since(*args)

    monkeypatch.setattr(maintenance, "_committed_since", republished)
    report = maintenance.repair(fs, layout, apply=True, min_age_s=60)
    assert orphan not in report.orphans, report
    assert not list((meta / "quarantine").rglob("*.parquet")), "the redo's file was moved"
