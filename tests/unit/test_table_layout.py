"""A table's recorded layout (format, partition columns, the NULL folder's value) is
created once and compared ever after (known-open L13): a table recorded before lakesink
kept the NULL folder's value gets it recorded by the next start, and of two first starts
the second is compared with the first's record instead of overwriting it. Local disk,
through the same create-if-absent as Spark's filesystem (a hard link)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from lakesink.errors import LayoutError
from lakesink.runtime.arrow_fs import ArrowFS
from lakesink.tables.base import NULL_RECORD, record_layout
from lakesink.tables.layout import TableLayout


def _fs() -> ArrowFS:
    return ArrowFS(pafs.LocalFileSystem(), writes=True)


def _layout(tmp_path: Path) -> TableLayout:
    return TableLayout.of(str(tmp_path / "lake"), "events")


def test_a_table_recorded_without_its_null_folder_gets_it_recorded(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    meta = tmp_path / "lake" / ".lakesink" / "events"
    meta.mkdir(parents=True)
    (meta / "layout.json").write_text(json.dumps(
        {"format": "parquet", "partition_by": ["location"]}))  # before 2026-11-29
    record_layout(_fs(), layout, "parquet", ["location"], null_value="__None__")
    assert json.loads((meta / NULL_RECORD).read_text())["null_partition_value"] == "__None__"
    # the next start with another value would split the NULLs over two folders
    with pytest.raises(LayoutError, match="__None__"):
        record_layout(_fs(), layout, "parquet", ["location"],
                      null_value="__HIVE_DEFAULT_PARTITION__")
    record_layout(_fs(), layout, "parquet", ["location"], null_value="__None__")


class _LateFirst(ArrowFS):
    """A filesystem on which another first start records the table between this start's
    read of the layout and its own record."""

    def __init__(self, layout: TableLayout, record: dict[str, Any]) -> None:
        super().__init__(pafs.LocalFileSystem(), writes=True)
        self.layout, self.record, self.raced = layout, record, False

    def read_json(self, path: str) -> Any:  # noqa: ANN401
        value = super().read_json(path)
        if path == self.layout.layout_file and not self.raced:
            self.raced = True
            super().write_once(path, json.dumps(self.record))
        return value


def test_the_second_of_two_first_starts_is_compared_with_the_first(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    first = {"format": "parquet", "partition_by": ["location"],
             "null_partition_value": "__None__"}
    with pytest.raises(LayoutError, match="__None__"):
        record_layout(_LateFirst(layout, first), layout, "parquet", ["location"],
                      null_value="__HIVE_DEFAULT_PARTITION__")
    kept = json.loads(Path(layout.layout_file.removeprefix("file:")).read_text())
    assert kept == first  # not overwritten by the second start
    # the same layout is no conflict
    other = tmp_path / "other"
    layout2 = TableLayout.of(str(other), "events")
    record_layout(_LateFirst(layout2, first), layout2, "parquet", ["location"],
                  null_value="__None__")
