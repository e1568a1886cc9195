"""The commands that only read a table answer without Spark (issue 41 item 7): ``dlq
show`` (Parquet and Delta dead letters), ``repair`` without ``--apply``, ``vacuum
--dry-run`` and a ``compact`` with nothing to do — pyarrow, delta-rs and DuckDB on a
lake laid out as lakesink lays it out. A step that would write is refused by the
read-only filesystem, never skipped."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from typer.testing import CliRunner

from lakesink import dlq, maintenance
from lakesink.cli import app
from lakesink.config import load_config
from lakesink.config.plan import TableSpec
from lakesink.runtime.arrow_fs import ArrowFS


def _config(tmp_path: Path, **dlq_section: object) -> Path:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["events"]}},
        "decode": {"schema": [{"name": "id", "type": "Int64"},
                              {"name": "location", "type": "Utf8"}]},
        "table": {"name": "events", "base_path": str(tmp_path / "lake"),
                  "partition_by": ["location"]},
        "dlq": dict(dlq_section)}))
    return path


def _letters(batch: int, reasons: list[str], first_offset: int) -> pa.Table:
    n = len(reasons)
    return pa.table({
        "key": pa.array([None] * n, pa.binary()),
        "value": pa.array([f"bad {first_offset + i}".encode() for i in range(n)], pa.binary()),
        "reason": reasons, "detail": [f"at {i}" for i in range(n)],
        "stage": ["decode"] * n, "topic": ["events"] * n,
        "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(first_offset + n - 1, first_offset - 1, -1), pa.int64()),
        "kafka_timestamp": pa.array([dt.datetime(2026, 12, 2)] * n, pa.timestamp("us")),
        "batch_id": pa.array([batch] * n, pa.int64()), "app_id": ["app1"] * n,
        "rejected_at": pa.array([dt.datetime(2026, 12, 2)] * n, pa.timestamp("us"))})


def _spec(path: Path) -> TableSpec:
    return TableSpec(load_config(path, env={}))


def test_dlq_show_reads_parquet_dead_letters_without_spark(tmp_path: Path) -> None:
    spec = _spec(_config(tmp_path))
    rejected = tmp_path / "lake" / "_rejected" / "events"
    rejected.mkdir(parents=True)
    pq.write_table(_letters(0, ["decode", "decode", "schema"], 10), rejected / "b0.parquet")
    pq.write_table(_letters(1, ["schema"], 0), rejected / "b1.parquet")
    pq.write_table(_letters(2, ["decode"] * 4, 20), rejected / "b2.parquet")
    plans = tmp_path / "lake" / ".lakesink" / "events" / "dlq"
    plans.mkdir(parents=True)
    (plans / "replay-000000.json").write_text(json.dumps(
        {"replay": 0, "state": "done", "files": ["b2.parquet"]}))
    shown = dlq.show(None, spec, sample=2)
    assert shown is not None
    assert shown["pending_files"] == 2 and shown["replayed_files"] == 1
    assert shown["replayed_records"] == 4
    assert shown["by_reason"] == {"decode": 2, "schema": 2}
    assert [(r["offset"], r["value"]) for r in shown["sample"]] == [(0, "bad 0"), (10, "bad 12")]
    # the CLI answers the same without a session
    result = CliRunner().invoke(app, ["dlq", "show", "-c", str(_config(tmp_path)), "--json",
                                      "--sample", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [shown]  # a list of tables, as status --json prints
    assert (shown["table"], shown["format"]) == ("events", "parquet")


def test_dlq_show_reads_delta_dead_letters_without_spark(tmp_path: Path) -> None:
    spec = _spec(_config(tmp_path, format="delta"))
    table = tmp_path / "lake" / "_rejected" / "events"
    write_deltalake(str(table), _letters(0, ["decode", "schema"], 0))
    write_deltalake(str(table), _letters(1, ["decode"], 5), mode="append")
    plans = tmp_path / "lake" / ".lakesink" / "events" / "dlq"
    plans.mkdir(parents=True)
    (plans / "replay-000000.json").write_text(json.dumps(
        {"replay": 0, "state": "done", "files": ["app1:1"]}))
    shown = dlq.show(None, spec)
    assert shown is not None
    assert (shown["pending_files"], shown["replayed_files"], shown["replayed_records"]) == (1, 1, 1)
    assert shown["by_reason"] == {"decode": 1, "schema": 1}


def _committed_lake(tmp_path: Path, files: int) -> TableSpec:
    """A Parquet table with ``files`` committed single-row files in one folder."""
    spec = _spec(_config(tmp_path))
    lake = tmp_path / "lake"
    folder = lake / "events" / "location=a"
    folder.mkdir(parents=True)
    entries = []
    for n in range(files):
        path = folder / f"part-{n:010d}-run1-00000.parquet"
        pq.write_table(pa.table({"id": [n]}), path)
        entries.append({"path": path.relative_to(lake / "events").as_posix(), "rows": 1,
                        "bytes": path.stat().st_size})
    meta = lake / ".lakesink" / "events"
    (meta / "manifests" / "run1").mkdir(parents=True)
    (meta / "manifests" / "run1" / "0000000000.json").write_text(json.dumps(
        {"batch_id": 0, "app_id": "app1", "files": entries}))
    return spec


def test_repair_vacuum_and_an_idle_compact_read_without_spark(tmp_path: Path) -> None:
    spec = _committed_lake(tmp_path, files=1)
    fs = ArrowFS.open(spec.storage, str(tmp_path / "lake"))
    assert fs is not None and fs.list_files(str(tmp_path / "lake" / "events"))
    repaired = maintenance.without_spark("repair", spec, apply=False)
    assert repaired is not None
    assert (repaired["files_checked"], repaired["rows_checked"], repaired["problems"]) == (1, 1, 0)
    # a foreign file: an orphan readers count, found however young it is
    pq.write_table(pa.table({"id": [9]}), tmp_path / "lake" / "events" / "location=a" / "x.parquet")
    repaired = maintenance.without_spark("repair", spec, apply=False)
    assert repaired is not None and repaired["problems"] == 1, repaired
    vacuumed = maintenance.without_spark("vacuum", spec, force=False, dry_run=True)
    assert vacuumed is not None and vacuumed["files_to_delete"] == 0
    compacted = maintenance.without_spark("compact", spec)
    assert compacted is not None and compacted["compactions"] == 0
    assert compacted["files_before"] == 1 and compacted["rows"] == 1
    # on local disk an apply moves without Spark too (the young orphan stays: it could
    # be a live batch's)
    applied = maintenance.without_spark("repair", spec, apply=True)
    assert applied is not None and applied["problems"] == 1, applied


def _finished_compaction(tmp_path: Path, spec: TableSpec, *, finished: bool) -> Path:
    """The journal of compaction 0 of ``location=a``'s file, its input moved to the
    replaced folder; ``finished`` or crashed after its ``done`` (its recorded input, the
    committed file, still in the table)."""
    meta = tmp_path / "lake" / ".lakesink" / "events"
    journal = meta / "compactions"
    journal.mkdir(parents=True)
    (journal / "0000000000.json").write_text(json.dumps({"id": 0, "inputs": [] if finished else [
        {"path": "location=a/part-0000000000-run1-00000.parquet", "rows": 1, "bytes": 1}]}))
    (journal / "0000000000.outcome.json").write_text(json.dumps({"id": 0, "outcome": "done"}))
    if finished:
        (journal / "0000000000.finished.json").write_text(json.dumps(
            {"id": 0, "at": "2026-01-01T00:00:00+00:00"}))
    replaced = meta / "replaced" / "0000000000" / "location=a"
    replaced.mkdir(parents=True)
    pq.write_table(pa.table({"id": [7]}), replaced / "part-old.parquet")
    return replaced.parent


def test_a_parquet_vacuum_on_local_disk_deletes_without_spark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 41 item 7: a Parquet vacuum that deletes took 6 s of Spark start-up on the
    demo's lake; it takes the compactor lease and deletes through Python's filesystem
    calls (the same create-if-absent: a hard link) and leaves the lease released."""
    spec = _committed_lake(tmp_path, files=1)
    replaced = _finished_compaction(tmp_path, spec, finished=True)
    vacuumed = maintenance.without_spark("vacuum", spec, force=False, dry_run=False)
    assert vacuumed is not None, "a vacuum on local disk needs no Spark"
    assert (vacuumed["files_deleted"], vacuumed["compactions_vacuumed"]) == (1, [0])
    assert not replaced.exists()
    leases = sorted((tmp_path / "lake" / ".lakesink" / "events" / "compactor").glob("*.json"))
    assert leases and json.loads(leases[-1].read_text())["released"], leases
    again = maintenance.without_spark("vacuum", spec, force=False, dry_run=False)
    assert again is not None and again["files_deleted"] == 0
    # the CLI says what it did, with no Spark
    import lakesink.cli_tables

    def no_spark(*_: object, **__: object) -> None:
        raise AssertionError("the command started Spark")

    monkeypatch.setattr(lakesink.cli_tables, "session_of", no_spark)
    shown = CliRunner().invoke(app, ["vacuum", "-c", str(_config(tmp_path)), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)[0]["files_deleted"] == 0


def test_a_vacuum_on_local_disk_finishes_a_crashed_compaction_without_spark(
        tmp_path: Path) -> None:
    spec = _committed_lake(tmp_path, files=1)
    replaced = _finished_compaction(tmp_path, spec, finished=False)
    assert maintenance.without_spark("vacuum", spec, force=False, dry_run=True) is not None
    vacuumed = maintenance.without_spark("vacuum", spec, force=False, dry_run=False)
    assert vacuumed is not None and vacuumed["kept_in_grace"] == 1, vacuumed
    journal = tmp_path / "lake" / ".lakesink" / "events" / "compactions"
    assert (journal / "0000000000.finished.json").exists()
    assert (replaced / "location=a" / "part-0000000000-run1-00000.parquet").exists()
    assert not (tmp_path / "lake" / "events" / "location=a" /
                "part-0000000000-run1-00000.parquet").exists()


def test_python_writes_only_where_the_store_gives_create_if_absent(tmp_path: Path) -> None:
    spec = _spec(_config(tmp_path))
    fs = ArrowFS.open(spec.storage, str(tmp_path), writes=True)
    assert fs is not None and fs.writes
    target = f"file:{tmp_path}/a/b.json"
    assert fs.write_once(target, "1") and not fs.write_once(target, "2")
    assert fs.read_text(target) == "1"
    fs.write_text(target, "3")
    assert fs.read_text(target) == "3"
    with pytest.raises(OSError, match="not empty"):
        fs.delete(f"file:{tmp_path}/a", recursive=False)
    assert fs.delete(f"file:{tmp_path}/a") and not fs.delete(f"file:{tmp_path}/a")
    fs.write_text(target, "4")
    assert fs.rename(target, target + ".x") and not fs.exists(target)
    fs.write_text(target, "5")
    assert not fs.rename(target, target + ".x")  # an existing destination
    fs.replace(target, target + ".x")
    assert fs.read_text(target + ".x") == "5" and not fs.exists(target)
    from lakesink.runtime.arrow_fs import NeedsSpark

    on_azure = ArrowFS(fs.fs, object(), writes=True)  # type: ignore[arg-type]
    with pytest.raises(NeedsSpark):  # moves on Azure are ABFS's
        on_azure.replace(target + ".x", target)
    # pyarrow's S3 client has no conditional PUT: S3 is written through Spark
    assert ArrowFS.open(spec.storage, "s3a://bucket/lake", writes=True) is None


def test_a_compact_with_files_to_merge_takes_spark(tmp_path: Path) -> None:
    spec = _committed_lake(tmp_path, files=3)
    spec.config.maintenance.min_age_s = 0
    assert maintenance.without_spark("compact", spec) is None


def test_the_read_only_filesystem_refuses_writes(tmp_path: Path) -> None:
    spec = _spec(_config(tmp_path))
    fs = ArrowFS.open(spec.storage, str(tmp_path))
    assert fs is not None
    with pytest.raises(NotImplementedError):
        fs.delete(str(tmp_path / "x"))
    with pytest.raises(NotImplementedError):
        fs.write_once(str(tmp_path / "x"), "text")


def test_files_lists_what_the_bookkeeping_holds_after_a_compaction(tmp_path: Path) -> None:
    """audit-2 #5: a reader that globbed the manifests missed rolled-up batches and
    opened files a compaction had moved out. ``lakesink files`` (and
    ``maintenance.files``) lists what the table holds: compaction outputs instead of
    their inputs."""
    spec = _committed_lake(tmp_path, files=2)
    listed = maintenance.files(spec)
    assert listed is not None
    assert [f["path"] for f in listed["files"]] == [
        "location=a/part-0000000000-run1-00000.parquet",
        "location=a/part-0000000001-run1-00000.parquet"]
    journal = tmp_path / "lake" / ".lakesink" / "events" / "compactions"
    journal.mkdir(parents=True)
    inputs = [{"path": f["path"], "rows": 1, "bytes": f["bytes"]} for f in listed["files"]]
    (journal / "0000000000.json").write_text(json.dumps(
        {"id": 0, "output": "location=a/part-c0000000000-00000.parquet", "inputs": inputs}))
    (journal / "0000000000.outcome.json").write_text(json.dumps(
        {"id": 0, "outcome": "done", "outputs": [
            {"path": "location=a/part-c0000000000-00000.parquet", "rows": 2, "bytes": 9}]}))
    after = maintenance.files(spec)
    assert after is not None and after["rows"] == 2
    assert [f["path"] for f in after["files"]] == ["location=a/part-c0000000000-00000.parquet"]
    shown = CliRunner().invoke(app, ["files", "-c", str(_config(tmp_path))])
    assert shown.exit_code == 0, shown.output
    assert shown.output.strip().endswith("/events/location=a/part-c0000000000-00000.parquet")


def test_files_lists_a_delta_tables_log_without_spark(tmp_path: Path) -> None:
    """delta-rs answers the log's add actions with an arro3 table (not pyarrow's): the
    command read it as pyarrow and failed with an AttributeError on every Delta table."""
    path = _config(tmp_path)
    import yaml

    data = yaml.safe_load(path.read_text())
    data["table"]["format"] = "delta"
    path.write_text(yaml.safe_dump(data))
    table = tmp_path / "lake" / "events"
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "location": ["a", "a", "b"]})
    write_deltalake(str(table), rows, partition_by=["location"])
    write_deltalake(str(table), rows.slice(0, 1), partition_by=["location"], mode="append")
    listed = maintenance.files(_spec(path))
    assert listed is not None
    assert sorted(f["rows"] for f in listed["files"]) == [1, 1, 2]
    assert all(f["path"].startswith("location=") and f["bytes"] > 0 for f in listed["files"])
    shown = CliRunner().invoke(app, ["files", "-c", str(path)])
    assert shown.exit_code == 0, shown.output
    assert len([line for line in shown.output.splitlines() if line.endswith(".parquet")]) == 3


