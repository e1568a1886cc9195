"""Crash tests for the Redis sources: SIGKILL of the whole process at the sources' own
fault points (records taken, not yet in the offset log; batch durable, not yet
acknowledged, the group moved or the items deleted) and at table points, then a restart; every record once in the
table, the dead letters once, nothing left pending or in a processing list.

Scale the loop with ``CHAOS_ROUNDS`` (default 1 round per case)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.fixtures.services import (
    kill_then_restart,
    read_ids,
    redis_config,
    redis_events,
    write_config,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.redis, pytest.mark.slow]

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
N = 2400
BAD = [b"not json %d" % i for i in range(3)]
CASES = [("stream", "parquet", "after_publish"),
         ("stream", "delta", "source_before_commit"),
         ("stream", "delta", "after_delta_commit"),
         ("list", "delta", "source_after_take"),
         ("list", "parquet", "after_staging"),
         ("list", "parquet", "source_before_commit")]


@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize(("kind", "fmt", "point"), CASES,
                         ids=[f"{k}-{f}-{p}" for k, f, p in CASES])
def test_kill_at_a_fault_point_then_restart(redis_server, tmp_path, kind, fmt, point, round_
                                            ) -> None:
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
    data = redis_config(redis_server, lake, max_records_per_trigger=800,
                        table={"format": fmt}, **source)
    kill_then_restart(write_config(tmp_path / "c.yaml", data), point)
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
