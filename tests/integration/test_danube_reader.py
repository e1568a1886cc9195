"""The Danube reader's contract against the protocol double (the real danube-client
over gRPC; see tests/fixtures/danube_broker.py), called the way Spark calls it, without
Spark: a batch is captured before its offsets are logged, a replay reads the capture,
nothing is acknowledged before ``commit``, a restart neither loses nor duplicates."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

pytest.importorskip("danube")

from lakesink.sources.danube import DanubeReader
from tests.fixtures.danube_broker import DanubeDouble

pytestmark = [pytest.mark.integration]
TOPIC = "/default/events"


@pytest.fixture()
def broker() -> Iterator[DanubeDouble]:
    double = DanubeDouble().start()
    yield double
    double.stop()


def reader(broker: DanubeDouble, tmp_path, **extra: str) -> DanubeReader:
    return DanubeReader({"service_url": broker.url, "topics": json.dumps([TOPIC]),
                         "capture_dir": str(tmp_path / "capture"), "idle_s": "2",
                         "connect_timeout_s": "10", **extra})


def ids(r: DanubeReader, start: dict, end: dict) -> list[int]:
    return [json.loads(v)["id"] for p in r.partitions(start, end) for b in r.read(p)
            for v in b.column("value").to_pylist()]


def publish(broker: DanubeDouble, rng: range) -> None:
    broker.publish(TOPIC, [json.dumps({"id": i}).encode() for i in rng])


def test_batches_are_captured_and_acked_only_in_commit(broker, tmp_path) -> None:
    publish(broker, range(25))
    r = reader(broker, tmp_path)
    try:
        start, seen = r.initialOffset(), []
        while (end := r.latestOffset(start, ReadMaxRows(10))) != start:
            batch = ids(r, start, end)
            assert batch == ids(r, start, end), "a replay reads the capture again"
            assert broker.unacked(TOPIC, "lakesink") == 25 - len(seen), "acked before commit"
            seen += batch
            r.commit(end)
            start = end
        assert sorted(seen) == list(range(25))
        assert broker.unacked(TOPIC, "lakesink") == 0
    finally:
        r.stop()


def test_a_restart_neither_loses_nor_duplicates(broker, tmp_path) -> None:
    """Run 1 captures batch 1 (offsets logged), captures batch 2 (offsets not logged),
    commits nothing and dies. Run 2 starts from batch 1's start: it replays the two
    captures, takes the redelivered messages as the same ones, acks them at commit."""
    publish(broker, range(30))
    first = reader(broker, tmp_path)
    start = first.initialOffset()
    one = first.latestOffset(start, ReadMaxRows(10))
    two = first.latestOffset(one, ReadMaxRows(10))
    first.stop()  # the process dies: its consumers go, nothing was acknowledged
    second = reader(broker, tmp_path)
    try:
        assert second.latestOffset(start, ReadMaxRows(10)) == one, "batch 1 as captured"
        seen = ids(second, start, one)
        second.commit(one)
        assert second.latestOffset(one, ReadMaxRows(10)) == two, "batch 2 as captured"
        seen += ids(second, one, two)
        second.commit(two)
        at = two
        while (end := second.latestOffset(at, ReadMaxRows(10))) != at:
            seen += ids(second, at, end)
            second.commit(end)
            at = end
        assert sorted(seen) == list(range(30)), f"{len(seen)} read, {len(set(seen))} distinct"
        assert broker.unacked(TOPIC, "lakesink") == 0, "a redelivery left unacknowledged"
    finally:
        second.stop()


def test_a_broker_that_is_not_there_fails_within_the_wait(tmp_path) -> None:
    from lakesink.errors import SourceError
    from lakesink.runtime.services import free_port

    r = DanubeReader({"service_url": f"http://127.0.0.1:{free_port()}",
                      "topics": json.dumps([TOPIC]), "capture_dir": str(tmp_path),
                      "connect_timeout_s": "3"})
    with pytest.raises(SourceError, match="could not subscribe"):
        r.latestOffset({TOPIC: 0}, ReadMaxRows(10))
