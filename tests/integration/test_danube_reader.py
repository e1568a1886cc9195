"""The Danube reader's contract against the protocol double (the real danube-client
over gRPC, reliable dispatch: one message in flight, ack-gated; see
tests/fixtures/danube_broker.py), called the way Spark calls it, without Spark: every
message is spooled before it is acknowledged, a replay reads the same records, a
message sent again after a crash is not spooled twice, partitions keep their offsets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

pytest.importorskip("danube")

from lakesink.sources.danube import DanubeReader, topic_dir
from lakesink.sources.danube_spool import Spool
from tests.fixtures.danube_broker import DanubeDouble

pytestmark = [pytest.mark.integration]
TOPIC = "/default/events"


@pytest.fixture()
def broker() -> Iterator[DanubeDouble]:
    double = DanubeDouble(ack_timeout_s=2).start()
    yield double
    double.stop()


def reader(broker: DanubeDouble, tmp_path, **extra: str) -> DanubeReader:
    return DanubeReader({"service_url": broker.url, "topics": json.dumps([TOPIC]),
                         "subscriptions": json.dumps({TOPIC: "lakesink"}),
                         "spool_dir": str(tmp_path / "spool"), "idle_s": "2",
                         "connect_timeout_s": "10", **extra})


def rows(r: DanubeReader, start: dict, end: dict) -> list[tuple[int, int]]:
    """(id, partition) of the batch's records."""
    out = []
    for p in r.partitions(start, end):
        for b in r.read(p):
            out += [(json.loads(v)["id"], part) for v, part in
                    zip(b.column("value").to_pylist(), b.column("partition").to_pylist(),
                        strict=True)]
    return out


def drain(r: DanubeReader, start: dict, most: int = 10) -> tuple[list[tuple[int, int]], dict]:
    seen = []
    while (end := r.latestOffset(start, ReadMaxRows(most))) != start:
        batch = rows(r, start, end)
        assert batch == rows(r, start, end), "a replay reads the same records"
        assert len(batch) <= most
        seen += batch
        r.commit(end)
        start = end
    return seen, start


def publish(broker: DanubeDouble, rng: range, topic: str = TOPIC) -> None:
    broker.publish(topic, [json.dumps({"id": i}).encode() for i in rng])


def test_every_message_spooled_once_and_acked(broker, tmp_path) -> None:
    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(25))
    r = reader(broker, tmp_path)
    try:
        seen, end = drain(r, r.initialOffset())
        assert sorted(i for i, _ in seen) == list(range(25))
        assert broker.unacked(TOPIC, "lakesink") == 0 and broker.late_acks == 0
        publish(broker, range(25, 30))  # the subscription goes on
        more, _ = drain(r, end)
        assert [i for i, _ in more] == list(range(25, 30))
    finally:
        r.stop()


def test_a_message_sent_again_after_a_crash_is_not_spooled_twice(broker, tmp_path) -> None:
    """The process died between the spool's fsync and the ack: the broker sends the
    message again to the next run, which acknowledges it without spooling it again."""
    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(6))
    first = broker.partitions[TOPIC].messages[0]
    with Spool(topic_dir(str(tmp_path / "spool"), TOPIC)) as spool:
        spool.append([first])  # spooled, never acked
    r = reader(broker, tmp_path)
    try:
        seen, _ = drain(r, {TOPIC: 0})
        assert sorted(i for i, _ in seen) == list(range(6))
        assert broker.unacked(TOPIC, "lakesink") == 0
    finally:
        r.stop()


def test_a_restart_reads_the_spool_from_the_checkpoint(broker, tmp_path) -> None:
    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(30))
    first = reader(broker, tmp_path)
    start = first.initialOffset()
    one = first.latestOffset(start, ReadMaxRows(10))
    before = rows(first, start, one)
    first.stop()  # dies after batch 1's offsets were logged, before it ran
    second = reader(broker, tmp_path)
    try:
        seen = rows(second, start, one)
        assert seen == before
        second.commit(one)
        rest, _ = drain(second, one)
        ids = [i for i, _ in seen + rest]
        assert sorted(ids) == list(range(30)), f"{len(ids)} read, {len(set(ids))} distinct"
    finally:
        second.stop()


def test_partitions_keep_their_own_offsets(broker, tmp_path) -> None:
    broker.create_topic(TOPIC, partitions=3)
    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(30))
    r = reader(broker, tmp_path)
    try:
        seen, _ = drain(r, r.initialOffset())
        assert sorted(i for i, _ in seen) == list(range(30))
        assert {i % 3: p for i, p in seen} == {0: 0, 1: 1, 2: 2}
    finally:
        r.stop()


