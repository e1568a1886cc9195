"""The lake on S3: a real S3 server (SeaweedFS on 127.0.0.1) through Hadoop S3A,
configured the way the Quix connector is (S3_BUCKET, S3_PREFIX, AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), read back by DuckDB (httpfs),
delta-rs and Spark."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from lakesink.app import Pipeline
from lakesink.config import load_config
from lakesink.local.services import produce
from tests.fixtures.runs import flatten, run_once
from tests.fixtures.services import (
    ENGINE,
    config_dict,
    delta_rs_s3_options,
    duckdb_s3,
    json_events,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]

_prefix = itertools.count()


def _env(server: Any, prefix: str) -> dict[str, str]:  # noqa: ANN401
    return {**server.env(), "S3_BUCKET": server.bucket, "S3_PREFIX": prefix}


def run_s3(spark, data: dict[str, Any], env: dict[str, str]) -> Any:  # noqa: ANN001, ANN401
    return run_once(spark, data, env)


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_s3_end_to_end_with_the_quix_settings(spark, kafka_broker, s3_server, topic, tmp_path,
                                              fmt) -> None:
    prefix = f"e2e-{next(_prefix)}-{fmt}"
    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(300)) + [(b"k", b"not json")])
    data = config_dict(kafka_broker, topic, tmp_path / "unused", format=fmt)
    data["table"].pop("base_path")  # S3_BUCKET / S3_PREFIX say where the lake is
    env = _env(s3_server, prefix)
    cfg = load_config(flags=flatten(data), env=env)
    assert cfg.table.base_path == f"s3a://lake/{prefix}"
    assert cfg.storage.s3.endpoint == s3_server.endpoint
    stats = run_s3(spark, data, env)
    assert (stats.written, stats.rejected) == (300, 1)

    table = f"s3://lake/{prefix}/events"
    duck = duckdb_s3(s3_server)
    if fmt == "delta":
        from deltalake import DeltaTable

        ids = DeltaTable(table, storage_options=delta_rs_s3_options(s3_server)).to_pyarrow_table(
            columns=["id"]).column("id").to_pylist()
        spark_ids = [r[0] for r in spark.read.format("delta").load(
            table.replace("s3://", "s3a://")).select("id").collect()]
    else:
        ids = [r[0] for r in duck.sql(
            f"SELECT id FROM read_parquet('{table}/**/*.parquet', hive_partitioning=true)"
        ).fetchall()]
        spark_ids = [r[0] for r in spark.read.parquet(table).select("id").collect()]
    assert sorted(ids) == list(range(300))
    assert sorted(spark_ids) == list(range(300))
    bad = duck.sql(
        f"SELECT reason FROM read_parquet('s3://lake/{prefix}/_rejected/events/*.parquet')"
    ).fetchall()
    assert bad == [("malformed_json",)]

    # a second run appends only what is new (the checkpoint is on S3 too)
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(300, 350)))
    assert run_s3(spark, data, env).written == 50
    if fmt == "delta":
        from deltalake import DeltaTable

        dt = DeltaTable(table, storage_options=delta_rs_s3_options(s3_server))
        assert sorted(dt.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == list(
            range(350))
        # every batch came through delta-rs commits (the Arrow path), not Spark's writer
        by_delta_rs = sum(int(h.get("lakesink.rows", 0)) for h in dt.history())
        assert by_delta_rs == (0 if ENGINE == "spark" else 350)


@pytest.mark.parametrize("where", ["s3", "local"])
def test_write_once_is_conditional(spark, s3_server, tmp_path, where) -> None:
    from lakesink.config.storage import S3Storage
    from lakesink.runtime.storage import s3a_options
    from lakesink.tables.fs import HadoopFS

    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_options(S3Storage(**_s3_keys(s3_server))).items():
        conf.set(key, value)
    root = f"s3a://lake/once-{next(_prefix)}" if where == "s3" else tmp_path.as_uri()
    fs = HadoopFS(spark, root)
    assert fs.write_once(f"{root}/m/1.json", "first") is True
    assert fs.write_once(f"{root}/m/1.json", "second") is False
    assert fs.read_text(f"{root}/m/1.json") == "first"


def _s3_keys(server: Any) -> dict[str, Any]:  # noqa: ANN401
    return {"endpoint": server.endpoint, "access_key_id": server.access_key,
            "secret_access_key": server.secret_key}


def test_a_second_writer_on_one_checkpoint_is_refused(spark, s3_server, monkeypatch) -> None:
    """Another process commits the same batch while this one publishes it: the manifest's
    conditional PUT fails and the batch stops with an error naming the cause, instead of
    both commits counting."""
    import json

    from lakesink.errors import SecondWriterError
    from lakesink.tables import parquet
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(f"s3a://lake/race-{next(_prefix)}", "events")
    writer = parquet.ParquetTableWriter(spark, layout, app_id="a" * 32, partition_by=[])
    writer.prepare()

    def other_writer_commits(name: str, batch_id: int | None = None) -> None:
        if name == "after_publish":
            writer.fs.write_once(layout.manifest(writer.run, batch_id or 0),
                                 json.dumps({"by": "the other writer"}))

    monkeypatch.setattr(parquet, "fault_point", other_writer_commits)
    with pytest.raises(SecondWriterError, match="two lakesink processes share this checkpoint"):
        writer.write_batch(0, spark.range(10).withColumnRenamed("id", "x"))
    assert json.loads(writer.fs.read_text(layout.manifest(writer.run, 0)))["by"] == (
        "the other writer")


def test_a_second_delta_writer_on_s3_is_refused(spark, kafka_broker, s3_server, topic,
                                                tmp_path) -> None:
    """Delta on S3 with the single-driver log store: a writer lease refuses a second
    writer (another checkpoint on the same table) while the first holds the table, and
    takes over a lease whose holder is gone."""
    import json
    import os
    import socket
    import subprocess
    import sys
    import threading

    from lakesink.errors import ConfigError
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.lease import BOOT_ID, PID_NAMESPACE, SecondWriterError, WriterLease

    prefix = f"lease-{next(_prefix)}"
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(50)))
    data = config_dict(kafka_broker, topic, tmp_path / "unused", format="delta")
    data["table"].pop("base_path")
    env = _env(s3_server, prefix)
    first = Pipeline.build(load_config(flags=flatten(data), env=env), spark)
    # another checkpoint on the table the first writes: once the first has committed, its
    # txn refuses a start from earliest (table.other_writers); this test is the lease's
    other = {**data, "checkpoint": f"s3a://lake/{prefix}/other-checkpoint",
             "table": {**data["table"], "other_writers": "ignore"}}
    with pytest.raises(SecondWriterError) as refused:
        Pipeline.build(load_config(flags=flatten(other), env=env), spark)
    assert f"pid {os.getpid()}" in str(refused.value)
    assert "another lakesink" in str(refused.value)
    assert first.run(until_caught_up=True).written == 50  # the holder goes on, and releases
    fs = HadoopFS(spark, f"s3a://lake/{prefix}")
    steps = WriterLease(fs, f"s3a://lake/{prefix}/.lakesink/events/writer", app_id="t",
                        ttl_s=60, table="events")

    def newest() -> tuple[int, dict]:
        found = steps.newest()
        assert found is not None
        return found

    def put(record: dict) -> None:
        seq = newest()[0] + 1
        assert fs.write_once(steps._path(seq), json.dumps(record))

    assert newest()[1]["released"] is True

    # a lease left by a crashed process on this host is taken over at once
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {"writer": "x", "app_id": "old", "host": socket.gethostname(), "pid": dead.pid,
             "pidns": PID_NAMESPACE, "boot": BOOT_ID, "ttl_s": 600, "released": False}
    put(stale)
    second = Pipeline.build(load_config(flags=flatten(other), env=env), spark)
    assert newest()[1]["pid"] == os.getpid() and not newest()[1]["released"]
    second.processor.close()
    assert newest()[1]["released"] is True
    # a start refused after the table's lease was taken (a silence key that does not
    # resolve) releases it, and the silence table's own lease too
    bad = {**other, "silence": {"timeout_ms": 10_000, "table": "silent", "key": "no_such"}}
    with pytest.raises(ConfigError, match="silence.key"):
        Pipeline.build(load_config(flags=flatten(bad), env=env), spark)
    assert newest()[1]["released"] is True
    silent = WriterLease(fs, f"s3a://lake/{prefix}/.lakesink/silent/writer", app_id="t",
                         ttl_s=60, table="silent").newest()
    assert silent is None or silent[1]["released"] is True
    # a lease of another machine that keeps renewing is respected
    put({**stale, "host": "elsewhere", "pid": 1, "ttl_s": 3})
    renewer = threading.Timer(1.5, lambda: put({**stale, "host": "elsewhere", "pid": 1,
                                                 "ttl_s": 3}))
    renewer.start()
    with pytest.raises(SecondWriterError, match="host elsewhere"):
        Pipeline.build(load_config(flags=flatten(other), env=env), spark)
    renewer.join()
    # ... and one that stopped renewing is taken over after its TTL (on our clock)
    taken = Pipeline.build(load_config(flags=flatten(other), env=env), spark)
    assert newest()[1]["pid"] == os.getpid()
    taken.processor.close()


def test_dynamodb_log_store_needs_its_jar(spark, kafka_broker, s3_server, topic,
                                          tmp_path) -> None:
    from lakesink.errors import ConfigError
    from lakesink.runtime import storage

    data = config_dict(kafka_broker, topic, tmp_path / "unused", format="delta")
    data["table"].pop("base_path")
    data["storage"] = {"s3": {"delta_log_store": "dynamodb", "dynamodb_table": "locks"}}
    cfg = load_config(flags=flatten(data), env=_env(s3_server, f"ddb-{next(_prefix)}"))
    conf = storage.spark_conf(cfg.storage)
    assert conf["spark.delta.logStore.s3a.impl"] == "io.delta.storage.S3DynamoDBLogStore"
    assert conf["spark.io.delta.storage.S3DynamoDBLogStore.ddb.tableName"] == "locks"
    assert storage.writer_lease_s(cfg.storage, cfg.table) == 0  # several writers: no lease
    with pytest.raises(ConfigError) as err:
        Pipeline.build(cfg, spark)
    assert err.value.key == "storage.s3.delta_log_store"


def test_delta_rs_commits_on_s3_are_conditional(kafka_broker, s3_server, topic,
                                                 tmp_path) -> None:
    """The Arrow path's Delta commits on S3 use lakesink's delta-rs options, with a
    conditional put of the log entry (``aws_conditional_put: etag``; SeaweedFS honours
    ``If-None-Match``, see ``test_write_once_is_conditional``): a writer whose view of
    the table is stale (it saw version 0) must not replace version 1; it commits version
    2, and no row is lost. (Sequential: it does not race two puts.)"""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from lakesink.runtime.storage import delta_task_filesystem
    from lakesink.tables.delta_files import delta_rs_s3_options as options_for

    prefix = f"race-{next(_prefix)}"
    data = config_dict(kafka_broker, topic, tmp_path / "unused", format="delta")
    data["table"].pop("base_path")
    cfg = load_config(flags=flatten(data), env=_env(s3_server, prefix))
    kind, kwargs = delta_task_filesystem(cfg.storage, cfg.table.base_path)
    assert kind == "s3"
    options = options_for(kwargs)
    assert options["aws_conditional_put"] == "etag"
    uri = f"s3://lake/{prefix}/race"
    write_deltalake(uri, pa.table({"id": [0]}), storage_options=options)
    first, second = (DeltaTable(uri, storage_options=options) for _ in range(2))
    write_deltalake(first, pa.table({"id": [1]}), mode="append")
    write_deltalake(second, pa.table({"id": [2]}), mode="append")  # also saw version 0
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [0, 1, 2]


def test_delta_rs_commits_racing_at_one_instant_on_s3_each_land_once(s3_server) -> None:
    """known-open T6: writers that all saw version 0 put their log entries at one
    instant (a barrier; delta-rs works outside the GIL): SeaweedFS' conditional put
    lets one take each version, the others see the conflict and try the next one, so
    every commit lands once, in its own version, and no row is lost or doubled. (The
    race is real: all commits are under way before the first ends, and the losers take
    a retry's backoff. Not shown: that delta-rs' unconditional S3 mode would lose one;
    its check-then-copy window was not hit here either.)"""
    import threading
    import time

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from lakesink.tables.delta_files import delta_rs_s3_options

    options = delta_rs_s3_options({
        "endpoint_override": s3_server.endpoint.split("://", 1)[1], "scheme": "http",
        "access_key": s3_server.access_key, "secret_key": s3_server.secret_key})
    uri = f"s3://lake/race-{next(_prefix)}/at-once"
    write_deltalake(uri, pa.table({"id": [0]}), storage_options=options)
    writers = 6
    handles = [DeltaTable(uri, storage_options=options) for _ in range(writers)]
    barrier, errors, spans = threading.Barrier(writers), [], []

    def append(i: int) -> None:
        try:
            barrier.wait()
            began = time.monotonic()
            write_deltalake(handles[i], pa.table({"id": [i + 1]}), mode="append")
            spans.append((began, time.monotonic()))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert max(b for b, _ in spans) < min(e for _, e in spans)  # they did race
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == writers
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(
        range(writers + 1))
