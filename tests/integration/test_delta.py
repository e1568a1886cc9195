"""Delta tables: exactly once, partition validation, and independent readers."""

from __future__ import annotations

import json

import pytest

from lakesink.errors import LayoutError
from lakesink.local.services import produce
from tests.fixtures.services import ENGINE, config_dict, delta_ids, produce_events
from tests.integration.test_ingest import BAD_RECORDS, run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def test_delta_every_record_once_read_by_delta_rs_and_spark(spark, kafka_broker, topic,
                                                            tmp_path) -> None:
    from deltalake import DeltaTable

    n = 2000
    produce(kafka_broker.bootstrap_servers, topic, [
        (b"k", json.dumps({"id": i, "location": ["oslo", "lima"][i % 2],
                           "ts_ms": 1795000000000 + i * 60_000, "value": i / 4,
                           "at": "2026-11-25T07:05:09.123456Z"}).encode())
        for i in range(n)])
    produce(kafka_broker.bootstrap_servers, topic, [(k, v) for k, v, _ in BAD_RECORDS])
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format="delta", delta_checkpoint_interval=2)
    data["decode"]["schema"].append({"name": "at", "type": "Timestamp"})
    data["source"]["kafka"]["max_offsets_per_trigger"] = 800
    stats = run_once(spark, data)
    assert stats.written == n and stats.rejected == len(BAD_RECORDS)

    table = lake / "events"
    ids = delta_ids(table)
    assert len(ids) == n and sorted(ids) == list(range(n))
    dt = DeltaTable(str(table))
    assert dt.metadata().partition_columns == ["location", "year", "month", "day"]
    # one commit per batch, each carrying our transaction id (the exactly-once key)
    app_id = json.loads((lake / ".lakesink/events/checkpoint/lakesink.json").read_text())["app_id"]
    assert dt.transaction_version(app_id) == stats.batches - 1
    txns = [json.loads(line)["txn"] for entry in sorted((table / "_delta_log").glob("*.json"))
            for line in entry.read_text().splitlines() if '"txn"' in line]
    assert [(t["appId"], t["version"]) for t in txns] == [
        (app_id, b) for b in range(stats.batches)]
    # (the Arrow path creates the table with an empty first commit: version 0 holds no batch)
    assert dt.version() == stats.batches - (ENGINE == "spark")
    # a log checkpoint every 2 commits, as configured
    assert list((table / "_delta_log").glob("*.checkpoint.parquet"))
    # microsecond timestamps that every engine reads
    at_type = dt.to_pyarrow_table(columns=["at"]).schema.field("at").type
    assert str(at_type).startswith("timestamp[us"), at_type
    sdf = spark.read.format("delta").load(str(table))
    assert sdf.count() == n and sdf.select("id").distinct().count() == n
    assert str(sdf.where("id = 0").first()["at"]) == "2026-11-25 07:05:09.123456"


def test_delta_partition_change_is_refused(spark, kafka_broker, topic, tmp_path) -> None:
    produce_events(kafka_broker, topic, range(10))
    lake = tmp_path / "lake"
    run_once(spark, config_dict(kafka_broker, topic, lake, format="delta"))
    version_before = len(list((lake / "events" / "_delta_log").glob("*.json")))
    produce_events(kafka_broker, topic, range(10, 20))
    with pytest.raises(LayoutError) as info:
        run_once(spark, config_dict(kafka_broker, topic, lake, format="delta",
                                    partition_by=["location"]))
    assert info.value.key == "table.partition_by"
    assert "['location', 'year', 'month', 'day']" in str(info.value)
    assert len(list((lake / "events" / "_delta_log").glob("*.json"))) == version_before


def test_existing_delta_table_without_lakesink_record_is_checked(spark, kafka_broker, topic,
                                                                  tmp_path) -> None:
    """A Delta table made by someone else: its own partition columns are authoritative."""
    table = tmp_path / "lake" / "events"
    spark.createDataFrame([(1, "x")], "id long, kind string").write.format("delta") \
        .partitionBy("kind").save(str(table))
    with pytest.raises(LayoutError) as info:
        run_once(spark, config_dict(kafka_broker, topic, tmp_path / "lake", format="delta"))
    assert "partitioned by ['kind']" in str(info.value)


def test_format_change_is_refused(spark, kafka_broker, topic, tmp_path) -> None:
    produce_events(kafka_broker, topic, range(5))
    lake = tmp_path / "lake"
    run_once(spark, config_dict(kafka_broker, topic, lake))
    with pytest.raises(LayoutError) as info:
        run_once(spark, config_dict(kafka_broker, topic, lake, format="delta"))
    assert info.value.key == "table.format"
    assert "is parquet, config says delta" in str(info.value)


