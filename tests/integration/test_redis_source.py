"""Redis streams and lists -> Parquet and Delta through Spark, with a real redis-server;
read back by DuckDB, delta-rs and Spark: every entry once, bad entries in the dead-letter
table with the stream key and entry id, the consumer group moved to what was written,
list items gone
only after their batch is durable."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from pyspark.sql.streaming import StreamingQueryListener

from lakesink.app import Pipeline
from lakesink.config import load_config
from lakesink.config.plan import plan
from lakesink.sources.offsets import lag
from lakesink.sources.redis_positions import position
from lakesink.status import status
from tests.fixtures.runs import flatten, run_once as caught_up
from tests.fixtures.services import read_ids, redis_config, redis_events, write_config

pytestmark = [pytest.mark.integration, pytest.mark.redis, pytest.mark.spark]


class Progress(StreamingQueryListener):
    """The lag in each progress report of the ingestion query, as lakesink's metric
    computes it from the sources' end and latest offsets."""

    def __init__(self) -> None:
        self.lags: list[dict] = []

    def onQueryStarted(self, event: Any) -> None:  # noqa: ANN401, N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: ANN401, N802
        p = event.progress
        if p.numInputRows:
            out: dict = {}
            for s in p.sources:
                out.update(lag(s.endOffset, s.latestOffset))
            self.lags.append(out)

    def onQueryIdle(self, event: Any) -> None:  # noqa: ANN401, N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: ANN401, N802
        pass

    def wait_for(self, batches: int, timeout_s: float = 30) -> None:
        """Spark's listener bus delivers the reports after the batches."""
        deadline = time.monotonic() + timeout_s
        while len(self.lags) < batches and time.monotonic() < deadline:
            time.sleep(0.2)

N = 2000


def run_once(spark, data: dict[str, Any], path=None) -> Any:
    """One caught-up run of ``data`` (through a config file at ``path``, if given: a flag
    cannot say null)."""
    return caught_up(spark, data if path is None else write_config(path, data))


