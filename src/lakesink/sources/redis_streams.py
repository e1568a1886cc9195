"""Redis streams as a Spark streaming source (format ``lakesink-redis-streams``).

Offsets are stream entry ids, one per stream key (``{"key": "1718000000000-3"}``: the
last entry of the batch), kept in Spark's checkpoint. A batch is the entries after the
previous batch's end up to its own end, read with ``XRANGE key (start end``: a replayed
batch reads exactly the same entries. Entries are never acknowledged or trimmed before
the batch is durable:

* ``commit(end)`` runs after Spark has recorded the batch done, which is after the
  table commit (the batch function returned). Only there, with a consumer group, are
  the group's pending entries up to ``end`` acknowledged (``XACK``), and with
  ``trim_on_commit`` the stream trimmed below ``end`` (``XTRIM MINID``).
* With a consumer group, ``latestOffset`` delivers new entries with ``XREADGROUP``
  (they wait in the group's pending list) and the batch's end covers every pending
  entry: entries delivered to a run that crashed are read again, and the checkpoint's
  offsets keep them from being written twice.
* Entries deleted after the checkpoint's position before they were read (``XTRIM``,
  ``XDEL`` by someone else: ``XINFO STREAM``'s ``max-deleted-entry-id``) fail the query
  (``fail_on_data_loss``), like Kafka's ``failOnDataLoss``.

A record's ``topic`` is the stream key, its ``offset`` the entry id packed into one
number, ``ms × 2^20 + seq`` (every id Redis makes itself fits; an explicit id that does
not gets -1; the exact id is also the header ``redis.id``), its ``timestamp`` the id's
milliseconds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

from lakesink.errors import SourceError
from lakesink.faults import fault_point
from lakesink.sources.records import record_batch, record_ddl
from lakesink.sources.redis_conn import Conn, as_text, decode_fields

logger = logging.getLogger(__name__)

FORMAT = "lakesink-redis-streams"
PAGE = 1000
_SEQ_BITS = 20
_MAX_SEQ = (1 << 64) - 1


def parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def format_id(ms: int, seq: int) -> str:
    return f"{ms}-{seq}"


def next_id(entry_id: str) -> str:
    ms, seq = parse_id(entry_id)
    return format_id(ms + 1, 0) if seq == _MAX_SEQ else format_id(ms, seq + 1)


def previous_id(entry_id: str) -> str:
    ms, seq = parse_id(entry_id)
    if seq > 0:
        return format_id(ms, seq - 1)
    return format_id(ms - 1, _MAX_SEQ) if ms > 0 else "0-0"


def position(entry_id: str) -> int:
    """The entry id as one increasing number (``ms × 2^20 + seq``), -1 if it does not fit."""
    ms, seq = parse_id(entry_id)
    if seq >= 1 << _SEQ_BITS or ms >= 1 << (63 - _SEQ_BITS):
        return -1
    return (ms << _SEQ_BITS) | seq


def later(a: str, b: str) -> str:
    return a if parse_id(a) >= parse_id(b) else b


@dataclass(frozen=True)
class StreamRange(InputPartition):
    key: str
    start: str  # exclusive
    end: str  # inclusive


class RedisStreamsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return record_ddl(self.options.get("headers") == "true")

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return RedisStreamsReader(dict(self.options))


class RedisStreamsReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring for the contract. Runs on the driver (offsets, commit)
    and in executor tasks (``read``)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.conn = Conn.of(options)
        self.keys: list[str] = json.loads(options["keys"])
        self.group = options.get("group") or None
        self.consumer = options.get("consumer") or "lakesink"
        self.trim = options.get("trim_on_commit") == "true"
        self.fail_on_data_loss = options.get("fail_on_data_loss", "true") == "true"
        self.max_records = int(options["max_records"]) if options.get("max_records") else None
        self.starting = options.get("starting_position", "earliest")
        self.target: dict[str, str] | None = None
        self._client = None
        self._grouped: set[str] = set()

    @property
    def client(self):  # noqa: ANN201 - a redis.Redis, made on first use (driver only)
        if self._client is None:
            self._client = self.conn.client()
        return self._client

    def _ensure_group(self, key: str, at: str) -> bool:
        """Create the consumer group on ``key`` at ``at`` (and the stream if missing);
        False if it existed already."""
        import redis

        if key in self._grouped:
            return False
        try:
            self.client.xgroup_create(key, self.group, id=at, mkstream=True)
            self._grouped.add(key)
            return True
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            self._grouped.add(key)
            return False

    def _last_id(self, key: str) -> str:
        last = self.client.xrevrange(key, "+", "-", count=1)
        return as_text(last[0][0]) if last else "0-0"

    def _first_position(self, key: str) -> str:
        """Before the oldest entry still in the stream (trimmed entries are not lost to
        a reader that starts from the beginning)."""
        if not self.client.exists(key):
            return "0-0"
        info = self.client.xinfo_stream(key)
        return as_text(info.get("max-deleted-entry-id") or "0-0")

    def initialOffset(self) -> dict[str, str]:
        return {key: self._initial(key) for key in self.keys}

    def _initial(self, key: str) -> str:
        """Where a new checkpoint starts: with a consumer group that exists, where the
        group is (before its oldest pending entry, else after its last delivered one);
        otherwise ``starting_position``."""
        if self.group and self.client.exists(key):
            group = next((g for g in self.client.xinfo_groups(key)
                          if as_text(g["name"]) == self.group), None)
            if group is not None:
                pending = self.client.xpending(key, self.group)
                if pending["pending"]:
                    return previous_id(as_text(pending["min"]))
                return as_text(group["last-delivered-id"])
        at = self._last_id(key) if self.starting == "latest" else self._first_position(key)
        if self.group:
            self._ensure_group(key, at)
        return at

    def getDefaultReadLimit(self):  # noqa: ANN201
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {key: self._last_id(key) for key in self.keys}

    def latestOffset(self, start: dict[str, str] | None = None, limit: object = None
                     ) -> dict[str, str]:
        start = dict(start or self.initialOffset())
        budget = None
        if isinstance(limit, ReadMaxRows):
            budget = max(1, limit.max_rows // max(1, len(self.keys)))
        end = {}
        for key in self.keys:
            if key not in start:  # a stream added to the configuration
                start[key] = self._initial(key)
            begin = start[key]
            self._check_loss(key, begin)
            cap = self.target[key] if self.target is not None else "+"
            if self.group:
                begin = self._deliver(key, begin, budget)
            if budget is None:
                last = self._last_id(key)
                stop = last if cap == "+" else min(last, cap, key=parse_id)
            else:
                page = self.client.xrange(key, f"({begin}", cap, count=budget)
                stop = as_text(page[-1][0]) if page else begin
            end[key] = later(stop, begin)
        return end

    def _deliver(self, key: str, begin: str, budget: int | None) -> str:
        """Consumer-group mode: hand new entries to this consumer (``XREADGROUP``); the
        batch reads from ``begin`` on, so an entry already pending (delivered to a run
        that crashed before its batch was written) is in it. Returns ``begin``."""
        self._ensure_group(key, begin)
        if self.client.xreadgroup(self.group, self.consumer, {key: ">"},
                                  count=budget or 10_000):
            fault_point("source_after_take")
        return begin

    def _check_loss(self, key: str, begin: str) -> None:
        info = self.client.xinfo_stream(key) if self.client.exists(key) else None
        if info is None:
            return
        deleted = as_text(info.get("max-deleted-entry-id", "0-0"))
        if parse_id(deleted) <= parse_id(begin):
            return
        message = (f"Redis stream {key!r}: entries after the checkpoint's position {begin} "
                   f"were deleted before they were read (up to {deleted}; XTRIM or XDEL); "
                   "rows are lost. Set source.redis.fail_on_data_loss: false to go on")
        if self.fail_on_data_loss:
            raise SourceError(message)
        logger.warning(message)

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[StreamRange]:
        return [StreamRange(key, start.get(key, "0-0"), end[key]) for key in self.keys
                if key in end and parse_id(end[key]) > parse_id(start.get(key, "0-0"))]

    def read(self, partition: StreamRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        opts = self.options
        value_field, key_field = opts.get("value_field") or None, opts.get("key_field") or None
        headers = opts.get("headers") == "true"
        client = self.conn.client()
        begin = partition.start
        while True:
            page = client.xrange(partition.key, f"({begin}", partition.end, count=PAGE)
            if not page:
                return
            keys, values, offsets, times, heads = [], [], [], [], []
            for entry_id, fields in page:
                eid = as_text(entry_id)
                key, value, head = decode_fields(fields, value_field, key_field)
                keys.append(key)
                values.append(value)
                offsets.append(position(eid))
                times.append(parse_id(eid)[0])
                heads.append([("redis.id", eid.encode()), *head])
            yield record_batch(keys=keys, values=values, topic=partition.key,
                               offsets=offsets, times_ms=times, timestamp_type=1,
                               headers=heads if headers else None)
            begin = as_text(page[-1][0])
            if len(page) < PAGE or begin == partition.end:
                return

    def commit(self, end: dict[str, str]) -> None:
        """After the batch ending at ``end`` is durable: acknowledge the group's pending
        entries up to ``end``, trim below it if asked."""
        if self.group or self.trim:
            fault_point("source_before_commit")
        for key, last in end.items():
            if self.group:
                self._ack_through(key, last)
            if self.trim and last != "0-0":
                self.client.xtrim(key, minid=next_id(last), approximate=False)

    def _ack_through(self, key: str, last: str) -> None:
        while True:
            pending = self.client.xpending_range(key, self.group, min="-", max=last,
                                                 count=PAGE)
            if not pending:
                return
            self.client.xack(key, self.group, *[p["message_id"] for p in pending])
            if len(pending) < PAGE:
                return

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