def _two_writers(spark, tmp_path):  # noqa: ANN001, ANN202
    """Two Delta writers of one app id on a new table (files committed by delta-rs),
    its folder, and a helper that writes a Parquet file of ids into it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakesink.tables.delta import DeltaTableWriter
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(str(tmp_path / "lake"), "events")
    a, b = (DeltaTableWriter(spark, layout, app_id="app-1", partition_by=[],
                               task_filesystem=("local", {}))
            for _ in range(2))
    a.ensure_table(lambda: spark.createDataFrame([], "id long"))
    root = tmp_path / "lake" / "events"

    def staged(name: str, ids: list[int]) -> tuple[str, int, int, None]:
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), root / name)
        return name, len(ids), (root / name).stat().st_size, None

    return a, b, root, staged


def test_a_batch_two_writers_commit_from_files_lands_once(spark, tmp_path) -> None:
    """The second-writer window of the Arrow path's Delta commit: writer B (a successor)
    commits batch 0 while writer A (a zombie with the same app id, which never saw that
    commit) still has it in hand. A's later ``commit_files`` must see the batch's txn in
    the log and commit nothing: delta-rs itself does not refuse an old txn version."""
    a, b, root, staged = _two_writers(spark, tmp_path)

    done = b.commit_files(0, [staged("part-b.parquet", [1, 2, 3])], {"written": 3})
    late = a.commit_files(0, [staged("part-a.parquet", [1, 2, 3])], {"written": 3})
    assert not done.skipped and late.skipped
    assert sorted(delta_ids(root)) == [1, 2, 3]
    assert spark.read.format("delta").load(str(root)).count() == 3


def test_a_delta_rs_commit_whose_version_was_taken_reads_the_log_again(spark,
                                                                       tmp_path) -> None:
    """The window between the Arrow path's txn check and its delta-rs put: another
    commit lands there (injected through the lease check, the last step before the
    put), so the version the put wants is taken. lakesink then reads the log again
    itself: a foreign commit is followed (the batch lands at the next version), a commit
    of the same batch (a zombie's, or our own put whose response was lost) ends it.
    (delta-rs' own retry, turned off, fails with "concurrent transaction" on the latter,
    and the whole batch would be redone; with neither, the commit fails.)"""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    a, b, root, staged = _two_writers(spark, tmp_path)

    def once(action):  # noqa: ANN001, ANN202 - runs ``action`` at the first lease check
        pending = [action]
        return lambda: pending and pending.pop()()

    a.fence = once(lambda: write_deltalake(  # another app's append, in a's window
        str(root), pa.table({"id": pa.array([100], pa.int64())}), mode="append"))
    assert not a.commit_files(0, [staged("part-a0.parquet", [1, 2])], {"written": 2}).skipped
    a.fence = once(lambda: b.commit_files(1, [staged("part-b1.parquet", [3])], {"written": 1}))
    assert a.commit_files(1, [staged("part-a1.parquet", [3])], {"written": 1}).skipped
    table = DeltaTable(str(root))
    assert (table.version(), table.transaction_version("app-1")) == (3, 1)
    assert sorted(delta_ids(root)) == [1, 2, 3, 100]


def test_a_stale_spark_writer_whose_append_delta_skips_does_not_wait_forever(
        spark, tmp_path) -> None:
    """audit-2 #22: writer A passed its "already committed?" check, then B committed the
    same (app id, batch); Delta skips A's append by its txn and runs no job, so the
    batch's observation never reports. ``Observation.get`` would block A for good (a
    py4j wait no signal interrupts); lakesink's read gives up and counts again."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from lakesink.pipeline.marker import observation_values

    a, b, root, _ = _two_writers(spark, tmp_path)
    rows = spark.range(1, 4).select(F.col("id"))
    b_first = [lambda: b.write_batch(0, rows)]
    a.fence = lambda: b_first and b_first.pop()()  # B commits in A's window
    observation = Observation("stale_a")
    seen: dict = {}

    def commit_info() -> dict:
        seen["values"] = observation_values(observation, wait_s=1.0)
        return {}

    result = a.write_batch(0, rows.observe(observation, F.count(F.lit(1)).alias("records")),
                           commit_info=commit_info)
    # A sees that the commit is not its append (its attempt id is in no new log entry):
    # the batch is a replay (A's lease, if it had one, is proved first), and nothing
    # waits for the count of a job that never ran
    assert result.skipped and "values" not in seen
    assert observation_values(observation, wait_s=1.0) == {}, "a job ran for it?"
    assert sorted(delta_ids(root)) == [1, 2, 3]
    assert spark.read.format("delta").load(str(root)).count() == 3


