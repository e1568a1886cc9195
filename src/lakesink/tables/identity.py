"""The app id bound to a checkpoint.

Batch ids restart at 0 with a new checkpoint, so everything keyed by batch id (Delta
``txnVersion``, Parquet manifests and file names) is also keyed by an app id that is
created with the checkpoint and stored inside it (``<checkpoint>/lakesink.json``).
Reusing an app id with a fresh checkpoint would make the new batches look done and
silently drop them; a new checkpoint therefore always gets a new id. A checkpoint whose
Spark offset log is gone while its ``lakesink.json`` stayed (someone deleted
``offsets/`` and ``commits/`` to re-read the topic) numbers its batches from 0 again,
which the old id has committed already: it is refused at start once the id has begun a
batch (:func:`mark_started`, written before the batch writes); before that the id has
written nothing and is kept.

Two first starts of one empty checkpoint (``replicas: 2`` by mistake) agree on one id:
the file is created with :meth:`~lakesink.tables.fs.HadoopFS.write_once`, and the start
that loses reads the winner's id back; the writer lease (keyed by the id) then refuses
the second writer. Without it each would have its own id and lease, and the batch one
query replays would be written again under the other's names (audit-2 #11).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from lakesink.errors import ConfigError
from lakesink.tables.fs import HadoopFS, join

logger = logging.getLogger(__name__)

IDENTITY_FILE = "lakesink.json"
#: how ``batches_started`` is kept: set before the id's first batch writes anything
#: (:func:`mark_started`), so an id without it has written nothing
MARKS_BEFORE_BATCH = "before_batch"


def has_offsets(fs: HadoopFS, checkpoint: str) -> bool:
    """Whether Spark has planned a batch in ``checkpoint`` (its offset log)."""
    return bool(fs.list_files(join(checkpoint, "offsets")))


#: what a Spark checkpoint holds once its query has started: the offset log, and the
#: sources' logs (the Kafka source writes its start, ``sources/0/0``, at the first
#: trigger, even with nothing to read; from then on ``startingOffsets`` is ignored)
STARTED_DIRS = ("offsets", "sources")


def has_started(fs: HadoopFS, checkpoint: str) -> bool:
    """Whether a query has started in ``checkpoint``: a take-over (``starting_offsets``
    computed from another tool's position) only happens before that."""
    return any(fs.list_files(join(checkpoint, d)) for d in STARTED_DIRS)


def checkpoint_app_id(fs: HadoopFS, checkpoint: str,
                      start: dict[str, str] | None = None) -> str:
    """Return the checkpoint's app id, creating one for a new checkpoint. ``start``: the
    settings where a new checkpoint starts reading, recorded with a new id; an existing
    id's is checked and recorded by :func:`record_start`, once the writer lease is
    held."""
    path = join(checkpoint, IDENTITY_FILE)
    data = fs.read_json(path)
    offsets = has_offsets(fs, checkpoint)
    if data and data.get("app_id"):
        if offsets:
            return str(data["app_id"])
        if data.get("batches_started"):
            raise ConfigError(
                "checkpoint",
                f"{checkpoint} has lost its offset log (offsets/) but its app id "
                f"{data['app_id']} has run batches: Spark would number the batches from 0 "
                "again, and those the app id committed would be skipped as done",
                fix="restore offsets/ and commits/; or, to read the topic again from "
                "source.kafka.starting_offsets (rows already in the table come again), "
                f"delete {IDENTITY_FILE} too")
        if data.get("marks") == MARKS_BEFORE_BATCH:
            # no batch has begun under this id, so nothing is written under it: the id
            # stays (a new one would have a lease of its own, beside the one a process
            # that is starting under this id holds)
            return str(data["app_id"])
        # an id from a version that marked after the first batch: one may have written
        logger.info("checkpoint %s has no offset log: new app id (was %s)", checkpoint,
                    data["app_id"])
    elif offsets or fs.exists(join(checkpoint, "commits")):
        raise ConfigError(
            "checkpoint",
            f"{checkpoint} holds a Spark checkpoint that lakesink did not create "
            f"(no {IDENTITY_FILE})",
            fix="point 'checkpoint' at an empty folder, or restore the lakesink.json file",
        )
    app_id = uuid.uuid4().hex
    fs.mkdirs(checkpoint)
    identity = {"app_id": app_id,
                "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "previous": (data or {}).get("app_id"), "marks": MARKS_BEFORE_BATCH,
                # a replaced id keeps the start its query may have begun from (compared
                # by record_start: Spark's source log still holds it)
                **({"start": (data or {}).get("start", start)} if start is not None
                   else {})}
    if data:  # an id from before the marks, replaced
        fs.write_json(path, identity)
    elif not fs.write_once(path, json.dumps(identity)):
        theirs = fs.read_json(path) or {}
        if not theirs.get("app_id"):
            raise ConfigError("checkpoint", f"{path} appeared while this process created "
                              "it, without an app id", fix="start one process only")
        logger.warning("checkpoint %s: another process created it at the same time; its "
                       "app id %s is this one's too (one of the two gets the writer lease)",
                       checkpoint, theirs["app_id"])
        return str(theirs["app_id"])
    logger.info("new checkpoint %s, app id %s", checkpoint, app_id)
    return app_id


def record_start(fs: HadoopFS, checkpoint: str, start: dict[str, str]) -> None:
    """Refuse a changed start setting that Spark would ignore (known-open L6), and record
    a new one. Called with the writer lease held: a second process started beside the
    writer (with another setting) is refused by the lease before it can record its own
    start, which a later corrected restart would then be compared with.

    Once a query has started in a checkpoint, Spark reads on from its own logs: a new
    ``starting_offsets`` is ignored. After a committed batch that is the point of a
    checkpoint (and documented). Before one — a first start that failed or was stopped,
    then corrected on the command line — the correction looked accepted and was not:
    the checkpoint still started where the first attempt said. Such a start is refused,
    naming the key. A checkpoint that has not started yet takes the new setting (and
    records it); one with a committed batch says the change is ignored."""
    path = join(checkpoint, IDENTITY_FILE)
    identity = fs.read_json(path) or {}
    recorded = identity.get("start")
    if recorded == start or not identity.get("app_id"):
        return
    if not has_started(fs, checkpoint):
        fs.write_json(path, {**identity, "start": start})
        return
    if recorded is None:
        return  # recorded by no start of this version
    key = next(k for k in sorted({*start, *recorded}) if start.get(k) != recorded.get(k))
    if fs.list_files(join(checkpoint, "commits")):
        logger.warning("%s: %r is ignored: checkpoint %s has committed batches and reads "
                       "on from its logs (it started from %r; a new start needs a new "
                       "checkpoint)", key, start.get(key), checkpoint, recorded.get(key))
        return
    raise ConfigError(
        key, f"{checkpoint} started reading from {key}: {recorded.get(key)!r} and has not "
        f"committed a batch yet; Spark keeps that start and would ignore "
        f"{start.get(key)!r}",
        fix=f"set {key} back to {recorded.get(key)!r}; or, to start from the new "
        f"setting, delete the checkpoint folder {checkpoint} (a first batch already "
        "in the table would then be read again)")


def mark_started(fs: HadoopFS, checkpoint: str) -> None:
    """Record that the checkpoint's app id has begun a batch (once per id), before the
    batch writes anything."""
    path = join(checkpoint, IDENTITY_FILE)
    data = fs.read_json(path) or {}
    if data.get("app_id") and not data.get("batches_started"):
        fs.write_json(path, {**data, "batches_started": True})


class MarkStarted:
    """A query's batch function that calls :func:`mark_started` before its first batch
    (in this process) runs: the ingestion query's, and the silence query's (whose table
    is keyed by its own checkpoint's app id)."""

    def __init__(self, fn: Callable[..., None], fs: HadoopFS, checkpoint: str) -> None:
        self.fn, self.fs, self.checkpoint, self.done = fn, fs, checkpoint, False

    def __call__(self, df: Any, batch_id: int) -> None:  # noqa: ANN401
        if not self.done:
            mark_started(self.fs, self.checkpoint)
            self.done = True
        self.fn(df, batch_id)


def run_tag(app_id: str) -> str:
    """The short form of the app id used in file names."""
    return app_id[:8]