def test_a_roll_up_killed_between_its_write_and_its_deletes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """known-open T1: a vacuum that dies after writing a rollup and deleting only some of
    its per-batch manifests leaves batches in both. Every reader counts each batch once,
    repair finds nothing, each batch still reads as committed, and the next vacuum
    finishes the deletes."""
    import lakesink.tables.manifests as manifests_module
    from lakesink.tables.layout import TableLayout
    from lakesink.tables.manifests import read_manifest, rollup_path

    monkeypatch.setattr(manifests_module, "ROLLUP", 10)
    spec = _spec(_config(tmp_path))
    lake = tmp_path / "lake"
    folder = lake / "events" / "location=a"
    folder.mkdir(parents=True)
    runs = lake / ".lakesink" / "events" / "manifests" / "run1"
    runs.mkdir(parents=True)
    for b in range(25):  # ranges 0-9 and 10-19 complete, 20-24 the newest: not rolled up
        name = f"part-{b:010d}-run1-00000.parquet"
        pq.write_table(pa.table({"id": [b, b + 100]}), folder / name)
        (runs / f"{b:010d}.json").write_text(json.dumps({
            "batch_id": b, "app_id": "app1", "files": [{
                "path": f"location=a/{name}", "rows": 2,
                "bytes": (folder / name).stat().st_size}]}))
    deleted: list[str] = []
    real = ArrowFS.delete

    def killed_after_three(self: ArrowFS, path: str, *, recursive: bool = True) -> bool:
        if "/manifests/" in path and len(deleted) == 3:
            raise SystemExit("killed mid roll-up")
        deleted.append(path)
        return real(self, path, recursive=recursive)

    monkeypatch.setattr(ArrowFS, "delete", killed_after_three)
    with pytest.raises(SystemExit):
        maintenance.without_spark("vacuum", spec, force=False, dry_run=False)
    monkeypatch.setattr(ArrowFS, "delete", real)
    layout = TableLayout.of(str(lake), "events")
    fs = ArrowFS.open(spec.storage, str(lake))
    assert fs is not None and fs.exists(rollup_path(layout, "run1", 0))
    assert len(list(runs.glob("0*.json"))) == 22  # 3 of the first range's 10 deleted
    listed = maintenance.files(spec)
    assert listed is not None and listed["rows"] == 50 and len(listed["files"]) == 25
    repaired = maintenance.without_spark("repair", spec, apply=False)
    assert repaired is not None and repaired["problems"] == 0, repaired
    assert all(read_manifest(fs, layout, "run1", b) for b in range(25))
    again = maintenance.without_spark("vacuum", spec, force=False, dry_run=False)
    assert again is not None and again["manifests_rolled_up"] == 17  # 7 left + 10
    assert sorted(p.name for p in runs.iterdir()) == [
        *(f"{b:010d}.json" for b in range(20, 25)),
        "rollup-0000000000.json", "rollup-0000000001.json"]
    final = maintenance.files(spec)
    assert final is not None and final["rows"] == 50 and len(final["files"]) == 25


