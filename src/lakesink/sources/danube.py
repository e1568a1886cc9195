"""Danube topics as a Spark streaming source (format ``lakesink-danube``), on the real
``danube-client`` (an async gRPC client).

A Danube subscription pushes messages and cannot seek, so a replayed batch could not
read its messages again from the broker. The reader therefore *captures* each batch
before Spark logs its offsets, and acknowledges only after the batch is durable:

* the driver's reader (Spark keeps it alive in its planner process for the query's life)
  runs the consumers on an event loop of its own thread; received messages wait in
  memory, unacknowledged;
* ``latestOffset`` writes the next N waiting messages of a topic to the batch's capture
  file, ``<capture_dir>/<topic>/<n>.arrow`` (Arrow IPC, the record shape; written to a
  temporary name, then renamed), unless that file exists already (a driver that died
  after writing it and before Spark logged the offsets takes the same messages again).
  The offset is ``{"<topic>": n}``;
* ``read`` (tasks) reads the capture file: a replay reads the same records;
* ``commit(end)`` (after the batch is durable) acknowledges the captured messages and
  deletes the capture files up to ``end``. Messages captured before a restart are
  acknowledged when the broker delivers them again (their ids are kept in
  ``committed.json`` until then); redelivered messages already in a capture file are
  not captured twice.

The capture files live in the query's checkpoint folder (local disk or a mounted path
for now): a lost checkpoint loses only captures whose messages were never acknowledged,
which the broker delivers again. A record's ``topic`` is the Danube topic, ``offset``
the message's topic offset, ``timestamp`` its publish time, ``key`` its routing key and
``headers`` its attributes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

from lakesink.errors import SourceError
from lakesink.faults import fault_point
from lakesink.sources.records import RecordSource, record_batch

logger = logging.getLogger(__name__)

FORMAT = "lakesink-danube"
DEFAULT_BATCH = 10_000
SUBSCRIPTION_TYPES = {"exclusive": 0, "shared": 1, "failover": 2}


def topic_dir(capture_dir: str, topic: str) -> Path:
    """A topic's capture folder (``/default/x`` -> ``default%2Fx``)."""
    return Path(capture_dir) / topic.strip("/").replace("%", "%25").replace("/", "%2F")


@dataclass(frozen=True)
class Capture(InputPartition):
    topic: str
    seq: int