def test_a_new_subscription_starts_at_the_latest_message(broker, tmp_path) -> None:
    publish(broker, range(5))  # before the subscription: not for it
    r = reader(broker, tmp_path)
    try:
        start = r.initialOffset()
        assert r.latestOffset(start, ReadMaxRows(10)) == start
        publish(broker, range(5, 8))
        seen, _ = drain(r, start)
        assert [i for i, _ in seen] == [5, 6, 7]
    finally:
        r.stop()


def test_a_broker_that_is_not_there_fails_within_the_wait(tmp_path) -> None:
    from lakesink.errors import SourceError
    from lakesink.local.services import free_port

    r = DanubeReader({"service_url": f"http://127.0.0.1:{free_port()}",
                      "topics": json.dumps([TOPIC]), "spool_dir": str(tmp_path),
                      "connect_timeout_s": "3"})
    with pytest.raises(SourceError, match="could not subscribe"):
        r.latestOffset({TOPIC: 0}, ReadMaxRows(10))


def test_until_caught_up_ends_while_messages_keep_coming(broker, tmp_path) -> None:
    """``prepareForTriggerAvailableNow`` fixes the end: a producer that never stops does
    not keep the run going, and what arrives after it waits for the next run."""
    import threading

    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(20))
    stop, n = threading.Event(), [20]

    def produce() -> None:
        while not stop.is_set():
            publish(broker, range(n[0], n[0] + 1))
            n[0] += 1
            stop.wait(0.02)

    producer = threading.Thread(target=produce, daemon=True)
    r = reader(broker, tmp_path, idle_s="0.5")
    try:
        producer.start()
        r.prepareForTriggerAvailableNow()  # waits at most 10 x idle_s
        seen, end = drain(r, r.initialOffset(), most=15)
        assert len(seen) >= 20
        assert [i for i, _ in seen] == list(range(len(seen))), "in order, none twice"
    finally:
        stop.set()
        producer.join()
        r.stop()
    later = reader(broker, tmp_path)
    try:
        rest, _ = drain(later, end)
        assert [i for i, _ in seen + rest] == list(range(n[0]))
    finally:
        later.stop()


def test_receiving_pauses_while_the_spool_is_full(broker, tmp_path) -> None:
    """No batch made durable: receiving stops near ``max_spool_bytes`` and the broker
    keeps the rest; commits let it go on."""

    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(60))
    r = reader(broker, tmp_path, segment_bytes="300", max_spool_bytes="400")
    try:
        r.latestOffset(r.initialOffset(), ReadMaxRows(1))  # starts receiving
        time.sleep(1.5)
        assert broker.unacked(TOPIC, "lakesink") > 40, "receiving did not pause"
        assert r.spools[TOPIC].backlog() < 400 + 100
        seen, _ = drain(r, r.initialOffset(), most=5)
        assert [i for i, _ in seen] == list(range(60))
        assert broker.unacked(TOPIC, "lakesink") == 0
    finally:
        r.stop()


def test_a_batch_larger_than_the_pause_bound_does_not_stall(broker, tmp_path) -> None:
    """Driven in Spark's order (``commit`` of a batch only when the next one is
    planned): a batch bigger than ``max_spool_bytes`` must not pause receiving for
    good."""
    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(60))
    r = reader(broker, tmp_path, max_spool_bytes="400", idle_s="1")
    try:
        first = start = r.initialOffset()
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(seen) < 60:
            end = r.latestOffset(start, ReadMaxRows(100))
            if end == start:
                continue  # no batch: nothing committed either
            if start != first:
                r.commit(start)  # the batch before, committed as this one is planned
            seen += rows(r, start, end)
            start = end
        assert [i for i, _ in seen] == list(range(60))
    finally:
        r.stop()


