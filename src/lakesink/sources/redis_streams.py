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

import hashlib
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

logger = logging.getLogger(__name__)

FORMAT = "lakesink-redis-streams"
PAGE = 1000
_SEQ_BITS = 20
_MAX_SEQ = (1 << 64) - 1
#: an explicit id's milliseconds beyond year 9999 are clamped there as the timestamp
MAX_TIME_MS = 253_402_300_799_999


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


@dataclass(frozen=True)
class StreamRange(InputPartition):
    key: str
    start: str  # exclusive
    end: str  # inclusive


#: {"id": "<ms>-<seq>", "n": entries ever added up to that id (-1: unknown),
#:  "d": the stream's max-deleted-entry-id when the position was taken,
#:  "h": the fingerprint of the entry at "id" when a batch ended there (absent when no
#:  entry was there: a start's position, or an offset of an earlier lakesink)}
Position = dict


def _id(pos: Position) -> tuple[int, int]:
    return parse_id(pos["id"])


def _deleted(info: dict | None) -> str:
    return as_text(info.get("max-deleted-entry-id") or "0-0") if info else "0-0"


def fingerprint(fields: dict) -> str:
    """A digest of an entry's fields and values, in order: tells the entry a batch
    ended at from another one given the same id later."""
    digest = hashlib.blake2b(digest_size=8)
    for part in (p for pair in fields.items() for p in pair):
        data = part if isinstance(part, bytes) else str(part).encode()
        digest.update(len(data).to_bytes(4, "big") + data)
    return digest.hexdigest()


def _loss(key: str, info: dict, begin: Position, at: str | None) -> str | None:
    """What was lost after ``begin``, as the message to fail or warn with; None when
    nothing was. ``at`` is the fingerprint of the entry now at ``begin``'s id (None:
    none there). Lost: the stream is behind the position; entries were deleted
    (``XDEL`` since the position was taken: ``max-deleted-entry-id`` grew past
    ``begin``) or trimmed (the stream's oldest entry is past ``begin`` and fewer
    entries are left after it than were added after it); or the stream was written
    again up to the position (the entry there is another one)."""
    last = as_text(info["last-generated-id"])
    if parse_id(last) < _id(begin):
        # audit-2 #17: the stream is behind the position (a failover to a replica that
        # lacked the newest entries; a stream made again with explicit ids): entries it
        # is given now can get ids at or below the position, which a read after the
        # position never returns
        return (f"Redis stream {key!r}: its last entry id {last} is before the "
                f"checkpoint's position {begin['id']}: the stream lost entries that were "
                "read (a failover to a replica that lagged?) and new entries may get ids "
                "at or below the position, which are never read. Set "
                "source.redis.fail_on_data_loss: false to go on (entries added at or "
                "below the position are then skipped)")
    deleted = _deleted(info)
    first = info.get("first-entry")
    added_after = int(info["entries-added"]) - begin["n"]
    if parse_id(deleted) > max(_id(begin), parse_id(begin.get("d", "0-0"))):
        what = f"deleted (XDEL, up to {deleted})"
    elif begin["n"] >= 0 and parse_id(begin.get("d", "0-0")) <= _id(begin) \
            and (not first or parse_id(as_text(first[0])) > _id(begin)) \
            and added_after > int(info["length"]):
        what = f"trimmed ({added_after - int(info['length'])} entries)"
    else:
        return _rewritten(key, begin, at)
    return (f"Redis stream {key!r}: entries after the checkpoint's position "
            f"{begin['id']} were {what} before they were read; rows are lost. Set "
            "source.redis.fail_on_data_loss: false to go on")


def _rewritten(key: str, begin: Position, at: str | None) -> str | None:
    """The part of :func:`_loss` for a stream whose last id and count caught up with
    the position again after a failover to a replica that lagged (its clock behind):
    another entry at the position's id is one given since, and so can be others at or
    below it, which a read after the position skips."""
    if "h" not in begin or at is None or at == begin["h"]:
        return None
    return (f"Redis stream {key!r}: the entry at the checkpoint's position {begin['id']} "
            "is not the one that was read there: the stream was written again (a failover "
            "to a replica that lagged, with its clock behind?), and entries it was given "
            "at or below the position are never read. Set "
            "source.redis.fail_on_data_loss: false to go on (they are then skipped)")


