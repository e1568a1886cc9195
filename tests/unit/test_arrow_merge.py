"""The Arrow path's merge of a folder's small files (table.files_per_partition): the plan,
the task's merge on local disk (pyarrow only, no Spark), and the row check."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink.errors import SinkError
from lakesink.pipeline.arrow_merge import Merge, _merge_task, merged, plan
from lakesink.pipeline.arrow_task import TaskSpec, write_folders

FIELDS = (("id", "bigint", False), ("location", "string", True))


def _spec(staging: Path, **kw: object) -> TaskSpec:
    return TaskSpec(fields=FIELDS, partition_by=("location",),  # type: ignore[arg-type]
                    staging=str(staging), **kw)


def _tasks(spec: TaskSpec, tasks: int, rows: int) -> list[tuple[str, int, int, str | None]]:
    """What ``tasks`` tasks report for ``rows`` rows each, spread over folders a and b
    (b only in the first task): a file per folder per task."""
    out = []
    for task in range(tasks):
        ids = range(task * rows, (task + 1) * rows)
        table = pa.table({"id": pa.array(ids, pa.int64()),
                          "location": ["b" if task == 0 and i % 2 else "a" for i in ids]})
        out += write_folders(spec, table, task=task)
    return out


def test_every_folder_is_merged_into_its_allowed_files() -> None:
    """The staged files are Arrow IPC, not the table's format: every folder is written
    again, a folder with one staged file too, into files_per_partition files (more when
    the target file size asks for them)."""
    reported = [("location=a/p0", 10, 1, None), ("location=a/p1", 10, 1, None),
                ("location=a/p2", 10, 1, None), ("location=b/p0", 5, 1, None)]
    assert plan(reported, 1, None) == [
        Merge("location=a", ("location=a/p0", "location=a/p1", "location=a/p2"), 1),
        Merge("location=b", ("location=b/p0",), 1)]
    assert [m.parts for m in plan(reported, 2, None)] == [2, 2]
    assert [m.rows for m in plan(reported, 1, None)] == [30, 5]
    assert plan(reported, 0, None) == []  # 0: as the tasks wrote them
    # a target file size asks for more files: 30 rows at 12 a file is 3 files
    assert [m.parts for m in plan(reported, 1, 12)] == [3, 1]
    # an unpartitioned table's files sit in the root folder
    assert plan([("p0", 1, 1, None), ("p1", 1, 1, None)], 1, None) == [Merge("", ("p0", "p1"), 1)]


def test_a_merge_writes_the_folders_rows_once_in_order(tmp_path: Path) -> None:
    spec = _spec(tmp_path / "a", stage_format="arrow")
    reported = _tasks(spec, tasks=3, rows=50)
    assert len([r for r in reported if r[0].startswith("location=a/")]) == 3
    merges = plan(reported, 1, None)
    outputs = list(_merge_task(spec, str(tmp_path / "a"), str(tmp_path / "m"), "", iter(merges)))
    assert [o[0] for o in outputs] == ["location=a/part-m-00000.parquet",
                                       "location=b/part-m-00000.parquet"]
    files = merged(reported, merges, outputs)
    assert sorted(f[0] for f in files) == ["location=a/part-m-00000.parquet",
                                           "location=b/part-m-00000.parquet"]
    rel, rows, size, stats = outputs[0]
    path = tmp_path / "m" / rel
    ids = pq.read_table(path).column("id").to_pylist()
    assert rows == len(ids) == 125 and size == path.stat().st_size and stats is None
    want = [i for i in range(150) if not (i < 50 and i % 2)]
    assert ids == want  # every row once, in the order the tasks wrote them
    assert not list((tmp_path / "m").rglob("*.tmp"))


def test_a_delta_merge_reports_statistics_and_splits_by_parts(tmp_path: Path) -> None:
    spec = _spec(tmp_path, stats=True, file_tag="-b0000000001-run-abc", stage_format="arrow")
    reported = _tasks(spec, tasks=4, rows=10)
    merges = [m for m in plan(reported, 2, None) if m.folder == "location=a"]
    outputs = list(_merge_task(spec, str(tmp_path), str(tmp_path), "-b0000000001-run-abc",
                               iter(merges)))
    assert [(o[0], o[1]) for o in outputs] == [
        ("location=a/part-m-00000-b0000000001-run-abc.parquet", 18),
        ("location=a/part-m-00001-b0000000001-run-abc.parquet", 17)]
    stats = json.loads(outputs[1][3])
    assert stats["numRecords"] == 17 and stats["maxValues"]["id"] == 39


def test_a_merge_that_loses_a_row_stops_the_batch() -> None:
    reported = [("f=1/a", 3, 1, None), ("f=1/b", 4, 1, None)]
    merges = plan(reported, 1, None)
    with pytest.raises(SinkError, match="from 7 to 6"):
        merged(reported, merges, [("f=1/part-m-00000.parquet", 6, 1, None)])


def test_rows_staged_as_arrow_ipc_become_each_folders_parquet_files(tmp_path: Path) -> None:
    """With the merge on, the tasks stage Arrow IPC (no Parquet encoded twice): every
    folder — one with a single staged file too — gets its Parquet files from them."""
    spec = _spec(tmp_path / "a", stage_format="arrow")
    reported = _tasks(spec, tasks=3, rows=50)
    assert all(r[0].endswith(".arrow") and r[3] is None for r in reported)
    merges = plan(reported, 1, None)
    assert sorted(m.folder for m in merges) == ["location=a", "location=b"]  # b: one file
    outputs = list(_merge_task(spec, str(tmp_path / "a"), str(tmp_path / "m"), "",
                               iter(merges)))
    files = merged(reported, merges, outputs)
    assert sorted(f[0] for f in files) == ["location=a/part-m-00000.parquet",
                                           "location=b/part-m-00000.parquet"]
    ids = sorted(i for f in files
                 for i in pq.read_table(tmp_path / "m" / f[0]).column("id").to_pylist())
    assert ids == list(range(150))


def test_the_merge_job_spreads_folders_over_the_cores_by_rows() -> None:
    from lakesink.pipeline.arrow_merge import spread

    merges = [Merge(f"f={i}", (), 1, rows) for i, rows in
              enumerate([900, 100, 500, 400, 300, 300, 200])]
    slices = spread(merges, 4)
    assert len(slices) == 4
    assert sorted(sum(m.rows for m in s) for s in slices) == [600, 600, 600, 900]
    assert sorted(m.folder for s in slices for m in s) == sorted(m.folder for m in merges)
    assert spread(merges[:2], 4) == [[merges[0]], [merges[1]]]  # never an empty task
