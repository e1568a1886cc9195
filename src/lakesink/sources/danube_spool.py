"""The spool of the Danube source: an append-only, fsynced log of one topic's messages
in the query's checkpoint.

A record is a 4-byte big-endian length, the CRC-32 of the data, and a serialized
``StreamMessage``. Records go to segments named by the global byte position of their
first record (``<20 digits>.log``); a position is a global byte offset, so a batch is a
byte range ``[start, end)`` of immutable bytes: a replay reads the same records.

Contract:

* :meth:`Spool.append` returns only after its records are fsynced (and a new
  segment's name too): only then may their messages be acknowledged.
* :meth:`Spool.scan` and :attr:`Spool.end` show only whole, fsynced records, so a
  position handed to Spark never points into a record that a crash can cut off.
* :meth:`Spool.drop_below` deletes only segments wholly before a position whose batch
  is durable.
* One process at a time writes a spool: opening it takes an exclusive ``flock`` on its
  folder's ``lock`` file (a second lakesink on the checkpoint, or a restarted query whose
  old planner is still stopping, waits and then fails with a clear message). Spark's
  tasks read with :func:`read_range`, which takes no lock (segments are immutable).
* ``state.json`` keeps the first position still on disk and, per partition and
  producer, the highest offset spooled and the latest publish time spooled (publish
  times are the producer's clock, so they are compared only with the same producer's).
  A message at or below that offset and not published later is one the broker sent
  again: after a crash between the fsync and the ack (one message in flight per
  partition), or after a broker restart, which resends what was acknowledged after its
  last saved cursor (Danube saves subscription progress every few seconds). A message
  at or below the offset but published later is new — the topic was deleted and made
  again — and is spooled, with a warning. A producer not seen before sends new
  messages.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

from lakesink.errors import SourceError

logger = logging.getLogger(__name__)

SEGMENT_BYTES = 64 << 20
_HEAD = struct.Struct(">II")  # length, crc32


def message_key(message: Any) -> tuple[str, int, int, int, int]:
    """What tells one message from another: partition, offset, publish time, producer
    and the payload's checksum (a non-reliable topic's messages carry no offset: two
    sent in one millisecond differ only by their payload)."""
    return (message.msg_id.topic_name, message.msg_id.topic_offset, message.publish_time,
            message.msg_id.producer_id, payload_crc(message))


def payload_crc(message: Any) -> int:
    return zlib.crc32(message.payload)


class Spool:
    def __init__(self, folder: Path, *, segment_bytes: int = SEGMENT_BYTES,
                 lock_timeout_s: float = 30.0) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self._lock_file = _take_lock(folder / "lock", lock_timeout_s)
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        #: the end of the last batch known durable (the backlog is what lies after it)
        self.committed = self.base
        self._unstamped: set[str] = set()  # producers whose messages carry no offset
        self._cursor: tuple[int, int, int] = (-1, -1, 0)

    def _open(self) -> None:
        state = self._state()
        self.base: int = state.get("base", 0)
        #: per partition, per producer id: [highest offset, latest publish time, the
        #: payload checksum of the message spooled with both] (see seen)
        self.last: dict[str, dict[str, list[int]]] = {
            p: {k: list(x) for k, x in v.items()} if isinstance(v, dict) else {"*": list(v)}
            for p, v in state.get("last", {}).items()}  # "*": a state of lakesink 0.x
        segments = sorted(int(p.stem) for p in self.folder.glob("*.log"))
        for s in [s for s in segments if s < self.base]:  # a drop a crash interrupted
            self._path(s).unlink()
        self.segments = [s for s in segments if s >= self.base]
        if self.segments and self.segments[0] != self.base:
            raise SourceError(f"the Danube spool at {self.folder} starts at "
                              f"{self.segments[0]} but its state says {self.base}: "
                              "segments were deleted by hand; their messages are lost")
        self.end = self.base
        if self.segments:
            tail = self.segments[-1]
            self.end = tail + self._valid_length(tail)
            for message in read_range(self.folder, self.segments[0], self.end):
                self._remember(message)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the spool (an append still running finishes first; none starts)."""
        with self.lock:
            if not self._lock_file.closed:
                self._lock_file.close()  # releases the flock

    # -- writing (the receiving thread) -------------------------------------------------

    def seen(self, message: Any) -> bool:
        """Spooled already (the broker sent it again)?"""
        part, producer = message.msg_id.topic_name, str(message.msg_id.producer_id)
        known = self.last.get(part, {})
        mark = known.get(producer) or known.get("*")
        if mark is None:
            return False
        offset, published = mark[0], mark[1]
        if message.msg_id.topic_offset > offset:
            return False
        if message.msg_id.topic_offset == offset == 0:
            # No offsets to go by: a non-reliable topic (Danube's producers default to
            # it; its broker stamps no offset and redelivers nothing), or a reliable
            # topic's first message. Only the very message spooled last is a resend —
            # and nothing is, once the producer has sent two messages at offset 0
            # (unstamped: identical payloads in one millisecond are two messages)
            last = mark[2] if len(mark) > 2 else None
            unstamped = len(mark) > 3 and bool(mark[3])
            if (not unstamped and message.publish_time == published
                    and payload_crc(message) == last):
                return True
            if producer not in self._unstamped:
                self._unstamped.add(producer)
                logger.info("Danube %s: producer %s's messages carry no offset (a "
                            "non-reliable topic): each is spooled as it arrives; such a "
                            "topic keeps nothing for a consumer that is away", part,
                            producer)
            return False
        if message.publish_time <= published:
            return True
        logger.warning("Danube %s: offset %d of producer %s came after %d, published later "
                       "than anything it sent: the topic was made again; spooling it as new",
                       part, message.msg_id.topic_offset, producer, offset)
        known.pop("*", None)
        known[producer] = [-1, message.publish_time - 1]  # the new topic starts here
        return False

    def append(self, messages: list[Any]) -> None:
        """Append and fsync (once for all: a group commit); only then may the messages
        be acknowledged."""
        data = [m.SerializeToString() for m in messages]
        with self.lock:
            if self._lock_file.closed:
                raise SourceError(f"the Danube spool {self.folder} is closed")
            new = not self.segments or self.end - self.segments[-1] >= self.segment_bytes
            if new:
                self.segments.append(self.end)
            with open(self._path(self.segments[-1]), "ab") as out:
                out.write(b"".join(_HEAD.pack(len(d), zlib.crc32(d)) + d for d in data))
                out.flush()
                os.fsync(out.fileno())
            if new:
                _fsync_dir(self.folder)  # a new segment's name is durable too
            self.end += sum(_HEAD.size + len(d) for d in data)
            for message in messages:
                self._remember(message)

    def backlog(self) -> int:
        """Bytes spooled and not yet in a batch Spark has planned and finished."""
        return self.end - max(self.committed, self.base)

    def planned(self, pos: int) -> None:
        """Spark plans the batch from ``pos`` on: everything before is in finished
        batches (it only counts towards :meth:`backlog`; nothing is deleted)."""
        with self.lock:
            self.committed = max(self.committed, pos)

    def _remember(self, message: Any) -> None:
        known = self.last.setdefault(message.msg_id.topic_name, {})
        producer = str(message.msg_id.producer_id)
        offset, published, *rest = known.get(producer, (-1, -1))
        at = (message.msg_id.topic_offset, message.publish_time)
        last, unstamped = (rest + [None, False])[:2]
        # the checksum of the message with the highest (offset, publish time): what
        # tells a resend from a new message where offsets are all 0 (see seen)
        crc = payload_crc(message) if at >= (offset, published) else last
        if at[0] == 0 and offset == 0:  # a second message at offset 0: nothing stamps them
            unstamped = True
        elif at[0] > 0:  # offsets after all (a topic made again had one message)
            unstamped = False
        known[producer] = [max(offset, at[0]), max(published, at[1]), crc, unstamped]

    def stamped(self, message: Any) -> bool:
        """Whether ``message`` has an offset that tells it from others (not 0): only
        then may two messages of one received group be taken for one."""
        return bool(message.msg_id.topic_offset)

    # -- reading ------------------------------------------------------------------------

    def check_position(self, pos: int) -> None:
        """Fail unless ``pos`` (from the checkpoint) lies in this spool."""
        with self.lock:
            base, end = self.base, self.end
        if pos < base:
            raise SourceError(
                f"the checkpoint is at position {pos} of the Danube spool {self.folder}, "
                f"but the spool starts at {base}: the records before it were deleted "
                "after a durable batch, so this checkpoint is older than its spool")
        if pos > end:
            raise SourceError(
                f"the checkpoint is at position {pos} of the Danube spool {self.folder}, "
                f"but the spool ends at {end}: it was deleted, cut or belongs to another "
                "checkpoint; the messages in between are lost")

    def scan(self, start: int, most: int, until: int | None = None) -> tuple[int, int]:
        """(the position after at most ``most`` records from ``start`` and not past
        ``until``, their count). Repeated calls with the same start go on from where the
        last one stopped (a trigger polls while the spool grows)."""
        with self.lock:
            end = self.end if until is None else min(self.end, until)
        c_start, c_pos, c_n = self._cursor
        pos, n = (c_pos, c_n) if c_start == start and c_pos <= end and c_n <= most \
            else (start, 0)
        pos, more = count_records(self.folder, pos, end, most - n)
        n += more
        self._cursor = (start, pos, n)
        return pos, n

    # -- after a batch is durable -------------------------------------------------------

    def drop_below(self, pos: int) -> None:
        """Delete the segments wholly before ``pos`` (the state first, so the message
        keys they held stay known)."""
        with self.lock:
            self.committed = max(self.committed, pos)
            gone = [s for i, s in enumerate(self.segments)
                    if i + 1 < len(self.segments) and self.segments[i + 1] <= pos]
            if not gone:
                return
            self.base = self.segments[len(gone)]
            self._save_state()
            for s in gone:
                self._path(s).unlink(missing_ok=True)
            self.segments = self.segments[len(gone):]

    # -- files --------------------------------------------------------------------------

    def _path(self, seg_start: int) -> Path:
        return self.folder / f"{seg_start:020d}.log"

    def _valid_length(self, seg_start: int) -> int:
        """A segment's length up to its last whole, intact record: a torn last write
        (cut short, or its checksum wrong) is cut off — its message was never
        acknowledged, the broker sends it again. Damage before the last record fails."""
        path = self._path(seg_start)
        size, pos = path.stat().st_size, 0
        with open(path, "rb") as f:
            while True:
                head = f.read(_HEAD.size)
                if len(head) < _HEAD.size:
                    break
                n, crc = _HEAD.unpack(head)
                after = pos + _HEAD.size + n
                if after > size:
                    break  # cut short
                if n == 0 or zlib.crc32(f.read(n)) != crc:
                    if after < size and not _zeros(path, pos):
                        raise SourceError(
                            f"Danube spool {path}: the record at {seg_start + pos} is "
                            "damaged (checksum) and data follows it; the spool cannot be "
                            "read. If the process crashed while writing, nothing from "
                            "there on was acknowledged: truncating the file to "
                            f"{pos} bytes lets the broker send it again")
                    break  # the last write, torn (or zeros a crash left)
                pos = after
        if pos < size:
            logger.warning("Danube spool %s: cutting %d bytes of a write a crash tore",
                           path, size - pos)
            with open(path, "r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())
        return pos

    def _state(self) -> dict[str, Any]:
        path = self.folder / "state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _save_state(self) -> None:
        path = self.folder / "state.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            json.dump({"base": self.base, "last": self.last}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.folder)


def _take_lock(path: Path, timeout_s: float) -> Any:
    handle = open(path, "a")  # noqa: SIM115 - held for the spool's life
    deadline = time.monotonic() + timeout_s
    waiting = False
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if waiting:
                logger.debug("Danube spool %s: taken over after %.1fs", path.parent,
                            timeout_s - (deadline - time.monotonic()))
            return handle
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                raise SourceError(
                    f"the Danube spool {path.parent} is in use by another process after "
                    f"{timeout_s:.0f}s: another lakesink runs on this checkpoint, or the "
                    "last run's reader has not stopped") from None
            if not waiting:
                logger.debug("Danube spool %s: another process has it; waiting up to "
                            "%.0fs", path.parent, timeout_s)
                waiting = True
            time.sleep(0.1)


def _zeros(path: Path, pos: int) -> bool:
    """Only zero bytes from ``pos`` to the end (a crash can leave a file longer than
    what reached the disk)?"""
    with open(path, "rb") as f:
        f.seek(pos)
        while chunk := f.read(1 << 20):
            if chunk.count(0) != len(chunk):
                return False
    return True


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segments_from(folder: Path, start: int) -> list[int]:
    """The segments holding positions from ``start`` on."""
    segs = sorted(int(p.stem) for p in folder.glob("*.log"))
    first = max((s for s in segs if s <= start), default=None)
    return [s for s in segs if first is not None and s >= first]


def count_records(folder: Path, start: int, until: int | None = None,
                  most: int | None = None) -> tuple[int, int]:
    """(the position after the whole records from ``start`` on — at most ``most`` of
    them, not past ``until`` — and their count). Reads only the records' heads and takes
    no lock: a record still being written at the end is not counted."""
    pos, n = start, 0
    for seg_start in segments_from(folder, start):
        if seg_start > pos:
            break  # a gap: the count stops there
        with open(folder / f"{seg_start:020d}.log", "rb") as f:
            size_on_disk = os.fstat(f.fileno()).st_size
            f.seek(pos - seg_start)
            while (most is None or n < most) and (until is None or pos < until):
                head = f.read(_HEAD.size)
                if len(head) < _HEAD.size:
                    break
                size, _ = _HEAD.unpack(head)
                if pos - seg_start + _HEAD.size + size > size_on_disk:
                    return pos, n  # a record still being written
                f.seek(size, os.SEEK_CUR)
                pos += _HEAD.size + size
                n += 1
        if (most is not None and n >= most) or (until is not None and pos >= until):
            break
    return pos, n


def read_range(folder: Path, start: int, end: int) -> Iterator[Any]:
    """The messages in ``[start, end)`` of the spool in ``folder``, without opening it
    for writing (Spark's tasks read while the driver appends). Fails if the range is not
    all there or a record's checksum does not match: never fewer records in silence."""
    from danube.proto import DanubeApi_pb2 as pb

    pos = start
    for seg_start in segments_from(folder, start):
        if pos >= end:
            break
        if seg_start > pos:
            break  # a gap: reported below
        with open(folder / f"{seg_start:020d}.log", "rb") as f:
            f.seek(pos - seg_start)
            while pos < end:
                head = f.read(_HEAD.size)
                if len(head) < _HEAD.size:
                    break
                size, crc = _HEAD.unpack(head)
                data = f.read(size)
                if size == 0 or len(data) < size or zlib.crc32(data) != crc:
                    raise SourceError(f"Danube spool {folder}: the record at {pos} is "
                                      "damaged (checksum); the spool cannot be read")
                message = pb.StreamMessage()
                message.ParseFromString(data)
                pos += _HEAD.size + size
                yield message
    if pos != end:
        raise SourceError(f"Danube spool {folder}: the range [{start}, {end}) is not all "
                          f"there (read up to {pos}); were segments deleted?")