class _Receiver:
    """The consumers of every topic, on an event loop of their own thread; what they
    receive waits in ``pending[topic]``, unacknowledged."""

    def __init__(self, options: dict[str, str], topics: list[str]) -> None:
        self.options, self.topics = options, topics
        self.pending: dict[str, deque[Any]] = {t: deque() for t in topics}
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="lakesink-danube")
        self.thread.start()
        self.consumers: dict[str, Any] = {}
        timeout = float(options.get("connect_timeout_s", "30"))
        try:
            self._call(self._start(), timeout)
        except Exception as exc:
            self.close()
            raise SourceError(f"Danube at {options['service_url']}: could not subscribe to "
                              f"{topics} within {timeout:.0f}s ({exc}); check "
                              "source.danube.service_url and the topics") from exc

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        from danube import DanubeClientBuilder, SubType

        client = await DanubeClientBuilder().service_url(self.options["service_url"]).build()
        kind = SubType(SUBSCRIPTION_TYPES[self.options.get("subscription_type", "exclusive")])
        own = json.loads(self.options.get("subscriptions") or "{}")
        for topic in self.topics:
            subscription = own.get(topic) or self.options.get("subscription", "lakesink")
            consumer = (client.new_consumer().with_topic(topic)
                        .with_consumer_name(self.options.get("consumer_name", "lakesink"))
                        .with_subscription(subscription)
                        .with_subscription_type(kind).build())
            await consumer.subscribe()
            queue = await consumer.receive()
            self.consumers[topic] = consumer
            self.loop.create_task(self._pump(topic, queue))

    async def _pump(self, topic: str, queue: asyncio.Queue) -> None:
        while True:
            message = await queue.get()
            with self.arrived:
                self.pending[topic].append(message)
                self.arrived.notify_all()

    def wait_for_any(self, timeout_s: float) -> None:
        with self.arrived:
            if not any(self.pending.values()):
                self.arrived.wait(timeout_s)

    def take(self, topic: str, most: int) -> list[Any]:
        with self.lock:
            queue = self.pending[topic]
            return [queue.popleft() for _ in range(min(most, len(queue)))]

    def give_back(self, topic: str, messages: list[Any]) -> None:
        with self.lock:
            self.pending[topic].extendleft(reversed(messages))

    def ack(self, topic: str, messages: list[Any]) -> None:
        consumer = self.consumers[topic]

        async def all_of() -> None:
            await asyncio.gather(*(consumer.ack(m) for m in messages))

        self._call(all_of(), 60)

    def close(self) -> None:
        async def closing() -> None:
            for consumer in self.consumers.values():
                await consumer.close()

        try:
            if self.consumers:
                self._call(closing(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)


class DanubeReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring for the contract."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.topics: list[str] = json.loads(options["topics"])
        self.capture_dir = options["capture_dir"]
        self.batch = int(options.get("max_records") or DEFAULT_BATCH)
        self.idle_s = float(options.get("idle_s", "1.0"))
        self._receiver: _Receiver | None = None
        self.handles: dict[str, dict[int, Any]] = {t: {} for t in self.topics}
        self.captured: dict[str, set[int]] = {t: set() for t in self.topics}
        self.committed: dict[str, set[int]] = {t: set() for t in self.topics}
        self._loaded = False

    # -- driver -------------------------------------------------------------------------

    @property
    def receiver(self) -> _Receiver:
        if self._receiver is None:
            self._load()
            self._receiver = _Receiver(self.options, self.topics)
        return self._receiver

    def _load(self) -> None:
        """What earlier runs left: uncommitted captures (their ids), committed ids not
        yet acknowledged."""
        for topic in self.topics:
            folder = topic_dir(self.capture_dir, topic)
            folder.mkdir(parents=True, exist_ok=True)
            for path in folder.glob("*.arrow"):
                self.captured[topic].update(_offsets(path))
            done = folder / "committed.json"
            if done.exists():
                self.committed[topic] = set(json.loads(done.read_text()))

    def initialOffset(self) -> dict[str, int]:
        return {topic: 0 for topic in self.topics}

    def prepareForTriggerAvailableNow(self) -> None:
        """Until caught up: a push subscription has no end to record, so "caught up"
        is a trigger that waits ``idle_s`` and receives nothing (the default without
        this hook would fix the end at the first batch)."""

    def getDefaultReadLimit(self) -> ReadMaxRows:
        return ReadMaxRows(self.batch)

    def latestOffset(self, start: dict[str, int] | None = None, limit: object = None
                     ) -> dict[str, int]:
        start = dict(start or self.initialOffset())
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else self.batch
        most = max(1, most // max(1, len(self.topics)))
        receiver = self.receiver
        end = {}
        deadline = time.monotonic() + self.idle_s  # one wait for all topics
        for topic in self.topics:
            if topic not in start:  # a topic added to the configuration joins here
                end[topic] = 0
                continue
            seq = int(start[topic]) + 1
            path = topic_dir(self.capture_dir, topic) / f"{seq}.arrow"
            if path.exists():  # captured before a restart, not yet in the offset log
                end[topic] = seq
                continue
            messages = self._next(topic, most, deadline)
            if not messages:
                end[topic] = int(start[topic])
                continue
            try:
                _write_capture(path, topic, messages, self.options.get("headers") == "true")
            except BaseException:
                receiver.give_back(topic, messages)
                raise
            for m in messages:
                self.handles[topic][m.msg_id.topic_offset] = m
                self.captured[topic].add(m.msg_id.topic_offset)
            fault_point("source_after_take")
            end[topic] = seq
        return end

    def _next(self, topic: str, most: int, deadline: float) -> list[Any]:
        """Up to ``most`` new messages of ``topic`` (redeliveries left out), waiting
        until ``deadline`` only while there are none at all."""
        out: list[Any] = []
        while len(out) < most:
            got = self.receiver.take(topic, most - len(out))
            if got:
                out += self._fresh(topic, got)
                continue
            left = deadline - time.monotonic()
            if out or left <= 0:
                break
            self.receiver.wait_for_any(min(left, 0.2))
        return out

    def _fresh(self, topic: str, messages: list[Any]) -> list[Any]:
        """``messages`` less redeliveries: one already committed is acknowledged now;
        one already captured keeps its new handle for the ack at commit."""
        out, ack_now = [], []
        for m in messages:
            offset = m.msg_id.topic_offset
            if offset in self.committed[topic]:
                ack_now.append(m)
                self.committed[topic].discard(offset)
            elif offset in self.captured[topic]:
                self.handles[topic][offset] = m
            else:
                out.append(m)
        if ack_now:
            self.receiver.ack(topic, ack_now)
            self._save_committed(topic)
        return out

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Capture]:
        return [Capture(topic, seq) for topic in self.topics if topic in start and topic in end
                for seq in range(int(start[topic]) + 1, int(end[topic]) + 1)]

    def commit(self, end: dict[str, int]) -> None:
        """After the batch ending at ``end`` is durable: acknowledge its messages (those
        captured before a restart when they come again), then delete the captures."""
        receiver = self.receiver
        for topic, last in end.items():
            if topic not in self.topics:
                continue
            folder = topic_dir(self.capture_dir, topic)
            done = sorted((p for p in folder.glob("*.arrow") if int(p.stem) <= int(last)),
                          key=lambda p: int(p.stem))
            if not done:
                continue
            fault_point("source_before_commit")
            offsets = [o for p in done for o in _offsets(p)]
            now = [self.handles[topic].pop(o) for o in offsets if o in self.handles[topic]]
            self.committed[topic].update(o for o in offsets
                                         if o not in {m.msg_id.topic_offset for m in now})
            self._save_committed(topic)  # before the captures go: their ids stay known
            if now:
                receiver.ack(topic, now)
            for p in done:
                self.captured[topic].difference_update(_offsets(p))
                p.unlink()

    def settle(self, end: dict[str, int]) -> None:
        """:meth:`commit` from a reader of its own after the query stopped (see
        :func:`lakesink.sources.settle`): the messages come again to its consumers, so
        it waits for them a moment and acknowledges the committed ones; the rest stay
        unacknowledged for the next run."""
        self.commit(end)
        deadline = time.monotonic() + self.idle_s * 2
        while any(self.committed[t] for t in self.topics) and time.monotonic() < deadline:
            self.receiver.wait_for_any(0.2)
            for topic in self.topics:
                self._fresh(topic, self.receiver.take(topic, self.batch))

    def _save_committed(self, topic: str) -> None:
        path = topic_dir(self.capture_dir, topic) / "committed.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self.committed[topic])))
        os.replace(tmp, path)

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.close()

    # -- tasks --------------------------------------------------------------------------

    def read(self, partition: Capture) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        path = topic_dir(self.capture_dir, partition.topic) / f"{partition.seq}.arrow"
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _offsets(path: Path) -> list[int]:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all().column("offset").to_pylist()


def _write_capture(path: Path, topic: str, messages: list[Any], headers: bool) -> None:
    batch = record_batch(
        keys=[m.routing_key.encode() if m.routing_key else None for m in messages],
        values=[m.payload for m in messages], topic=topic,
        offsets=[m.msg_id.topic_offset for m in messages],
        times_ms=[m.publish_time for m in messages], timestamp_type=0,  # ms (the producer's clock)
        headers=[[(k, v.encode()) for k, v in m.attributes.items()] for m in messages]
        if headers else None)
    tmp = path.with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class DanubeDataSource(RecordSource):
    format = FORMAT
    reader = DanubeReader


__all__ = ["FORMAT", "DanubeDataSource", "DanubeReader"]
