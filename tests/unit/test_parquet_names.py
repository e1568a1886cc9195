"""A redo of an uncommitted Parquet batch names the same files as its first attempt
(issue 17 scenario 13), whatever Spark called the staged files and whatever this
process has learned about file sizes since (no Spark: the writer's bookkeeping on a
store double)."""

from __future__ import annotations

import json
from typing import Any

from lakesink.tables.fs import FileInfo
from lakesink.tables.layout import TableLayout
from lakesink.tables.parquet import ParquetTableWriter


class Store:
    def __init__(self, staged: list[str]) -> None:
        self.files: dict[str, str] = {}
        self.staged = staged

    def read_json(self, path: str) -> Any:  # noqa: ANN401
        return json.loads(self.files[path]) if path in self.files else None

    def write_json(self, path: str, data: Any) -> None:  # noqa: ANN401
        self.files[path] = json.dumps(data)

    def delete(self, path: str, recursive: bool = True) -> bool:  # noqa: ARG002
        return self.files.pop(path, None) is not None

    def list_files(self, path: str, suffix: str = "") -> list[FileInfo]:
        return [FileInfo(f"{path}/{rel}", rel, 100) for rel in sorted(self.staged)]

    def parquet_rows(self, path: str) -> int:  # noqa: ARG002
        return 10


def writer(store: Store, bytes_per_row: float) -> ParquetTableWriter:
    w = object.__new__(ParquetTableWriter)  # no SparkSession: only the bookkeeping
    w.fs = store  # type: ignore[assignment]
    w.layout = TableLayout("file:/lake", "t")
    w.app_id, w.run = "a" * 32, "a" * 8
    w.partition_by = ["location"]
    w.target_file_size = 64 * 1024 * 1024
    w.bytes_per_row = bytes_per_row
    w.lease = None  # no lease: nothing to prove
    return w


def test_a_redo_names_the_same_files_with_the_first_attempts_file_size() -> None:
    first_spark = ["location=oslo/part-00000-aaaa.c000.snappy.parquet",
                   "location=oslo/part-00000-aaaa.c001.snappy.parquet",
                   "location=rome/part-00001-aaaa.c000.snappy.parquet"]
    store = Store(first_spark)
    first = writer(store, bytes_per_row=40.0)  # learned by earlier batches
    rows_first = first.begin(7)
    names_first = [f.name for f in first.named(7, first.listed("staging"))]
    # the process dies mid-publish; the new one has learned nothing yet and Spark
    # names the staged files differently
    store.staged = ["location=rome/part-00003-bbbb.c000.snappy.parquet",
                    "location=oslo/part-00001-bbbb.c000.snappy.parquet",
                    "location=oslo/part-00001-bbbb.c001.snappy.parquet"]
    redo = writer(store, bytes_per_row=200.0)
    assert redo.rows_per_file() != rows_first
    assert redo.begin(7) == rows_first  # the first attempt's split, from pending
    assert sorted(f.name for f in redo.named(7, redo.listed("staging"))) == sorted(names_first)
    assert sorted(names_first) == [
        "location=oslo/part-0000000007-aaaaaaaa-00000.parquet",
        "location=oslo/part-0000000007-aaaaaaaa-00001.parquet",
        "location=rome/part-0000000007-aaaaaaaa-00000.parquet"]