def test_a_topic_taken_out_and_put_back_goes_on_where_it_was(broker, tmp_path) -> None:
    other = "/default/other"
    for t in (TOPIC, other):
        broker.subscribe_at_start(t, "lakesink")
    publish(broker, range(10))
    publish(broker, range(100, 110), topic=other)
    both = {"topics": json.dumps([TOPIC, other]),
            "subscriptions": json.dumps({TOPIC: "lakesink", other: "lakesink"})}
    r = reader(broker, tmp_path, **both)
    try:
        seen, end = drain(r, r.initialOffset(), most=40)
    finally:
        r.stop()
    assert sorted(i for i, _ in seen) == [*range(10), *range(100, 110)]
    publish(broker, range(110, 115), topic=other)  # received while configured ...
    r = reader(broker, tmp_path, **both)
    try:
        r.latestOffset(end, ReadMaxRows(1))
        while broker.unacked(other, "lakesink"):
            time.sleep(0.05)
    finally:
        r.stop()
    alone = reader(broker, tmp_path)  # ... then the topic is taken out
    try:
        publish(broker, range(10, 15))
        more, end = drain(alone, end)
        assert [i for i, _ in more] == list(range(10, 15))
        assert other in end, "its position is kept"
    finally:
        alone.stop()
    again = reader(broker, tmp_path, **both)
    try:
        rest, _ = drain(again, end, most=40)
        assert sorted(i for i, _ in rest) == list(range(110, 115)), "none lost, none twice"
    finally:
        again.stop()


def test_a_topic_made_again_is_read_from_its_new_start(broker, tmp_path) -> None:
    """The offsets start at 0 again: the new messages are not taken for redeliveries."""

    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(5))
    r = reader(broker, tmp_path)
    try:
        seen, end = drain(r, r.initialOffset())
        broker.recreate_topic(TOPIC)
        time.sleep(0.01)  # another publish time
        publish(broker, range(5, 8))
        more, _ = drain(r, end)
        assert [i for i, _ in seen + more] == list(range(8))
    finally:
        r.stop()


def test_a_receive_loop_that_ends_fails_the_next_trigger(broker, tmp_path) -> None:
    """The client ends a partition's receive loop (logging) on errors it gives up on;
    the reader must notice, not wait for messages that never come."""
    import asyncio

    from lakesink.errors import SourceError

    broker.create_topic(TOPIC, partitions=2)
    broker.subscribe_at_start(TOPIC, "lakesink")
    r = reader(broker, tmp_path, idle_s="0.3")
    try:
        start = r.initialOffset()
        r.latestOffset(start, ReadMaxRows(10))
        receiver = r.receiver
        loop_task = receiver.consumers[0]._tasks[0]
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), receiver.loop).result()
        receiver.loop.call_soon_threadsafe(loop_task.cancel)
        time.sleep(0.2)
        with pytest.raises(SourceError, match="receiving stopped for a partition"):
            r.latestOffset(start, ReadMaxRows(10))
    finally:
        r.stop()


def test_a_checkpoint_ahead_of_its_spool_fails(broker, tmp_path) -> None:
    """A spool deleted or cut under its checkpoint: the messages in between are gone;
    say so instead of reading from wherever the spool is."""
    from lakesink.errors import SourceError

    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(5))
    r = reader(broker, tmp_path)
    try:
        _, end = drain(r, r.initialOffset())
    finally:
        r.stop()
    import shutil

    shutil.rmtree(tmp_path / "spool")
    again = reader(broker, tmp_path)
    try:
        with pytest.raises(SourceError, match="spool ends at 0"):
            again.latestOffset(end, ReadMaxRows(10))
    finally:
        again.stop()


def test_one_process_at_a_time_on_a_spool(broker, tmp_path) -> None:
    from lakesink.errors import SourceError

    folder = topic_dir(str(tmp_path / "spool"), TOPIC)
    with Spool(folder), pytest.raises(SourceError, match="in use by another process"):
        Spool(folder, lock_timeout_s=0.3)
    with Spool(folder, lock_timeout_s=0.3):  # released on close
        pass


def test_lag_counts_the_records_spooled_after_the_batch(broker, tmp_path) -> None:
    from lakesink.sources.offsets import lag

    broker.subscribe_at_start(TOPIC, "lakesink")
    publish(broker, range(30))
    r = reader(broker, tmp_path, idle_s="0.5")
    try:
        r.prepareForTriggerAvailableNow()  # every message spooled
        start = r.initialOffset()
        end = r.latestOffset(start, ReadMaxRows(10))
        assert lag(end, r.reportLatestOffset()) == {(TOPIC, ""): 20}
        r.commit(end)
        nxt = r.latestOffset(end, ReadMaxRows(10))  # counted on, not again from the start
        assert lag(nxt, r.reportLatestOffset()) == {(TOPIC, ""): 10}
        last = r.latestOffset(nxt, ReadMaxRows(100))
        assert lag(last, r.reportLatestOffset()) == {(TOPIC, ""): 0}
    finally:
        r.stop()