def rejected_rows(lake, fmt: str) -> list[dict[str, Any]]:
    import duckdb

    if fmt == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(lake / "_rejected" / "events")).to_pyarrow_table().to_pylist()
    return duckdb.sql(f"SELECT * FROM read_parquet('{lake}/_rejected/events/*.parquet')"
                      ).fetch_arrow_table().to_pylist()


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_a_stream_through_a_group_every_entry_once(spark, redis_server, tmp_path, fmt,
                                                   request) -> None:
    key = f"sensors-{fmt}-{request.node.name[-8:]}"
    redis_events(redis_server, key, range(N // 2))
    client = redis_server.client()
    bad = [client.xadd(key, {"data": b"not json"}).decode(),
           client.xadd(key, {"other": b"1"}).decode()]  # no payload field
    redis_events(redis_server, key, range(N // 2, N))
    lake = tmp_path / "lake"
    data = redis_config(redis_server, lake, streams=[key], consumer_group="lake",
                        max_records_per_trigger=700, table={"format": fmt})
    data["dlq"] = {"format": fmt}
    stats = run_once(spark, data)
    ids = read_ids(lake / "events", fmt)
    assert sorted(ids) == list(range(N)), f"lost or duplicated: {len(ids)} rows"
    assert stats.written == N and stats.rejected == 2 and stats.batches >= 3
    assert sorted(r.id for r in spark.read.format(fmt).load(str(lake / "events"))
                  .select("id").collect()) == list(range(N))
    dead = rejected_rows(lake, fmt)
    assert Counter(r["reason"] for r in dead) == Counter({"malformed_json": 1, "null_value": 1})
    assert {(r["topic"], r["offset"]) for r in dead} == {(key, position(i)) for i in bad}
    assert {r["value"] for r in dead} == {b"not json", None}
    # a run that ends moves the group to what it wrote: XINFO GROUPS shows no lag
    group = client.xinfo_groups(key)[0]
    assert (group["lag"], group["entries-read"]) == (0, N + 2)
    assert client.xlen(key) == N + 2, "entries stay in the stream (trim_on_commit is off)"
    redis_events(redis_server, key, range(N, N + 40))  # not read yet: lakesink status
    (table,) = status(plan(load_config(flags=flatten(data), env={})))  # counts them as lag
    assert table.lag == {key: 40} and table.rows == N, table


def test_lists_consumed_once_and_only_after_the_batch_is_durable(spark, redis_server,
                                                                  tmp_path) -> None:
    redis_events(redis_server, "jobs-a", range(900), kind="list")
    redis_events(redis_server, "jobs-b", range(900, 1500), kind="list")
    lake = tmp_path / "lake"
    data = redis_config(redis_server, lake, lists=["jobs-a", "jobs-b"],
                        max_records_per_trigger=500)
    progress = Progress()
    spark.streams.addListener(progress)
    try:
        stats = run_once(spark, data)
        progress.wait_for(stats.batches)
    finally:
        spark.streams.removeListener(progress)
    assert sorted(read_ids(lake / "events", "parquet")) == list(range(1500))
    assert stats.written == 1500
    client = redis_server.client()
    assert client.llen("jobs-a") == client.llen("jobs-b") == 0
    assert not client.keys("lakesink:{jobs-*"), "no processing list left after the run"
    # the lag Spark's progress carries (lakesink_consumer_lag_records): 250 of each list
    # in the first batch, the rest still waiting; nothing at the end
    assert progress.lags[0] == {("jobs-a", ""): 650, ("jobs-b", ""): 350}, progress.lags
    assert progress.lags[-1] == {("jobs-a", ""): 0, ("jobs-b", ""): 0}
    # the lists go on: status sees what waits, a second run takes only what came since
    redis_events(redis_server, "jobs-b", range(1500, 1600), kind="list")
    (table,) = status(plan(load_config(flags=flatten(data), env={})))
    assert table.lag == {"jobs-a": 0, "jobs-b": 100} and table.lag_error is None
    run_once(spark, data)
    assert sorted(read_ids(lake / "events", "parquet")) == list(range(1600))


def test_routes_take_redis_keys_like_topics(spark, redis_server, tmp_path) -> None:
    redis_events(redis_server, "route-a", range(300))
    redis_events(redis_server, "route-b", range(300, 500))
    lake = tmp_path / "lake"
    data = redis_config(redis_server, lake, streams=["route-a", "route-b"])
    data["table"].pop("name")
    data["routes"] = [{"topics": ["route-a"], "table": {"name": "a"}},
                      {"topics": ["route-b"], "table": {"name": "b"}}]
    run_once(spark, data)
    assert sorted(read_ids(lake / "a", "parquet")) == list(range(300))
    assert sorted(read_ids(lake / "b", "parquet")) == list(range(300, 500))


def test_redis_that_is_down_fails_at_start_with_a_clear_error(spark, tmp_path) -> None:
    from lakesink.errors import SourceError
    from lakesink.local.services import free_port

    class Down:
        port = free_port()

    data = redis_config(Down(), tmp_path / "lake", streams=["s"])
    data["source"]["redis"]["connect_timeout_s"] = 2
    with pytest.raises(SourceError, match=r"no Redis server reachable at 127\.0\.0\.1"):
        run_once(spark, data)


def test_a_payload_field_of_arrow_ipc(spark, redis_server, tmp_path) -> None:
    """The FS Data Sink's other value format: an Arrow IPC stream per entry."""
    import pyarrow as pa

    client = redis_server.client()
    for start in (0, 50):
        batch = pa.record_batch({"id": pa.array(range(start, start + 50), pa.int64()),
                                 "location": pa.array(["oslo"] * 50)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        client.xadd("arrow-in", {"data": sink.getvalue().to_pybytes()})
    lake = tmp_path / "lake"
    data = redis_config(redis_server, lake, streams=["arrow-in"],
                        table={"partition_by": ["location"], "timestamp_column": None})
    data["decode"] = {"format": "arrow_ipc",
                      "schema": [{"name": "id", "type": "Int64"},
                                 {"name": "location", "type": "Utf8"}]}
    run_once(spark, data)
    assert sorted(read_ids(lake / "events", "parquet")) == list(range(100))


def test_json_of_all_fields(spark, redis_server, tmp_path) -> None:
    client = redis_server.client()
    for i in range(20):
        client.xadd("flat", {"name": f"n{i}", "location": "oslo"})
    lake = tmp_path / "lake"
    data = redis_config(redis_server, lake, streams=["flat"], value_field=None,
                        table={"partition_by": ["location"], "timestamp_column": None})
    data["decode"] = {"schema": [{"name": "name", "type": "Utf8"},
                                 {"name": "location", "type": "Utf8"}]}
    run_once(spark, data, tmp_path / "c.yaml")
    import duckdb

    names = [r[0] for r in duckdb.sql(
        f"SELECT name FROM read_parquet('{lake}/events/**/*.parquet')").fetchall()]
    assert sorted(names) == sorted(f"n{i}" for i in range(20))


def test_the_fs_data_sink_yaml_runs_unchanged(spark, redis_server, tmp_path,
                                              request) -> None:
    """The FS Data Sink's own config file (its README's YAML), pointed at this Redis and
    a local folder, with lakesink's decode section beside it: one table per stream and
    list, as the FS Data Sink writes each key to files of its own; every entry once."""
    import yaml

    from tests.fixtures.services import SCHEMA

    stream, queue = f"fds-s-{request.node.name[-6:]}", "fds-l"
    redis_events(redis_server, stream, range(700), field="value")  # as its producers do
    redis_events(redis_server, queue, range(700, 1000), kind="list")
    lake = tmp_path / "lake"
    fds = {"source": {"type": "redis", "host": "127.0.0.1", "port": redis_server.port,
                      "db": 0, "stream_keys": [stream], "list_keys": [queue],
                      "value_format": "json", "batch_size": 400, "continuous": False},
           "sink": {"type": "local", "base_path": str(lake), "compression": "zstd",
                    "partition_by": ["location"], "merge_enabled": True},
           "telemetry": {"log_level": "INFO"},
           "decode": {"schema": SCHEMA}, "trigger": {"interval": "1 second"},
           "spark": {"master": "local[2]", "log_level": "ERROR"}}
    path = tmp_path / "fds.yaml"
    path.write_text(yaml.safe_dump(fds))
    cfg = load_config(path, env={})
    assert cfg.trigger.until_caught_up
    Pipeline.build(cfg, spark).run(until_caught_up=cfg.trigger.until_caught_up)
    assert sorted(read_ids(lake / stream, "parquet")) == list(range(700))
    assert sorted(read_ids(lake / queue, "parquet")) == list(range(700, 1000))
    assert redis_server.client().llen(queue) == 0