_RETENTION = "spark.databricks.delta.properties.defaults.logRetentionDuration"


@pytest.mark.parametrize(("task_filesystem", "defaults", "maker"), [
    (("local", {}), {}, "delta-rs"),  # a store delta-rs reaches
    ("a store only Hadoop reaches", {}, "Apache-Spark"),  # Delta's table builder
    # the session's defaults for new tables, which delta-rs would not apply
    (("local", {}), {_RETENTION: "interval 45 days"}, "Apache-Spark"),
])
def test_a_table_created_from_the_driver_is_the_one_spark_s_first_append_makes(
        spark, tmp_path, task_filesystem, defaults, maker) -> None:
    """The Arrow path creates a new Delta table from the driver (delta-rs where it
    reaches the store and the session sets no defaults for new tables, else Delta's
    table builder; no Spark job). Its first log entry must hold the protocol and
    metadata Spark's own first append of the same zero rows commits: columns made
    nullable (nested ones too), partition columns, table properties (an optional field
    delta-rs writes as null, Spark leaves out)."""
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("id", T.LongType(), False),
        T.StructField("at", T.TimestampType(), True),
        T.StructField("payload", T.StructType([
            T.StructField("name", T.StringType(), False),
            T.StructField("tags", T.ArrayType(T.StringType(), False), False),
            T.StructField("attrs", T.MapType(T.StringType(), T.DoubleType(), False))])),
        T.StructField("raw", T.BinaryType(), False),
        T.StructField("day", T.StringType(), False)])
    tables, tasks = {}, {}
    for key, value in defaults.items():
        spark.conf.set(key, value)
    try:
        _make_both(spark, tmp_path, schema, task_filesystem, maker, tables, tasks)
    finally:
        for key in defaults:
            spark.conf.unset(key)
    for actions in tables.values():
        for volatile in ("id", "createdTime"):
            actions["metaData"].pop(volatile)
        actions["metaData"] = {k: v for k, v in actions["metaData"].items()
                               if v is not None}
    assert tables["driver"] == tables["append"]
    assert tasks["append"] > 0 and tasks["driver"] == 0  # no task slot taken
    assert tables["driver"]["metaData"]["partitionColumns"] == ["day"]
    assert tables["driver"]["metaData"]["configuration"] == {
        "delta.checkpointInterval": "25",
        **{"delta.logRetentionDuration": v for v in defaults.values()}}
    fields = json.loads(tables["driver"]["metaData"]["schemaString"])["fields"]
    assert all(f["nullable"] for f in fields)


def _make_both(spark, tmp_path, schema, task_filesystem, maker, tables, tasks) -> None:
    """Spark's first append of zero rows, and the writer's table made from the driver,
    each in a folder of its own: their first log entries' protocol and metadata."""
    from lakesink.tables.delta import DeltaTableWriter
    from lakesink.tables.layout import TableLayout

    empty = spark.createDataFrame([], schema)
    tracker = spark.sparkContext.statusTracker()
    for how in ("append", "driver"):
        layout = TableLayout.of(str(tmp_path / how), "events")
        writer = DeltaTableWriter(spark, layout, app_id="app-1", partition_by=["day"],
                                  checkpoint_interval=25, task_filesystem=task_filesystem)
        group = f"{tmp_path.name}-{how}"
        spark.sparkContext.setJobGroup(group, how)
        try:
            if how == "append":
                writer._spark_writer(empty, exists=False).save(layout.table)
            else:
                assert writer.create_table(schema)
                assert writer.create_table(schema)  # once made, made: nothing more
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
        stages = [tracker.getStageInfo(s) for job in jobs if job for s in job.stageIds]
        tasks[how] = sum(stage.numTasks for stage in stages if stage)
        log = sorted((tmp_path / how / "events" / "_delta_log").glob("*.json"))
        assert len(log) == 1, log
        actions = [json.loads(line) for line in log[0].read_text().splitlines()]
        tables[how] = {k: a[k] for a in actions for k in ("protocol", "metaData") if k in a}
        if how == "driver":
            (info,) = [a["commitInfo"] for a in actions if "commitInfo" in a]
            assert info["engineInfo"].startswith(maker), info


