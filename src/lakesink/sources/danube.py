"""Danube topics as a Spark streaming source (format ``lakesink-danube``), on the real
``danube-client`` (an async gRPC client).

A Danube subscription with reliable dispatch sends one message at a time and waits for
its acknowledgement, and it cannot seek: a batch can neither hold its messages
unacknowledged until Spark is done with it nor read them again from the broker. So the
reader *spools* them (:mod:`lakesink.sources.danube_spool`):

* on the driver (Spark keeps the reader alive in its planner process for the query's
  life) the consumers run on an event loop of their own thread; the messages received
  (one in flight per partition) are appended to their topic's spool in the checkpoint
  and fsynced together, and only then acknowledged. The spool is lakesink's own durable storage, as the checkpoint is for
  Kafka offsets: nothing is acknowledged before it is durable;
* a message the broker sends again (a crash between the fsync and the ack) is
  recognised by its offset and publish time (at most the last ones its producer
  spooled in its partition: reliable dispatch delivers a partition in order),
  acknowledged and not spooled twice;
* the offset is the spool position ``{"<topic>": <byte position>}``; a batch is the
  byte range ``[start, end)`` of immutable spool segments, so a replay reads the same
  records; ``max_records_per_trigger`` bounds a batch;
* ``commit(end)`` (after the batch is durable) deletes the segments wholly before
  ``end``.

A lost checkpoint loses its spool: messages spooled and acknowledged but not yet in a
committed batch are then lost (the broker has forgotten them), like deleting Kafka's
checkpoint can lose nothing only because Kafka keeps the messages. Do not delete a
checkpoint of a Danube source that has a backlog in its spool. A record's ``topic`` is
the Danube topic, ``partition`` the partition's number (0 for a topic without
partitions), ``offset`` the message's offset in its partition, ``timestamp`` its
publish time (the producer's clock, ms), ``key`` its routing key and ``headers`` its
attributes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

from lakesink.errors import SourceError
from lakesink.faults import fault_point
from lakesink.sources.danube_spool import (
    SEGMENT_BYTES,
    Spool,
    count_records,
    message_key,
    read_range,
)
from lakesink.sources.records import RecordSource, record_batch

logger = logging.getLogger(__name__)

FORMAT = "lakesink-danube"
DEFAULT_BATCH = 10_000
#: a batch waits this long for more messages once some arrived
LINGER_S = 0.2
#: receiving pauses while this many bytes are spooled and not yet in a durable batch
MAX_SPOOL_BYTES = 1 << 30
#: messages spooled with one fsync at most (as many as have arrived)
GROUP = 512
SUBSCRIPTION_TYPES = {"exclusive": 0, "shared": 1, "failover": 2}


def topic_dir(spool_dir: str, topic: str) -> Path:
    """A topic's spool folder (``/default/x`` -> ``default%2Fx``)."""
    return Path(spool_dir) / topic.strip("/").replace("%", "%25").replace("/", "%2F")


def partition_number(name: str) -> int:
    """``/t-part-3`` -> 3; a topic without partitions is partition 0."""
    _, sep, tail = name.rpartition("-part-")
    return int(tail) if sep and tail.isdigit() else 0


@dataclass(frozen=True)
class SpoolRange(InputPartition):
    topic: str
    start: int
    end: int


