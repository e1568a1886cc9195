"""Positions in a Redis stream, and what tells that entries after one are gone.

An entry id is ``<ms>-<seq>``; a :data:`Position` is where a batch ended (or a stream's
start), with what the loss rules need to tell, at the next batch, whether entries after
it went unread: the count of entries the stream was ever given up to it, the stream's
``max-deleted-entry-id`` then, and a fingerprint of the entry at it. The reader
(:mod:`lakesink.sources.redis_streams`) asks :func:`loss` (a failure, with
``fail_on_data_loss``) and :func:`read_ones_lost` (a warning) before every batch.
"""

from __future__ import annotations

import hashlib

from lakesink.sources.redis_conn import as_text

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


#: {"id": "<ms>-<seq>", "n": entries ever added up to that id (-1: unknown),
#:  "d": the stream's max-deleted-entry-id when the position was taken,
#:  "h": the fingerprint of the entry at "id" when a batch ended there (absent when no
#:  entry was there: a start's position, or an offset of an earlier lakesink)}
Position = dict


def pos_id(pos: Position) -> tuple[int, int]:
    return parse_id(pos["id"])


def deleted_id(info: dict | None) -> str:
    return as_text(info.get("max-deleted-entry-id") or "0-0") if info else "0-0"


def fingerprint(fields: dict) -> str:
    """A digest of an entry's fields and values, in order: tells the entry a batch
    ended at from another one given the same id later."""
    digest = hashlib.blake2b(digest_size=8)
    for part in (p for pair in fields.items() for p in pair):
        data = part if isinstance(part, bytes) else str(part).encode()
        digest.update(len(data).to_bytes(4, "big") + data)
    return digest.hexdigest()


def loss(key: str, info: dict, begin: Position, at: str | None) -> str | None:
    """What was lost after ``begin``, as the message to fail or warn with; None when
    nothing was. ``at`` is the fingerprint of the entry now at ``begin``'s id (None:
    none there). Lost: the stream is behind the position; entries were deleted
    (``XDEL`` since the position was taken: ``max-deleted-entry-id`` grew past
    ``begin``) or trimmed (the stream's oldest entry is past ``begin`` and fewer
    entries are left after it than were added after it); or the stream was written
    again up to the position (the entry there is another one)."""
    last = as_text(info["last-generated-id"])
    if parse_id(last) < pos_id(begin):
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
    deleted = deleted_id(info)
    first = info.get("first-entry")
    added_after = int(info["entries-added"]) - begin["n"]
    if parse_id(deleted) > max(pos_id(begin), parse_id(begin.get("d", "0-0"))):
        what = f"deleted (XDEL, up to {deleted})"
    elif begin["n"] >= 0 and parse_id(begin.get("d", "0-0")) <= pos_id(begin) \
            and (not first or parse_id(as_text(first[0])) > pos_id(begin)) \
            and added_after > int(info["length"]):
        what = f"trimmed ({added_after - int(info['length'])} entries)"
    else:
        return rewritten(key, begin, at)
    return (f"Redis stream {key!r}: entries after the checkpoint's position "
            f"{begin['id']} were {what} before they were read; rows are lost. Set "
            "source.redis.fail_on_data_loss: false to go on")


def rewritten(key: str, begin: Position, at: str | None) -> str | None:
    """The part of :func:`loss` for a stream whose last id and count caught up with
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


def read_ones_lost(key: str, info: dict, begin: Position, at: str | None) -> str | None:
    """A warning, when the entry at the position is gone though nothing was trimmed or
    deleted up to it (by ``max-deleted-entry-id`` and the oldest entry): a failover to
    a replica that lagged most likely, whose new entries got ids past the position
    (nothing is skipped: the entries it lacks were read). Not a failure: a trim that
    keeps older pending entries (Redis 8.2's ``ACKED``) and a copied stream look the
    same, and new entries given ids at or below the position are told apart only where
    one took the position's id (:func:`rewritten`)."""
    first = info.get("first-entry")
    if ("h" not in begin or at is not None or not first
            or parse_id(as_text(first[0])) > pos_id(begin)
            or parse_id(deleted_id(info)) >= pos_id(begin)):
        return None
    return (f"Redis stream {key!r}: the entry at the checkpoint's position {begin['id']} "
            "is gone, though nothing was trimmed or deleted up to it: a failover to a "
            "replica that lacked entries lakesink had read (they are in the table)? If "
            "the new master's clock was behind, entries it was given at or below the "
            "position are not read")