def test_a_table_another_writer_makes_first_keeps_its_batches_committed(
        spark, tmp_path) -> None:
    """Two writers of one app id on one new path: the second makes the table and
    commits batch 0 between the first's look ("no table yet") and its table builder,
    which then makes nothing. The first must still see batch 0 committed (not write
    it again), as the log says."""
    from lakesink.tables.delta import DeltaTableWriter
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(str(tmp_path), "events")
    first, second = (DeltaTableWriter(spark, layout, app_id="app-1", partition_by=[],
                                      task_filesystem=("local", {}))
                     for _ in range(2))
    rows = spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string")
    build = first.create_table

    def late(schema):  # noqa: ANN001, ANN202
        second.write_batch(0, rows)  # the other writer, in the window
        return build(schema)

    first.create_table = late
    assert not first.is_committed(0)  # the first look: no table yet
    first.ensure_table(lambda: rows.limit(0), at_start=True)
    assert first.is_committed(0), "batch 0 would be written twice"
    assert sorted(delta_ids(tmp_path / "events")) == [1, 2]
    # without a race: no batch, told by delta-rs' view of the log, with no Spark job
    # (the table's state rebuilt for its transactions would be one, in the first batch)
    plain = DeltaTableWriter(spark, TableLayout.of(str(tmp_path / "plain"), "events"),
                             app_id="app-1", partition_by=[], task_filesystem=("local", {}))
    plain.ensure_table(lambda: rows.limit(0), at_start=True)
    tracker = spark.sparkContext.statusTracker()
    group = f"{tmp_path.name}-plain"
    spark.sparkContext.setJobGroup(group, "first look")
    try:
        assert not plain.is_committed(0)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert list(tracker.getJobIdsForGroup(group)) == []


