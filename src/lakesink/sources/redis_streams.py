"""Redis streams as a Spark streaming source (format ``lakesink-redis-streams``).

Offsets are positions in each stream, ``{"key": {"id": "1718000000000-3", "n": 42}}``:
the last entry id of the batch and the count of entries the stream was ever given up to
it, kept in Spark's checkpoint. A batch is the entries after the previous batch's end up
to its own end, read with ``XRANGE key (start end``: a replayed batch reads exactly the
same entries. Nothing is acknowledged, trimmed or moved in Redis before the batch is
durable:

* ``commit(end)`` runs after Spark has recorded the batch done, which is after the
  table commit (the batch function returned); lakesink also calls it for the last
  batch when a run ends (:func:`lakesink.sources.settle`). Only there, with a consumer
  group, does the group's last delivered id move forward to ``end`` (``XGROUP SETID``
  with its entries read, so ``XINFO GROUPS`` shows lakesink's durable progress and lag)
  and are entries still pending up to ``end`` acknowledged (``XACK``: entries delivered
  to the consumer lakesink took over from); with ``trim_on_commit`` the stream is
  trimmed up to ``end`` (``XTRIM MINID``).
* The group is not read with ``XREADGROUP``: a group hands out entries that cannot be
  bounded to a batch's end, and the checkpoint is the truth. A new checkpoint on an
  existing group starts where the group is: before its oldest pending entry, else at
  its last delivered one.
* Entries after the checkpoint's position that are gone unread — deleted (``XDEL``:
  ``max-deleted-entry-id``) or trimmed (by a producer's ``MAXLEN``/``XTRIM``: the stream
  was given more entries after the position than it still holds) — fail the query
  (``fail_on_data_loss``), like Kafka's ``failOnDataLoss``. So does a stream written
  again below the position (a failover to a replica that lagged): its last id is behind
  the position, or the entry at the position is not the one read there (the offset
  keeps a fingerprint of its fields). An entry at the position gone though nothing
  was trimmed or deleted up to it is a warning (most such failovers skip nothing).

A record's ``topic`` is the stream key, its ``offset`` the entry id packed into one
number, ``ms × 2^20 + seq`` (ids Redis makes itself fit unless over a million entries
share one millisecond; an id that does not fit gets -1, so the offset is then not
unique; the exact id is always the header ``redis.id``), its ``timestamp`` the id's
milliseconds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

from lakesink.errors import SourceError
from lakesink.faults import fault_point
from lakesink.sources.records import RecordSource, record_batch
from lakesink.sources.redis_conn import Conn, as_text, decode_fields
from lakesink.sources.redis_positions import (
    Position,
    deleted_id,
    fingerprint,
    loss,
    next_id,
    parse_id,
    pos_id,
    position,
    previous_id,
    read_ones_lost,
)

logger = logging.getLogger(__name__)

FORMAT = "lakesink-redis-streams"
PAGE = 1000
#: an explicit id's milliseconds beyond year 9999 are clamped there as the timestamp
MAX_TIME_MS = 253_402_300_799_999
@dataclass(frozen=True)
class StreamRange(InputPartition):
    key: str
    start: str  # exclusive
    end: str  # inclusive


class RedisStreamsReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring for the contract. Runs on the driver (offsets, commit)
    and in executor tasks (``read``).

    A stream's offset is a position ``{"id": "<ms>-<seq>", "n": <count>}``: the last
    entry id of the batch and how many entries the stream had ever been given up to it
    (``entries-added`` bookkeeping; -1 while unknown). The count is what tells trimmed,
    unread entries from a stream that never had any (see :meth:`_check_loss`).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.conn = Conn.of(options)
        self.keys: list[str] = json.loads(options["keys"])
        self.group = options.get("group") or None
        self.trim = options.get("trim_on_commit") == "true"
        self.fail_on_data_loss = options.get("fail_on_data_loss", "true") == "true"
        self.max_records = int(options["max_records"]) if options.get("max_records") else None
        self.starting = options.get("starting_position", "earliest")
        self.target: dict[str, Position] | None = None
        self._client = None
        self._noted: set[tuple[str, str]] = set()

    @property
    def client(self):
        if self._client is None:
            self._client = self.conn.client()
        return self._client

    def _info(self, key: str) -> dict | None:
        import redis

        try:
            return self.client.xinfo_stream(key)
        except redis.ResponseError as exc:  # no such key
            if "no such key" in str(exc).lower():
                return None
            raise

    @staticmethod
    def _end_of(info: dict | None) -> Position:
        """The stream's newest position: its last generated id (an entry deleted at the
        end still counts) and every entry it was ever given."""
        if info is None:
            return {"id": "0-0", "n": 0, "d": "0-0"}
        return {"id": as_text(info["last-generated-id"]), "n": int(info["entries-added"]),
                "d": deleted_id(info)}

    def initialOffset(self) -> dict[str, Position]:
        return {key: self._initial(key) for key in self.keys}

    def _initial(self, key: str) -> Position:
        """Where a new checkpoint (or a stream added to the configuration) starts: with
        a consumer group that exists, where the group is (before its oldest pending
        entry, else at its last delivered one); else ``starting_position``: ``latest``
        at the stream's end, ``earliest`` before its oldest entry still there."""
        info = self._info(key)
        if self.group and info is not None:
            group = next((g for g in self.client.xinfo_groups(key)
                          if as_text(g["name"]) == self.group), None)
            if group is not None:
                pending = self.client.xpending(key, self.group)
                if pending["pending"]:
                    low = as_text(pending["min"])
                    return {"id": previous_id(low), "d": deleted_id(info),
                            "n": self._count_before(key, info, group, low)}
                read = group.get("entries-read")
                last = as_text(group["last-delivered-id"])
                exact = read is not None and parse_id(deleted_id(info)) <= parse_id(last)
                return {"id": last, "n": int(read) if exact else -1, "d": deleted_id(info)}
        first = info.get("first-entry") if info is not None else None
        if info is None or self.starting == "latest" or not first:
            pos = self._end_of(info)
        else:  # the count is exact unless entries after the first one were deleted
            first_id = as_text(first[0])
            exact = parse_id(deleted_id(info)) < parse_id(first_id)
            pos = {"id": previous_id(first_id), "d": deleted_id(info),
                   "n": int(info["entries-added"]) - int(info["length"]) if exact else -1}
        if self.group:
            self._ensure_group(key, pos)
        return pos

    def _count_before(self, key: str, info: dict, group: dict, low: str) -> int:
        """The count (entries ever added) just before the group's oldest pending entry
        ``low``: the group's ``entries-read`` (its last delivered entry's count) less the
        entries from ``low`` to that one, when no entry of that range was ever deleted
        or trimmed (-1 otherwise: unknown). Reads the pending range's ids once, at a new
        checkpoint's start."""
        read, last = group.get("entries-read"), as_text(group["last-delivered-id"])
        first = info.get("first-entry")
        if (read is None or not first or parse_id(deleted_id(info)) >= parse_id(low)
                or parse_id(as_text(first[0])) > parse_id(low)
                or parse_id(low) > parse_id(last)):  # a pending entry past the group's
            return -1                                # last delivered one (SETID, XCLAIM)
        count, begin = 0, low
        while True:
            page = self.client.xrange(key, begin, last, count=PAGE)
            count += len(page)
            if len(page) < PAGE:
                break
            begin = f"({as_text(page[-1][0])}"
        # nothing of the range went while it was counted
        unchanged = self._unchanged_since(key, deleted_id(info), low)
        return int(read) - count if unchanged and int(read) >= count else -1

    def _ensure_group(self, key: str, at: Position, *, mkstream: bool = True) -> bool:
        """Create the group at ``at`` unless it exists; False if the stream is gone
        (and ``mkstream`` is off: a commit does not bring back a deleted stream)."""
        import redis

        try:
            self.client.xgroup_create(key, self.group, id=at["id"], mkstream=mkstream,
                                      entries_read=at["n"] if at["n"] >= 0 else None)
        except redis.ResponseError as exc:
            text = str(exc)
            if "BUSYGROUP" in text:
                return True
            if not mkstream and "requires the key to exist" in text:
                return False
            raise
        return True

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {key: self._end_of(self._info(key)) for key in self.keys}

    def latestOffset(self, start: dict[str, Position] | None = None, limit: object = None
                     ) -> dict[str, Position]:
        start = dict(start or self.initialOffset())
        budget = None
        if isinstance(limit, ReadMaxRows):
            budget = max(1, limit.max_rows // max(1, len(self.keys)))
        end = {}
        for key in self.keys:
            if key not in start:  # a stream added to the configuration joins here; the
                end[key] = self._initial(key)  # next batch reads it (see partitions)
                continue
            begin = start[key]
            info, _ = self._check_loss(key, begin)
            stop = self._end_of(info)
            cap = self.target[key] if self.target is not None else None
            if cap is not None and pos_id(cap) < pos_id(stop):
                stop = cap
            if budget is not None and pos_id(stop) > pos_id(begin):
                page = self.client.xrange(key, f"({begin['id']}", stop["id"], count=budget)
                if len(page) == budget and as_text(page[-1][0]) != stop["id"]:
                    # the count adds up only if no entry after begin was ever deleted or
                    # trimmed, also not between the XINFO above and the XRANGE: the loss
                    # check again, after the page (a trim is from the oldest entry on, so
                    # one that took a page's entry leaves fewer entries after begin than
                    # were added; the page's first entry being the oldest proves nothing)
                    exact = (begin["n"] >= 0 and parse_id(stop["d"]) <= pos_id(begin)
                             and not self._check_loss(key, begin)[1])
                    stop = {"id": as_text(page[-1][0]), "d": stop["d"],
                            "n": begin["n"] + len(page) if exact else -1,
                            "h": fingerprint(page[-1][1])}
            end[key] = self._marked(key, stop) if pos_id(stop) > pos_id(begin) else begin
        for key, pos in start.items():  # a stream no longer configured keeps its
            end.setdefault(key, pos)    # position: added back, it goes on from
        return end                           # there, not from starting_position

    def _held(self, key: str, entry_id: str) -> str | None:
        """The fingerprint of the entry at ``entry_id``; None when there is none."""
        page = self.client.xrange(key, entry_id, entry_id)
        return fingerprint(page[0][1]) if page else None

    def _marked(self, key: str, end: Position) -> Position:
        """``end`` with the fingerprint of the entry at it (the loss check's proof the
        stream was not written again up to there), when there is one."""
        if "h" in end:
            return end
        held = self._held(key, end["id"])
        return end if held is None else {**end, "h": held}

    def reportLatestOffset(self) -> dict[str, Position] | None:  # noqa: N802
        """Each stream's end (Spark's progress ``latestOffset``): with the batch's end
        it gives the entries behind, lakesink's lag metric."""
        return {key: self._end_of(self._info(key)) for key in self.keys} or None

    def _unchanged_since(self, key: str, deleted: str, first_read: bytes | str) -> bool:
        """Nothing was deleted (XDEL) since ``deleted`` was seen, nor trimmed up to the
        first entry just read."""
        info = self._info(key)
        first = info.get("first-entry") if info is not None else None
        return (info is not None and deleted_id(info) == deleted and bool(first)
                and parse_id(as_text(first[0])) <= parse_id(as_text(first_read)))

    def _check_loss(self, key: str, begin: Position) -> tuple[dict | None, bool]:
        """Fail (``fail_on_data_loss``) when entries after ``begin`` are gone unread
        (:func:`loss` says how). Returns the stream's ``XINFO STREAM`` and whether a
        loss was found (and only logged)."""
        # the entry at the position before the stream's state: a trim or delete between
        # the two is then seen as one (the other order took it for a rewrite)
        held = self._held(key, begin["id"]) if "h" in begin else None
        info = self._info(key)
        if info is None:
            return info, False
        message = loss(key, info, begin, held)
        if message is None:
            note = read_ones_lost(key, info, begin, held)
            if note is not None and (key, begin["id"]) not in self._noted:
                self._noted.add((key, begin["id"]))  # once per position, not per trigger
                logger.warning(note)
            return info, False
        if self.fail_on_data_loss:
            raise SourceError(message)
        logger.warning(message)
        return info, True

    def partitions(self, start: dict[str, Position], end: dict[str, Position]
                   ) -> list[StreamRange]:
        """One task per stream with entries in the batch. Runs on the driver for every
        batch, a replayed one too: entries of the range gone since fail it here
        (``fail_on_data_loss``) instead of reading fewer."""
        ranges = [StreamRange(key, start[key]["id"], end[key]["id"]) for key in self.keys
                  if key in start and key in end and pos_id(end[key]) > pos_id(start[key])]
        for r in ranges:
            self._check_loss(r.key, start[r.key])
        return ranges

    def read(self, partition: StreamRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        opts = self.options
        value_field, key_field = opts.get("value_field") or None, opts.get("key_field") or None
        headers = opts.get("headers") == "true"
        client = self.conn.client()
        try:
            yield from self._pages(client, partition, value_field, key_field, headers)
        finally:
            client.close()

    @staticmethod
    def _pages(client, partition: StreamRange, value_field: str | None,
               key_field: str | None, headers: bool) -> Iterator[pa.RecordBatch]:
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
                times.append(min(parse_id(eid)[0], MAX_TIME_MS))
                heads.append([("redis.id", eid.encode()), *head])
            yield record_batch(keys=keys, values=values, topic=partition.key,
                               offsets=offsets, times_ms=times, timestamp_type=1,
                               headers=heads if headers else None)
            begin = as_text(page[-1][0])
            if len(page) < PAGE or begin == partition.end:
                return

    def commit(self, end: dict[str, Position]) -> None:
        """After the batch ending at ``end`` is durable: with a consumer group, move the
        group's last delivered id forward to ``end`` (``XGROUP SETID``, with its entries
        read) and acknowledge any entry still pending up to it (delivered by an earlier
        consumer, such as the one lakesink took over from); trim below it if asked."""
        if self.group or self.trim:
            fault_point("source_before_commit")
        for key, last in end.items():
            if key not in self.keys or last["id"] == "0-0":
                continue
            if self.group and self._ensure_group(key, last, mkstream=False):
                self._ack_through(key, last["id"])
                self._advance_group(key, last)
            if self.trim:
                self.client.xtrim(key, minid=next_id(last["id"]), approximate=False)

    def _advance_group(self, key: str, last: Position) -> None:
        group = next((g for g in self.client.xinfo_groups(key)
                      if as_text(g["name"]) == self.group), None)
        if group is not None and parse_id(as_text(group["last-delivered-id"])) >= pos_id(last):
            return
        self.client.xgroup_setid(key, self.group, last["id"],
                                 entries_read=last["n"] if last["n"] >= 0 else None)

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


class RedisStreamsDataSource(RecordSource):
    format = FORMAT
    reader = RedisStreamsReader