def test_a_roll_back_cut_off_between_its_deletes_is_done_again(tmp_path: Path) -> None:
    """A roll-back killed after ``aborted`` and before deleting the output left that
    output beside its inputs for good (``aborted`` counted as the end): listing readers
    counted its rows twice. A roll-back now ends with ``finished``; one without it is
    done again by the next resume."""
    spec = _committed_lake(tmp_path, files=1)
    journal = tmp_path / "lake" / ".lakesink" / "events" / "compactions"
    journal.mkdir(parents=True)
    output = "location=a/part-c0000000000-00000.parquet"
    (journal / "0000000000.json").write_text(json.dumps({"id": 0, "output": output,
                                                         "inputs": []}))
    (journal / "0000000000.outcome.json").write_text(json.dumps({"id": 0,
                                                                 "outcome": "aborted"}))
    pq.write_table(pa.table({"id": [0]}), tmp_path / "lake" / "events" / output)
    checked = maintenance.without_spark("repair", spec, apply=False)
    assert checked is not None and checked["unfinished_compactions"] == [0], checked
    vacuumed = maintenance.without_spark("vacuum", spec, force=False, dry_run=False)
    assert vacuumed is not None
    assert not (tmp_path / "lake" / "events" / output).exists()
    assert json.loads((journal / "0000000000.finished.json").read_text())["rolled_back"]