@pytest.mark.parametrize("maker", ["delta-rs", "Delta's builder"])
def test_another_writer_s_version_0_during_the_make_is_seen(spark, tmp_path, monkeypatch,
                                                           maker) -> None:
    """The race of the test above, inside the maker (helper-23): the other writer of
    this app id commits version 0 (batch 0) while delta-rs makes the table, and
    delta-rs' create is refused ("made meanwhile"); or, with records that take Spark's
    writer, Delta's builder makes nothing because the table is there. Either way the
    first writer must see batch 0 committed, from whichever view it reads."""
    import lakesink.tables.delta as delta_module
    from lakesink.tables.delta import DeltaTableWriter
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(str(tmp_path), "events")
    arrow = maker == "delta-rs"
    first, second = (DeltaTableWriter(spark, layout, app_id="app-1", partition_by=[],
                                      arrow_records=arrow, task_filesystem=("local", {}))
                     for _ in range(2))
    rows = spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string")
    calls = []
    if arrow:
        def refused(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls.append(maker)
            second.write_batch(0, rows)
            raise RuntimeError("Version 0 already exists")  # as delta-rs would refuse

        monkeypatch.setattr(delta_module, "create_by_delta_rs", refused)
    else:
        build = delta_module.build_table

        def late(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls.append(maker)
            second.write_batch(0, rows)
            return build(*args, **kwargs)  # createIfNotExists: makes nothing

        monkeypatch.setattr(delta_module, "build_table", late)
    assert not first.is_committed(0)  # the first look: no table yet
    first.ensure_table(lambda: rows.limit(0), at_start=True)
    assert calls == [maker]
    assert first.is_committed(0), "batch 0 would be written twice"
    assert first.write_batch(0, rows).skipped
    assert sorted(delta_ids(tmp_path / "events")) == [1, 2]


def test_delta_rs_reads_the_batches_a_spark_written_checkpoint_holds(spark, tmp_path
                                                                       ) -> None:
    """A restart's "which batches are committed" comes from delta-rs' view of the log
    (helper-23): it must read this app id's txn from a checkpoint Spark's writer wrote,
    with the log entries before it gone (log clean-up), or a replayed batch would be
    committed twice."""
    from lakesink.tables.delta import DeltaTableWriter
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(str(tmp_path), "events")
    spark_side = DeltaTableWriter(spark, layout, app_id="app-1", partition_by=[],
                                  checkpoint_interval=2, arrow_records=False,
                                  task_filesystem=("local", {}))
    for batch in range(3):  # versions 0..2, a checkpoint at 2, all by Spark's writer
        rows = spark.createDataFrame([(batch * 2, "a"), (batch * 2 + 1, "b")],
                                     "id long, name string")
        assert not spark_side.write_batch(batch, rows).skipped
    log = tmp_path / "events" / "_delta_log"
    assert (log / f"{2:020d}.checkpoint.parquet").exists()
    for version in range(3):  # the txn is now only in the checkpoint
        (log / f"{version:020d}.json").unlink()
    restarted = DeltaTableWriter(spark, layout, app_id="app-1", partition_by=[],
                                 task_filesystem=("local", {}))
    assert restarted.log_view() is not None  # delta-rs answers, not Delta's reader
    assert restarted.committed_version() == 2
    assert restarted.is_committed(2) and not restarted.is_committed(3)
    assert sorted(delta_ids(tmp_path / "events")) == list(range(6))


def test_a_table_whose_log_is_gone_is_refused_at_start_not_made_again(spark, tmp_path
                                                                      ) -> None:
    """A Delta table holding a batch of an app id (a checkpoint) carries that app id's
    mark in its lakesink folder, written right after its first commit (a table only
    made, from the driver for the Arrow path, has none: a start killed before its
    first batch is not refused). Its ``_delta_log`` deleted, the checkpoint's next
    start is refused (exit 2, naming what to do) instead of making an empty table at
    the folder while the checkpoint reads on past the lost rows' records; so is it
    when another app id (a ``dlq replay``, another checkpoint) has made the table
    again since (stop 61's read-through: that start went on, the rows were lost). A
    new checkpoint (another app id) is not refused, nor is the old one once its mark
    is removed, as the message says."""
    import shutil
    from pathlib import Path

    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from lakesink.tables.delta import COMMITTED_MARKS, DeltaTableWriter
    from lakesink.tables.layout import TableLayout

    def writer(name: str, *, arrow: bool, app_id: str = "app-1") -> DeltaTableWriter:
        return DeltaTableWriter(spark, TableLayout.of(str(tmp_path), name), app_id=app_id,
                                partition_by=[], arrow_records=arrow,
                                task_filesystem=("local", {}))

    def mark(name: str) -> Path:
        return tmp_path / ".lakesink" / name / COMMITTED_MARKS / "app-1.json"

    def refused(name: str, now: str) -> None:
        with pytest.raises(LayoutError) as refusal:
            writer(name, arrow=True).prepare()
        said = str(refusal.value)
        assert refusal.value.key == "table.name" and f"{now}, but this checkpoint (app " \
            "id app-1) committed to it before" in said, said
        assert f"restore the _delta_log to keep them; or, to go on without them, delete " \
            f"file://{mark(name)}" in said, said

    rows = spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string")
    names = ("spark_made", "driver_made", "made_again")
    made = {name: writer(name, arrow=name != "spark_made") for name in names}
    for name in names:
        made[name].prepare()  # a new table: nothing to refuse
    made["driver_made"].ensure_table(lambda: rows.limit(0), at_start=True)
    for name in names:  # no batch yet: no mark
        assert not mark(name).exists(), name
    for name in names:
        assert not made[name].write_batch(0, rows).skipped
        assert mark(name).is_file(), name
        made[name].close()
        shutil.rmtree(tmp_path / name / "_delta_log")
    refused("spark_made", "has no Delta commit")
    refused("driver_made", "has no Delta commit")
    # another app id makes the table again (delta-rs: this JVM's Delta caches the
    # deleted log), as a `dlq replay` of the rejected rows would
    write_deltalake(str(tmp_path / "made_again"), pa.table({"id": [3], "name": ["c"]}),
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id="dlq-x", version=0)]))
    refused("made_again", "has Delta commits, none of this checkpoint (app id app-1)")
    # not refused: a new checkpoint, and the old one unmarked
    writer("spark_made", arrow=True, app_id="app-2").prepare()
    mark("spark_made").unlink()
    writer("spark_made", arrow=True).prepare()


def test_delta_s_classes_are_loaded_ahead_once_per_jvm(spark, tmp_path, monkeypatch,
                                                        caplog) -> None:
    """At start, a thread makes (and removes) a throwaway Delta table so the first real
    Delta operation does not wait for the class loading; once per JVM, nothing left."""
    import glob
    import logging
    import tempfile

    from lakesink.tables import delta_create as delta

    monkeypatch.setattr(delta, "_LOADED", set())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="lakesink.tables.delta_create"):
        thread = delta.load_classes(spark)
        assert thread is not None
        thread.join(60)
    assert any("classes loaded ahead" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    assert glob.glob(str(tmp_path / "lakesink-delta-classes-*")) == []
    assert delta.load_classes(spark) is None  # once per JVM
