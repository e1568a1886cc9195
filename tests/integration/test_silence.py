"""Per-key silence detection with the real broker: the stateful query beside ingestion.

Processing time: keys a and b publish, a stops -> exactly one event for a (to a Kafka
topic, a table and a callback), b keeps publishing and never fires; then b stops and so
does lakesink, while b is silent; restarted with idle input -> b's event still fires, once;
a publishes again -> re-armed, fires again. Event time: a replay of historical records
fires on record times, and state older than ttl_factor x timeout is swept.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from lakesink.app import Pipeline
from lakesink.config.loader import load_config
from lakesink.local.services import produce
from tests.fixtures.runs import Streaming, flatten
from tests.fixtures.services import config_dict

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

TIMEOUT_MS = 6_000
#: calls of the test callback (it runs in this process, on the driver)
CALLS: list[tuple[bytes, dict[str, Any]]] = []


def on_silence(key: bytes, event: dict[str, Any]) -> None:
    CALLS.append((key, event))


#: keys whose first call the test callback already made (it hangs or raises once)
_FIRST_CALLS: set[bytes] = set()
DELIVERED: list[bytes] = []


def hanging_callback(key: bytes) -> None:
    """The first call for a hangs, for any other key raises; later calls return."""
    if key not in _FIRST_CALLS:
        _FIRST_CALLS.add(key)
        if key == b"a":
            time.sleep(3600)
        raise RuntimeError(f"callback failure for {key!r}")
    DELIVERED.append(key)


def _event(key: str, i: int, ts_ms: int | None = None) -> tuple[bytes, bytes]:
    ts_ms = ts_ms if ts_ms is not None else int(time.time() * 1000)
    return key.encode(), json.dumps({"id": i, "location": key, "ts_ms": ts_ms,
                                     "value": 0.5}).encode()


def _consume(broker, topic: str) -> list[tuple[bytes, dict[str, Any], int]]:  # noqa: ANN001
    """Every record of ``topic`` (partition by partition): (key, value, Kafka timestamp)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                         "group.id": f"check-{time.time()}", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        out = []
        for p in sorted(partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            consumer.assign([TopicPartition(topic, p, 0)])
            got = 0
            while got < high:
                msg = consumer.poll(5)
                if msg is None:
                    break
                if msg.error() is None:
                    got += 1
                    value = json.loads(msg.value()) if msg.value() else None
                    out.append((msg.key(), value, msg.timestamp()[1]))
        return out
    finally:
        consumer.close()


def _wait_for(what: str, check, timeout_s: float = 90) -> Any:  # noqa: ANN001, ANN401
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _publish_until_a_fires(broker, topic: str, events_topic: str,  # noqa: ANN001
                           run: Streaming) -> int:
    """Keys a and b publish for 4 s; then only b, until a's silence event is out and a
    little longer. Returns the next record id."""
    _wait_for("the silence query's first batch", lambda: run.pipeline.silence.stats.batches)
    i = 1
    started = time.monotonic()
    while time.monotonic() - started < 4:
        produce(broker.bootstrap_servers, topic, [_event("a", i), _event("b", i + 1)])
        i += 2
        time.sleep(0.5)
    events: list[Any] = []
    while not events and time.monotonic() - started < 90:
        produce(broker.bootstrap_servers, topic, [_event("b", i)])
        i += 1
        time.sleep(0.5)
        events = _consume(broker, events_topic)
    for _ in range(4):
        produce(broker.bootstrap_servers, topic, [_event("b", i)])
        i += 1
        time.sleep(0.5)
    return i


@contextlib.contextmanager
def _publishing(broker, topic: str, key: str, *, start_id: int) -> Iterator[None]:  # noqa: ANN001
    """``key`` publishes every 0.5 s on a thread while the block runs."""
    done = threading.Event()

    def publish() -> None:
        i = start_id
        while not done.is_set():
            produce(broker.bootstrap_servers, topic, [_event(key, i)])
            i += 1
            done.wait(0.5)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(30)


def test_silent_key_fires_once_survives_restart_and_rearms(spark, kafka_broker, topic,
                                                          tmp_path) -> None:
    import duckdb

    events_topic = f"{topic}-silence"
    kafka_broker.create_topic(events_topic, partitions=1)
    data = config_dict(kafka_broker, topic, tmp_path / "lake", partition_by=[])
    data["source"]["kafka"]["starting_offsets"] = "earliest"
    # ttl_factor 10: b's state is swept 60 s after its last record, not 18 s, so a slow
    # restart (a new query's first stateful batch) still finds it and fires
    data["silence"] = {"timeout_ms": TIMEOUT_MS, "trigger_interval": "1 second",
                       "ttl_factor": 10, "topic": events_topic, "table": "silence_events",
                       "callback": f"{__name__}:on_silence"}
    CALLS.clear()
    produce(kafka_broker.bootstrap_servers, topic, [(None, _event("nobody", 0)[1])])
    run = Streaming(spark, data)
    try:
        i = _publish_until_a_fires(kafka_broker, topic, events_topic, run)
    except BaseException:
        run.stop()  # a failure here must not leave the query running
        raise
    events = _consume(kafka_broker, events_topic)
    stats, calls = dict(run.pipeline.silence.stats.as_dict()), list(CALLS)
    # b publishes until lakesink is down (stopping takes seconds, more on a busy machine:
    # b must not fall silent while the first run still runs), then is silent
    with _publishing(kafka_broker, topic, "b", start_id=10**6):
        run.close()
    assert [(k, v["stream"], v["event"]) for k, v, _ in events] == [
        (b"a", "a", "stream_timeout")], events
    last_a = max(ts for k, _, ts in _consume(kafka_broker, topic) if k == b"a")
    latency_ms = events[0][1]["ts_ms"] - last_a
    print(f"\nsilence event for a: {latency_ms} ms after its last record's Kafka timestamp "
          f"(timeout {TIMEOUT_MS} ms, trigger 1 s)")
    assert latency_ms >= TIMEOUT_MS  # never early
    assert stats["fired"] == 1 and stats["null_keys"] == 1 and stats["tracked"] == 1, stats
    assert [(k, e["stream"]) for k, e in calls] == [(b"a", "a")]

    # restart with idle input: b's pending silence fires, once, by the checkpointed state
    restarted_ms = time.time() * 1000
    run = Streaming(spark, data)
    try:
        second = _wait_for("b's event after the restart",
                           lambda: _consume(kafka_broker, events_topic)[1:])
        assert [(k, v["stream"]) for k, v, _ in second] == [(b"b", "b")]
        assert second[0][1]["ts_ms"] > restarted_ms  # fired by the restarted query
        # a publishes again: re-armed, fires again after its next silence
        produce(kafka_broker.bootstrap_servers, topic, [_event("a", i)])
        _wait_for("a's second event", lambda: len(_consume(kafka_broker, events_topic)) >= 3)
        # nothing more may come (a re-fire would come a trigger or a timeout later)
        time.sleep(1.5 * TIMEOUT_MS / 1000)
    finally:
        run.close()  # also after a failure: a running query would fail the next tests
    events = _consume(kafka_broker, events_topic)
    assert [v["stream"] for _, v, _ in events] == ["a", "b", "a"], events
    assert [(k, e["stream"]) for k, e in CALLS] == [(b"a", "a"), (b"b", "b"), (b"a", "a")]
    con = duckdb.connect()
    rows = con.sql("SELECT stream, key, event, ts_ms FROM read_parquet("
                   f"'{tmp_path}/lake/silence_events/*.parquet') ORDER BY ts_ms").fetchall()
    assert [(s, bytes(k), e, t) for s, k, e, t in rows] == [
        (v["stream"], k, v["event"], v["ts_ms"]) for k, v, _ in events]


T0 = 1_795_000_000_000
#: the replay's silences: (stream, last seen - T0) of each event
REPLAY_EVENTS = [("c", 5000), ("a", 10_000)]
REPLAY_SILENCE = {
    "timeout_ms": 5000, "time": "event",
    "event_time": "timestamp_millis(cast(get_json_object(cast(value AS string), '$.ts_ms') "
                  "AS bigint))"}


def replay_topic(broker) -> tuple[str, int]:  # noqa: ANN001
    """A one-partition topic of historical records, in time order (see the test below);
    returns it and its number of records."""
    topic = f"silence-replay-{time.time_ns()}"
    broker.create_topic(topic, partitions=1)
    records, i = [], 0
    for s in range(41):
        keys = ["b"] + (["a"] if s <= 10 else []) + (["c"] if s <= 5 or s >= 30 else [])
        for key in keys:
            records.append(_event(key, i, T0 + s * 1000))
            i += 1
    records.append(_event("e", i, T0 + 200_000))
    produce(broker.bootstrap_servers, topic, records)
    return topic, len(records)


def test_event_time_replay_fires_on_record_times_and_sweeps_old_state(
        spark, kafka_broker, tmp_path) -> None:
    """One partition of historical records, in time order, replayed in batches of 5:
    a stops at 10 s (fires), c pauses 5..30 s (fires) and stops at 40 s, b stops at
    40 s, then e jumps the clock to 200 s: b and c are silent for 160 s, more than
    3 x the timeout, so they are swept, not fired."""
    from deltalake import DeltaTable

    topic, produced = replay_topic(kafka_broker)
    data = config_dict(kafka_broker, topic, tmp_path / "lake", partition_by=[],
                       format="delta")
    data["source"]["kafka"].update(starting_offsets="earliest", max_offsets_per_trigger=5)
    data["silence"] = {"table": "silences", "callback": f"{__name__}:hanging_callback",
                       "callback_timeout_s": 2, **REPLAY_SILENCE}
    pipeline = Pipeline.build(load_config(flags=flatten(data), env={}), spark)
    stats = pipeline.run(until_caught_up=True)
    assert stats.written == produced  # a hung and a raising callback stalled nothing
    silence = pipeline.silence.stats
    assert (silence.fired, silence.swept, silence.tracked) == (2, 2, 1), silence  # e tracked
    assert (silence.callback_failures, silence.callback_timeouts) == (1, 1), silence
    # at least once: the hung call and the raising one were made again and returned
    assert sorted(DELIVERED) == [b"a", b"c"], DELIVERED
    rows = sorted(DeltaTable(str(tmp_path / "lake" / "silences")).to_pyarrow_table(
        columns=["stream", "event", "last_seen_ms", "silent_ms"]).to_pylist(),
        key=lambda r: r["last_seen_ms"])
    assert [(r["stream"], r["last_seen_ms"] - T0) for r in rows] == REPLAY_EVENTS, rows
    assert all(5000 <= r["silent_ms"] < 15_000 for r in rows)