def _read_ones_lost(key: str, info: dict, begin: Position, at: str | None) -> str | None:
    """A warning, when the entry at the position is gone though nothing was trimmed or
    deleted up to it (by ``max-deleted-entry-id`` and the oldest entry): a failover to
    a replica that lagged most likely, whose new entries got ids past the position
    (nothing is skipped: the entries it lacks were read). Not a failure: a trim that
    keeps older pending entries (Redis 8.2's ``ACKED``) and a copied stream look the
    same, and new entries given ids at or below the position are told apart only where
    one took the position's id (:func:`_rewritten`)."""
    first = info.get("first-entry")
    if ("h" not in begin or at is not None or not first
            or parse_id(as_text(first[0])) > _id(begin)
            or parse_id(_deleted(info)) >= _id(begin)):
        return None
    return (f"Redis stream {key!r}: the entry at the checkpoint's position {begin['id']} "
            "is gone, though nothing was trimmed or deleted up to it: a failover to a "
            "replica that lacked entries lakesink had read (they are in the table)? If "
            "the new master's clock was behind, entries it was given at or below the "
            "position are not read")


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
                "d": _deleted(info)}

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
                    return {"id": previous_id(low), "d": _deleted(info),
                            "n": self._count_before(key, info, group, low)}
                read = group.get("entries-read")
                last = as_text(group["last-delivered-id"])
                exact = read is not None and parse_id(_deleted(info)) <= parse_id(last)
                return {"id": last, "n": int(read) if exact else -1, "d": _deleted(info)}
        first = info.get("first-entry") if info is not None else None
        if info is None or self.starting == "latest" or not first:
            pos = self._end_of(info)
        else:  # the count is exact unless entries after the first one were deleted
            first_id = as_text(first[0])
            exact = parse_id(_deleted(info)) < parse_id(first_id)
            pos = {"id": previous_id(first_id), "d": _deleted(info),
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
        if (read is None or not first or parse_id(_deleted(info)) >= parse_id(low)
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
        unchanged = self._unchanged_since(key, _deleted(info), low)
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
            if cap is not None and _id(cap) < _id(stop):
                stop = cap
            if budget is not None and _id(stop) > _id(begin):
                page = self.client.xrange(key, f"({begin['id']}", stop["id"], count=budget)
                if len(page) == budget and as_text(page[-1][0]) != stop["id"]:
                    # the count adds up only if no entry after begin was ever deleted or
                    # trimmed, also not between the XINFO above and the XRANGE: the loss
                    # check again, after the page (a trim is from the oldest entry on, so
                    # one that took a page's entry leaves fewer entries after begin than
                    # were added; the page's first entry being the oldest proves nothing)
                    exact = (begin["n"] >= 0 and parse_id(stop["d"]) <= _id(begin)
                             and not self._check_loss(key, begin)[1])
                    stop = {"id": as_text(page[-1][0]), "d": stop["d"],
                            "n": begin["n"] + len(page) if exact else -1,
                            "h": fingerprint(page[-1][1])}
            end[key] = self._marked(key, stop) if _id(stop) > _id(begin) else begin
        for key, position in start.items():  # a stream no longer configured keeps its
            end.setdefault(key, position)    # position: added back, it goes on from
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
        return (info is not None and _deleted(info) == deleted and bool(first)
                and parse_id(as_text(first[0])) <= parse_id(as_text(first_read)))

    def _check_loss(self, key: str, begin: Position) -> tuple[dict | None, bool]:
        """Fail (``fail_on_data_loss``) when entries after ``begin`` are gone unread
        (:func:`_loss` says how). Returns the stream's ``XINFO STREAM`` and whether a
        loss was found (and only logged)."""
        # the entry at the position before the stream's state: a trim or delete between
        # the two is then seen as one (the other order took it for a rewrite)
        held = self._held(key, begin["id"]) if "h" in begin else None
        info = self._info(key)
        if info is None:
            return info, False
        message = _loss(key, info, begin, held)
        if message is None:
            note = _read_ones_lost(key, info, begin, held)
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
                  if key in start and key in end and _id(end[key]) > _id(start[key])]
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
        if group is not None and parse_id(as_text(group["last-delivered-id"])) >= _id(last):
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