class _Receiver:
    """The consumers of every topic, on an event loop of their own thread: each message
    is spooled (fsynced), then acknowledged. Errors end the receiving and are raised by
    :meth:`check` on the driver's next call."""

    def __init__(self, options: dict[str, str], spools: dict[str, Spool]) -> None:
        self.options, self.spools = options, spools
        self.arrived = threading.Condition()
        self.failure: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="lakesink-danube")
        self.thread.start()
        self.consumers: list[Any] = []
        self.tasks: list[Any] = []
        timeout = float(options.get("connect_timeout_s", "30"))
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout)
        except Exception as exc:
            self.close()
            raise SourceError(f"Danube at {options['service_url']}: could not subscribe to "
                              f"{list(spools)} within {timeout:.0f}s ({exc}); check "
                              "source.danube.service_url and the topics") from exc

    async def _start(self) -> None:
        from danube import DanubeClientBuilder, SubType

        client = await DanubeClientBuilder().service_url(self.options["service_url"]).build()
        kind = SubType(SUBSCRIPTION_TYPES[self.options.get("subscription_type", "exclusive")])
        own = json.loads(self.options.get("subscriptions") or "{}")
        for topic in self.spools:
            subscription = own.get(topic) or self.options.get("subscription", "lakesink")
            consumer = (client.new_consumer().with_topic(topic)
                        .with_consumer_name(self.options.get("consumer_name", "lakesink"))
                        .with_subscription(subscription)
                        .with_subscription_type(kind).build())
            await consumer.subscribe()
            queue = await consumer.receive()
            self.consumers.append(consumer)
            self.tasks.append(self.loop.create_task(self._pump(topic, consumer, queue)))

    async def _pump(self, topic: str, consumer: Any, queue: asyncio.Queue) -> None:
        spool = self.spools[topic]
        most = int(self.options.get("max_spool_bytes") or MAX_SPOOL_BYTES)
        ack_timeout = float(self.options.get("ack_timeout_s", "30"))
        try:
            while True:
                if spool.backlog() > most:  # Spark is behind: stop taking messages
                    logger.info("Danube %s: %d bytes spooled and not yet in a durable "
                                "batch; receiving pauses", topic, spool.backlog())
                    while spool.backlog() > most:
                        await asyncio.sleep(0.1)
                # what has arrived (one message in flight per partition): spooled with
                # one fsync, then acknowledged together
                messages = [await queue.get()]
                while len(messages) < GROUP and not queue.empty():
                    messages.append(queue.get_nowait())
                new, keys = [], set()
                for message in messages:
                    key = message_key(message)
                    if ((key not in keys or not spool.stamped(message))
                            and not spool.seen(message)):
                        new.append(message)
                    keys.add(key)
                if new:
                    await asyncio.to_thread(spool.append, new)
                    fault_point("source_after_spool")
                try:
                    await asyncio.wait_for(
                        asyncio.gather(*(consumer.ack(m) for m in messages)), ack_timeout)
                except TimeoutError:
                    raise SourceError(f"Danube {topic}: no answer to an acknowledgement "
                                      f"within {ack_timeout:.0f}s") from None
                with self.arrived:
                    self.arrived.notify_all()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            self.failure = exc
            with self.arrived:
                self.arrived.notify_all()

    def check(self) -> None:
        """Raise if receiving has stopped: our pump failed, or the client's own receive
        loops ended (it logs and gives up on some errors instead of raising)."""
        if self.failure is not None:
            raise SourceError(f"Danube receiving failed: {self.failure!r}") from self.failure
        for consumer in self.consumers:
            # one receive loop per partition; the client ends one, logging, on errors
            # it gives up on (private attribute of danube-client 0.5: checked in tests)
            if any(task.done() for task in getattr(consumer, "_tasks", [])):
                raise SourceError("Danube receiving stopped for a partition (the "
                                  "client's receive loop ended; see its log); the query "
                                  "restarts from its checkpoint")

    def wait(self, timeout_s: float) -> None:
        with self.arrived:
            self.arrived.wait(timeout_s)

    def close(self) -> None:
        async def closing() -> None:
            for task in self.tasks:
                task.cancel()
            for consumer in self.consumers:
                await consumer.close()

        try:
            asyncio.run_coroutine_threadsafe(closing(), self.loop).result(10)
        except Exception:
            logger.debug("closing the Danube consumers failed", exc_info=True)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)


class DanubeReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring for the contract."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.topics: list[str] = json.loads(options["topics"])
        self.spool_dir = options["spool_dir"]
        self.batch = int(options.get("max_records") or DEFAULT_BATCH)
        self.idle_s = float(options.get("idle_s", "1.0"))
        self._spools: dict[str, Spool] | None = None
        self._receiver: _Receiver | None = None
        self._target: dict[str, int] | None = None
        self._warned: set[str] = set()
        #: per topic (anchor, pos, n): n whole records between positions anchor and pos
        self._counted: dict[str, tuple[int, int, int]] = {}
        self._waiting: dict[str, int] = {}

    @property
    def spools(self) -> dict[str, Spool]:
        if self._spools is None:
            size = int(self.options.get("segment_bytes") or SEGMENT_BYTES)
            spools: dict[str, Spool] = {}
            try:
                for t in self.topics:
                    spools[t] = Spool(topic_dir(self.spool_dir, t), segment_bytes=size)
            except BaseException:
                for spool in spools.values():
                    spool.close()
                raise
            self._spools = spools
        return self._spools

    @property
    def receiver(self) -> _Receiver:
        if self._receiver is None:
            self._receiver = _Receiver(self.options, self.spools)
        return self._receiver

    def initialOffset(self) -> dict[str, int]:
        return {topic: self.spools[topic].base for topic in self.topics}

    def getDefaultReadLimit(self) -> ReadMaxRows:
        return ReadMaxRows(self.batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Until caught up: a subscription has no end to record, so the run takes what
        is spooled once the subscription was quiet for ``idle_s`` (at most ten times
        ``idle_s`` of waiting, for a topic that never goes quiet)."""
        receiver = self.receiver
        started = quiet_since = time.monotonic()
        before = None
        while True:
            receiver.check()
            ends = {t: self.spools[t].end for t in self.topics}
            now = time.monotonic()
            if ends != before:
                before, quiet_since = ends, now
            if now - quiet_since >= self.idle_s or now - started >= 10 * self.idle_s:
                break
            receiver.wait(0.05)
        self._target = ends

    def latestOffset(self, start: dict[str, int] | None = None, limit: object = None
                     ) -> dict[str, int]:
        start = dict(start or self.initialOffset())
        for t in self.topics:
            if t in start:
                self.spools[t].check_position(int(start[t]))
                # Spark plans a batch after the one before it is done: what lies before
                # start no longer counts towards the backlog that pauses receiving
                self.spools[t].planned(int(start[t]))
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else self.batch
        most = max(1, most // max(1, len(self.topics)))
        receiver = self.receiver
        target = self._target or {}
        now = time.monotonic()
        deadline, before, grew_at = now + self.idle_s, None, None
        while True:  # until a batch is full, the spools stop growing, or idle_s passed
            receiver.check()
            scans = {t: self.spools[t].scan(int(start.get(t, self.spools[t].base)), most,
                                            target.get(t))
                     for t in self.topics}
            end = {t: pos for t, (pos, _) in scans.items()}
            now = time.monotonic()
            if end != before:
                before, grew_at = end, now
            full = any(n >= most for t, (_, n) in scans.items() if t in start)
            moved = any(end[t] > int(start[t]) for t in self.topics if t in start)
            if (full or self._target is not None or now >= deadline
                    or (moved and now - grew_at >= LINGER_S)):
                break
            receiver.wait(0.05)
        for t in self.topics:
            if t not in start:  # a topic added to the configuration joins here
                end[t] = self.spools[t].base
            else:
                self._count_waiting(t, int(start[t]), end[t], scans[t][1])
        for t, pos in start.items():  # a topic taken out of the configuration keeps its
            if t not in self.topics:  # position, so adding it back goes on from there
                end[t] = pos
                if t not in self._warned:
                    self._warned.add(t)
                    logger.warning("Danube topic %s is no longer configured; its spool "
                                   "keeps what was received after position %s until it "
                                   "is configured again", t, pos)
        return end

    def _count_waiting(self, topic: str, start: int, end: int, in_batch: int) -> None:
        """Records spooled after the batch ``[start, end)`` (of ``in_batch`` records),
        counted on from the last count: in a steady stream only the newly spooled ones
        are read (their heads), not the whole backlog again."""
        anchor, pos, n = self._counted.get(topic, (-1, -1, 0))
        if anchor == start and end <= pos and n >= in_batch:
            anchor, n = end, n - in_batch
        elif anchor != end or pos < end:
            anchor, pos, n = end, end, 0
        spool = self.spools[topic]
        pos, more = count_records(spool.folder, pos, spool.end)
        self._counted[topic] = (anchor, pos, n + more)
        self._waiting[topic] = n + more

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:  # noqa: N802
        """Records received into the spool and not in the batch being planned, per topic
        (Spark's progress ``latestOffset``: lakesink's lag metric)."""
        return {t: {"waiting": n} for t, n in self._waiting.items()} or None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[SpoolRange]:
        for t in self.topics:  # a replayed batch: its range must still be there
            if t in start and t in end and int(end[t]) > int(start[t]):
                self.spools[t].check_position(int(start[t]))
                self.spools[t].check_position(int(end[t]))
        return [SpoolRange(t, int(start[t]), int(end[t])) for t in self.topics
                if t in start and t in end and int(end[t]) > int(start[t])]

    def commit(self, end: dict[str, int]) -> None:
        """After the batch ending at ``end`` is durable: its spool segments may go."""
        fault_point("source_before_commit")
        for topic, pos in end.items():
            if topic in self.topics:
                self.spools[topic].drop_below(int(pos))

    def settle(self, end: dict[str, int]) -> None:
        """:meth:`commit` after the query stopped (no consumer needed)."""
        try:
            self.commit(end)
        finally:
            self.stop()

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        for spool in (self._spools or {}).values():
            spool.close()
        self._spools = None

    def read(self, partition: SpoolRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        folder = topic_dir(self.spool_dir, partition.topic)
        headers = self.options.get("headers") == "true"
        chunk: list[Any] = []
        for message in read_range(folder, partition.start, partition.end):
            chunk.append(message)
            if len(chunk) >= 10_000:
                yield _batch(partition.topic, chunk, headers)
                chunk = []
        if chunk:
            yield _batch(partition.topic, chunk, headers)


def _batch(topic: str, messages: list[Any], headers: bool) -> pa.RecordBatch:
    batch = record_batch(
        keys=[m.routing_key.encode() if m.routing_key else None for m in messages],
        values=[m.payload for m in messages], topic=topic,
        offsets=[m.msg_id.topic_offset for m in messages],
        times_ms=[m.publish_time for m in messages], timestamp_type=0,  # the producer's ms
        headers=[[(k, v.encode()) for k, v in m.attributes.items()] for m in messages]
        if headers else None)
    parts = pa.array([partition_number(m.msg_id.topic_name) for m in messages], pa.int32())
    return batch.set_column(batch.schema.get_field_index("partition"), "partition", parts)


class DanubeDataSource(RecordSource):
    format = FORMAT
    reader = DanubeReader
