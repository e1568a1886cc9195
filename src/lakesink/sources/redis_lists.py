"""Redis lists as a Spark streaming source (format ``lakesink-redis-lists``).

A list has no offsets and popping is destructive, so a batch's items are first moved,
atomically, into a processing list of their own (the reliable-queue pattern):

* ``latestOffset`` (driver, before Spark writes the batch's offsets to its log) moves
  up to N items from the head of each list into ``<prefix>{<list>}:<consumer>:<n>``,
  where ``n`` is the batch's number for that list, in one Lua script that first checks
  whether that processing list exists already: a driver that crashed after the move
  and before the offset log was written finds its items there and takes them again,
  instead of moving more. The offset is ``{"<list>": n}``.
* ``read`` (tasks) reads the processing list with ``LRANGE``: a replayed batch reads
  exactly the same items, in the same order.
* ``commit(end)`` (after the batch is durable) deletes the processing lists up to
  ``end``. Nothing is removed before.
* With ``wait_replicas`` (option; ``source.redis.wait_replicas``), a move is followed by
  ``WAIT``: the batch goes on only once that many replicas have it, so a failover to a
  replica (Redis replicates asynchronously) cannot lose a move whose items a batch
  writes — they would be handed out again (audit-2 #17). Fewer replicas within
  ``wait_timeout_ms`` fail the query (a :class:`~lakesink.errors.SourceError`); the
  restart takes the moved items again from their processing list.

The processing lists of a list and ``consumer`` belong to one checkpoint (option
``owner``, recorded in ``<prefix>{<list>}:<consumer>:owner`` by a move, deleted with the
last processing list): a second deployment with the same consumer name and another
checkpoint is refused at its move instead of taking the first one's batches as its own
(both would write them).
A checkpoint deleted and made again at the same place is the same owner, so processing
lists that exist when it starts (the old checkpoint was lost) are read first: their items may have reached the table already (at-least-once for
that case, like re-reading a Kafka topic after deleting its checkpoint), but none is
lost. A record's ``offset`` is ``n × 2^32 + index`` in its processing list; its
``timestamp`` the time of the move (kept in the processing list's index).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow
from redis.exceptions import ResponseError

from lakesink.errors import SourceError
from lakesink.faults import fault_point
from lakesink.sources.records import RecordSource, record_batch
from lakesink.sources.redis_conn import Conn, as_text

logger = logging.getLogger(__name__)

FORMAT = "lakesink-redis-lists"
PAGE = 1000
DEFAULT_BATCH = 10_000

# KEYS: source list, processing list, index (a hash: batch number -> move time in ms),
# owner key. ARGV: batch number, max items, now (ms), owner ('' = not checked). Returns
# the items moved, or minus the length of the processing list if it existed already (a
# batch taken before a crash); an error if another owner has the processing lists.
_MOVE = """
if ARGV[4] ~= '' then
  local owner = redis.call('GET', KEYS[4])
  if owner and owner ~= ARGV[4] then
    return redis.error_reply('LAKESINK_OWNER ' .. owner)
  end
  if not owner then redis.call('SET', KEYS[4], ARGV[4]) end
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return -redis.call('LLEN', KEYS[2])
end
local n = 0
for i = 1, tonumber(ARGV[2]) do
  if not redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') then break end
  n = n + 1
end
if n > 0 then redis.call('HSET', KEYS[3], ARGV[1], ARGV[3]) end
return n
"""
# KEYS: index, owner key; ARGV: processing-list prefix, last batch number to delete,
# owner ('' = not checked). With no batch left in flight, the owner key goes too
# (nothing is left to take over). Another owner's processing lists are not deleted
# (returns -1): a deployment refused at its move must not delete them unread.
_DELETE = """
if ARGV[3] and ARGV[3] ~= '' then
  local owner = redis.call('GET', KEYS[2])
  if owner and owner ~= ARGV[3] then return -1 end
end
local done = 0
for _, seq in ipairs(redis.call('HKEYS', KEYS[1])) do
  if tonumber(seq) <= tonumber(ARGV[2]) then
    redis.call('DEL', ARGV[1] .. seq)
    redis.call('HDEL', KEYS[1], seq)
    done = done + 1
  end
end
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[2]) end
return done
"""


def names(prefix: str, key: str, consumer: str) -> tuple[str, str]:
    """(the processing lists' name prefix, the index's name) of list ``key``; the hash
    tag keeps them in the list's slot on a Redis Cluster."""
    base = f"{prefix}{{{key}}}:{consumer}"
    return f"{base}:", f"{base}:index"


def owner_key(prefix: str, key: str, consumer: str) -> str:
    return f"{prefix}{{{key}}}:{consumer}:owner"


@dataclass(frozen=True)
class ListBatch(InputPartition):
    key: str
    seq: int


class RedisListsReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring for the contract."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.conn = Conn.of(options)
        self.keys: list[str] = json.loads(options["keys"])
        self.prefix = options.get("queue_prefix", "lakesink:")
        self.consumer = options.get("consumer") or "lakesink"
        self.batch = int(options.get("max_records") or DEFAULT_BATCH)
        self.remaining: dict[str, int] | None = None  # availableNow: items left to take
        self.wait_replicas = int(options.get("wait_replicas") or 0)
        self.wait_timeout_ms = int(options.get("wait_timeout_ms") or 1000)
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = self.conn.client()
            self._move = self._client.register_script(_MOVE)
            self._delete = self._client.register_script(_DELETE)
        return self._client

    def _pending(self, key: str) -> list[int]:
        _, index = names(self.prefix, key, self.consumer)
        return sorted(int(s) for s in self.client.hkeys(index))

    def initialOffset(self) -> dict[str, int]:
        """Before the oldest processing list left by a lost checkpoint, else 0."""
        return {key: self._initial(key) for key in self.keys}

    def _initial(self, key: str) -> int:
        pending = self._pending(key)
        return pending[0] - 1 if pending else 0

    def getDefaultReadLimit(self) -> ReadMaxRows:
        return ReadMaxRows(self.batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Take only what is in the lists now (plus what is already being processed)."""
        self.remaining = {key: int(self.client.llen(key)) for key in self.keys}

    def latestOffset(self, start: dict[str, int] | None = None, limit: object = None
                     ) -> dict[str, int]:
        start = dict(start or self.initialOffset())
        client = self.client  # (and its scripts)
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else self.batch
        most = max(1, most // max(1, len(self.keys)))
        end = {}
        for key in self.keys:
            if key not in start:  # a list added to the configuration joins here, with
                end[key] = self._initial(key)  # nothing taken; the next batch takes
                continue
            seq = int(start[key]) + 1
            lists, _ = names(self.prefix, key, self.consumer)
            take = most if self.remaining is None else min(most, self.remaining[key])
            moved = 0
            if take > 0 or client.exists(f"{lists}{seq}"):
                moved = self._take(key, seq, take)
                if moved > 0:
                    self._replicated(key, seq)
                    fault_point("source_after_take")
                    if self.remaining is not None:
                        self.remaining[key] = max(0, self.remaining[key] - moved)
            end[key] = seq if moved else int(start[key])
        return end

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:  # noqa: N802
        """Items still in each list, not yet taken into a batch (Spark's progress
        ``latestOffset``: lakesink's lag metric)."""
        return {key: {"waiting": int(self.client.llen(key))} for key in self.keys} or None

    def _take(self, key: str, seq: int, take: int) -> int:
        lists, index = names(self.prefix, key, self.consumer)
        owner = owner_key(self.prefix, key, self.consumer)
        try:
            return int(self._move(keys=[key, f"{lists}{seq}", index, owner],
                                  args=[seq, max(take, 0), int(time.time() * 1000),
                                        self.options.get("owner", "")]))
        except ResponseError as exc:
            if "LAKESINK_OWNER" not in str(exc):
                raise
            other = str(exc).split("LAKESINK_OWNER ", 1)[1]
            raise SourceError(
                f"Redis list {key}: consumer_name {self.consumer!r} is used by the "
                f"deployment with checkpoint {other}; two deployments on one list need "
                "different source.redis.consumer_name values (to take the list over "
                f"from that checkpoint: stop its deployment, delete the key {owner} and "
                "start this one from a new checkpoint, which reads its unfinished "
                "batches first; a checkpoint already past them would delete them "
                "unread)") from None

    def _replicated(self, key: str, seq: int) -> None:
        """``WAIT`` for ``wait_replicas`` replicas to have the move (see the module
        docstring); fewer fail the query before the batch is written."""
        if self.wait_replicas <= 0:
            return
        acked = int(self.client.wait(self.wait_replicas, self.wait_timeout_ms))
        if acked < self.wait_replicas:
            raise SourceError(
                f"Redis list {key}: batch {seq}'s move reached {acked} of "
                f"source.redis.wait_replicas={self.wait_replicas} replica(s) within "
                f"{self.wait_timeout_ms} ms; a failover now could hand its items out "
                "again, so the run stops before writing them (a restart takes them from "
                "their processing list). Check the replicas, or lower wait_replicas")

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[ListBatch]:
        return [ListBatch(key, seq) for key in self.keys if key in start and key in end
                for seq in range(int(start[key]) + 1, int(end[key]) + 1)]

    def read(self, partition: ListBatch) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        client = self.conn.client()
        try:
            yield from self._items(client, partition)
        finally:
            client.close()

    def _items(self, client, partition: ListBatch) -> Iterator[pa.RecordBatch]:
        lists, index = names(self.prefix, partition.key, self.consumer)
        name = f"{lists}{partition.seq}"
        moved_ms = int(client.hget(index, str(partition.seq)) or 0)
        headers = self.options.get("headers") == "true"
        base = partition.seq << 32
        total = int(client.llen(name))
        for first in range(0, total, PAGE):
            items = client.lrange(name, first, min(first + PAGE, total) - 1)
            n = len(items)
            yield record_batch(
                keys=[None] * n, values=items, topic=partition.key,
                offsets=range(base + first, base + first + n), times_ms=[moved_ms] * n,
                timestamp_type=1, headers=[[("redis.list", as_text(name).encode())]] * n
                if headers else None)

    def commit(self, end: dict[str, int]) -> None:
        """After the batch ending at ``end`` is durable: delete its processing lists
        (and any older one left behind)."""
        for key, seq in end.items():
            if key not in self.keys:
                continue
            lists, index = names(self.prefix, key, self.consumer)
            if self.client.hlen(index):
                fault_point("source_before_commit")
            if self._delete(keys=[index, owner_key(self.prefix, key, self.consumer)],
                            args=[lists, int(seq), self.options.get("owner", "")]) == -1:
                logger.warning("Redis list %s: its processing lists belong to another "
                               "checkpoint; this one deletes none of them", key)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()


class RedisListsDataSource(RecordSource):
    format = FORMAT
    reader = RedisListsReader
