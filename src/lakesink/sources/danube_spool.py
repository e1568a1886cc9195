"""The spool of the Danube source: an append-only, fsynced log of one topic's messages
in the query's checkpoint.

A record is a 4-byte big-endian length and a serialized ``StreamMessage``. Records go to
segments named by the global byte position of their first record (``<20 digits>.log``);
a position is a global byte offset, so a batch is a byte range ``[start, end)`` of
immutable bytes: a replay reads the same records. ``state.json`` keeps the first
position still on disk and, per partition, the last offset spooled (the key to
recognise a message the broker sends again after a crash between the fsync and the ack).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SEGMENT_BYTES = 64 << 20
_LEN = struct.Struct(">I")


class Spool:
    def __init__(self, folder: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        state = self._state()
        self.base: int = state.get("base", 0)
        self.last: dict[str, int] = dict(state.get("last", {}))
        self.segments = sorted(int(p.stem) for p in folder.glob("*.log"))
        self.end = self.base
        if self.segments:
            tail = self.segments[-1]
            self.end = tail + self._valid_length(tail)
            for message in self.records(self.segments[0], self.end):
                self._remember(message)

    # -- writing (the receiving thread) -------------------------------------------------

    def seen(self, message: Any) -> bool:
        """Spooled already (the broker sent it again)?"""
        return message.msg_id.topic_offset <= self.last.get(message.msg_id.topic_name, -1)

    def append(self, message: Any) -> None:
        """Append and fsync; only then may the message be acknowledged."""
        data = message.SerializeToString()
        with self.lock:
            new = not self.segments or self.end - self.segments[-1] >= self.segment_bytes
            if new:
                self.segments.append(self.end)
            path = self._path(self.segments[-1])
            with open(path, "ab") as out:
                out.write(_LEN.pack(len(data)) + data)
                out.flush()
                os.fsync(out.fileno())
            if new:
                _fsync_dir(self.folder)  # a new segment's name is durable too
            self.end += _LEN.size + len(data)
            self._remember(message)

    def _remember(self, message: Any) -> None:
        part = message.msg_id.topic_name
        self.last[part] = max(self.last.get(part, -1), message.msg_id.topic_offset)

    # -- reading ------------------------------------------------------------------------

    def position_after(self, start: int, most: int) -> int:
        """The position after at most ``most`` records from ``start``."""
        return self.scan(start, most)[0]

    def scan(self, start: int, most: int) -> tuple[int, int]:
        """(the position after at most ``most`` records from ``start``, their count)."""
        with self.lock:
            end = self.end
        pos, n = start, 0
        for seg_start in self._segments_from(start):
            path = self._path(seg_start)
            with open(path, "rb") as f:
                f.seek(pos - seg_start)
                while n < most and pos < end:
                    head = f.read(_LEN.size)
                    if len(head) < _LEN.size:
                        break
                    (size,) = _LEN.unpack(head)
                    f.seek(size, os.SEEK_CUR)
                    pos += _LEN.size + size
                    n += 1
            if n >= most or pos >= end:
                break
        return pos, n

    def records(self, start: int, end: int) -> Iterator[Any]:
        """The messages in ``[start, end)``."""
        return read_range(self.folder, start, end)

    def _segments_from(self, start: int) -> list[int]:
        return segments_from(self.folder, start)

    # -- after a batch is durable -------------------------------------------------------

    def drop_below(self, pos: int) -> None:
        """Delete the segments wholly before ``pos`` (the state first, so the last
        offsets they held stay known)."""
        with self.lock:
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
        """A segment's length up to its last whole record (a torn write at a crash is
        cut off: its message was never acknowledged, the broker sends it again)."""
        path = self._path(seg_start)
        size, pos = path.stat().st_size, 0
        with open(path, "rb") as f:
            while True:
                head = f.read(_LEN.size)
                if len(head) < _LEN.size:
                    break
                (n,) = _LEN.unpack(head)
                if pos + _LEN.size + n > size:
                    break
                f.seek(n, os.SEEK_CUR)
                pos += _LEN.size + n
        if pos < size:
            with open(path, "r+b") as f:
                f.truncate(pos)
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


def read_range(folder: Path, start: int, end: int) -> Iterator[Any]:
    """The messages in ``[start, end)`` of the spool in ``folder``, without opening it
    for writing (Spark's tasks read while the driver appends)."""
    from danube.proto import DanubeApi_pb2 as pb

    pos = start
    for seg_start in segments_from(folder, start):
        with open(folder / f"{seg_start:020d}.log", "rb") as f:
            f.seek(pos - seg_start)
            while pos < end:
                head = f.read(_LEN.size)
                if len(head) < _LEN.size:
                    break
                (size,) = _LEN.unpack(head)
                message = pb.StreamMessage()
                message.ParseFromString(f.read(size))
                pos += _LEN.size + size
                yield message
        if pos >= end:
            return
