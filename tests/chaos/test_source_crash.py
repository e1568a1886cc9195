"""Crash tests for the Redis and Danube sources: SIGKILL of the whole process at the sources' own
fault points (records taken, not yet in the offset log; batch durable, not yet
acknowledged, the group moved or the items deleted) and at table points, then a restart; every record once in the
table, the dead letters once, nothing left pending or in a processing list.

Scale the loop with ``CHAOS_ROUNDS`` (default 1 round per case). The restart runs in the
tests' process (:func:`~tests.fixtures.services.kill_then_restart`)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.fixtures.services import (
    full_only,
    kill_then_restart,
    read_ids,
    redis_config,
    redis_events,
    write_config,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
N = 1200  # three batches of a third (and the bad records)
BAD = [b"not json %d" % i for i in range(3)]
#: each source point once in CI; the table points with a source's replay of a committed
#: batch (each table point also runs in test_crash) are repeats: CHAOS_FULL=1
CASES = [*(full_only(*c, id="-".join(c)) for c in (
             ("stream", "parquet", "after_publish"),
             ("stream", "delta", "after_delta_commit"),
             ("list", "parquet", "after_staging"))),
         *(pytest.param(*c, id="-".join(c)) for c in (
             ("stream", "delta", "source_before_commit"),
             ("list", "delta", "source_after_take"),
             ("list", "parquet", "source_before_commit")))]


@pytest.mark.redis
@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize(("kind", "fmt", "point"), CASES)
def test_kill_at_a_fault_point_then_restart(spark, redis_server, tmp_path, kind, fmt, point,
                                            round_) -> None:
    key = f"crash-{kind}-{fmt}-{point}-{round_}"
    client = redis_server.client()
    client.delete(key)
    redis_events(redis_server, key, range(N // 2), kind=kind)
    for value in BAD:
        if kind == "stream":
            client.xadd(key, {"data": value})
        else:
            client.rpush(key, value)
    redis_events(redis_server, key, range(N // 2, N), kind=kind)
    lake = tmp_path / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    source = {"streams": [key], "consumer_group": "lake"} if kind == "stream" else {
        "lists": [key], "consumer_name": f"c{round_}"}
    data = redis_config(redis_server, lake, max_records_per_trigger=N // 3,
                        table={"format": fmt}, **source)
    kill_then_restart(write_config(tmp_path / "c.yaml", data), point, restart_in=spark)
    ids = read_ids(lake / "events", fmt)
    rows, distinct = len(ids), len(set(ids))
    import duckdb

    rejected = duckdb.sql(f"SELECT count(*) FROM read_parquet('{lake}/_rejected/events/*.parquet')"
                          ).fetchone()[0]
    print(f"redis-crash source={kind} point={point} format={fmt} produced={N} "
          f"lost={N - distinct} duplicated={rows - distinct} rejected={rejected}/{len(BAD)}")
    assert sorted(ids) == list(range(N)), f"lost {N - distinct}, duplicated {rows - distinct}"
    assert rejected == len(BAD), "dead letters lost or duplicated"
    if kind == "stream":
        group = client.xinfo_groups(key)[0]
        assert (group["lag"], group["pending"]) == (0, 0), "the group is behind the table"
    else:
        assert client.llen(key) == 0
        assert not client.keys(f"lakesink:{{{key}}}:*"), "a processing list was left"


@pytest.mark.redis
@pytest.mark.spark
def test_redis_down_mid_run_then_back(spark, tmp_path) -> None:
    """The Redis server stops in the middle of a streaming run and comes back on the same
    port with its data (append-only file): the failing query is restarted from its
    checkpoint with backoff, and every stream entry and list item lands once."""
    import time

    from lakesink.local.redisserver import RedisServer
    from tests.fixtures.runs import Streaming

    server = RedisServer(work_dir=tmp_path / "redis").start()
    try:
        redis_events(server, "out-s", range(600))
        redis_events(server, "out-l", range(600, 900), kind="list")
        data = redis_config(server, tmp_path / "lake", streams=["out-s"], lists=["out-l"],
                            consumer_group="lake", socket_timeout_s=2, connect_timeout_s=5)
        data["retry"] = {"initial_backoff_s": 1, "max_backoff_s": 4, "restarts": 20}
        run = Streaming(spark, data)
        table = tmp_path / "lake" / "events"

        def rows_reach(n: int, timeout_s: float = 120) -> bool:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if len(read_ids(table, "parquet")) >= n or run.error is not None:
                    return True
                time.sleep(1)
            return False

        assert rows_reach(900) and run.error is None, run.error
        server.stop(keep_data=True)
        time.sleep(8)  # several triggers fail meanwhile
        server.start()
        redis_events(server, "out-s", range(900, 1500))
        redis_events(server, "out-l", range(1500, 1800), kind="list")
        assert rows_reach(1800)
        run.close()
        ids = read_ids(table, "parquet")
        assert sorted(ids) == list(range(1800)), f"{len(ids)} rows, {len(set(ids))} distinct"
        client = server.client()
        assert client.llen("out-l") == 0 and client.xinfo_groups("out-s")[0]["lag"] == 0
    finally:
        server.stop()


#: the table point (a replay of a committed batch) is a repeat: CHAOS_FULL=1
DANUBE_CASES = [pytest.param("parquet", "source_after_spool", id="danube-parquet-source_after_spool"),
                full_only("parquet", "after_manifest", id="danube-parquet-after_manifest"),
                pytest.param("delta", "source_before_commit", id="danube-delta-source_before_commit")]


@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize(("fmt", "point"), DANUBE_CASES)
def test_danube_kill_at_a_fault_point_then_restart(spark, tmp_path, fmt, point, round_
                                                   ) -> None:
    """The same against the Danube protocol double (tests/fixtures/danube_broker.py):
    every message once, every message acknowledged in the end. Half the Redis cases'
    records (the double delivers one message at a time): three batches still."""
    n = N // 2
    pytest.importorskip("danube")
    from tests.fixtures.danube_broker import DanubeDouble
    from tests.fixtures.services import json_events, source_config

    double = DanubeDouble().start()
    try:
        topic = "/default/crash"
        double.subscribe_at_start(topic, "lakesink")
        double.publish(topic, [v for _, v in json_events(range(n // 2))])
        double.publish(topic, BAD)
        double.publish(topic, [v for _, v in json_events(range(n // 2, n))])
        lake = tmp_path / "lake"
        data = source_config({"danube": {"service_url": double.url, "topics": [topic],
                                         "subscription": "lakesink",
                                         "max_records_per_trigger": n // 3, "idle_s": 2}},
                             lake, format=fmt)
        output = kill_then_restart(write_config(tmp_path / "c.yaml", data), point,
                                   restart_in=spark)
        ids = read_ids(lake / "events", fmt)
        assert ids, output[-3000:]
        import duckdb

        rejected = duckdb.sql(f"SELECT count(*) FROM read_parquet('{lake}/_rejected/events/"
                              "*.parquet')").fetchone()[0]
        print(f"danube-crash point={point} format={fmt} produced={n} "
              f"lost={n - len(set(ids))} duplicated={len(ids) - len(set(ids))} "
              f"rejected={rejected}/{len(BAD)} unacked={double.unacked(topic, 'lakesink')}")
        assert sorted(ids) == list(range(n))
        assert rejected == len(BAD)
        assert double.unacked(topic, "lakesink") == 0
    finally:
        double.stop()
