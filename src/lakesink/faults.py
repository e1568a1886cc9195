"""Named fault points for crash tests.

``LAKESINK_FAULT=<point>`` makes the process SIGKILL its whole process group (Python
driver, Spark JVM, workers) the moment it reaches that point; with
``LAKESINK_FAULT_BATCH=<n>`` only in batch *n*. Unset, :func:`fault_point` costs one
dict lookup. Points:

* ``after_staging``         — the batch's files are in staging (Delta on the Arrow path:
  in place, in no log entry), nothing published or committed
* ``mid_publish``           — half of the batch's files are published, no manifest
* ``after_publish``         — every file is published, no manifest
* ``after_manifest``        — the manifest is written, Spark has not recorded the batch
* ``after_registration``    — a catalog accepted the batch's files, the outbox has not
  marked it registered (with ``catalog:``)
* ``after_delta_commit``    — the Delta commit is durable, Spark has not recorded the batch
* ``raise_after_delta_commit`` — the Delta commit is durable, then the write *raises*
  (a failed post-commit hook, a lost response) instead of killing: once per process
* ``after_schema_evolved``  — a batch evolved the schema and stored it, nothing written
* ``source_after_take``     — the Redis lists source moved new items into a batch's
  processing list, before Spark wrote the batch's offsets
* ``source_after_spool``    — the Danube source spooled (fsynced) a message, before
  acknowledging it
* ``source_before_commit``  — the batch is durable and recorded by Spark; the Redis
  (or Danube) source has not yet moved its group, trimmed, deleted or acknowledged the
  batch's records
* ``compact_after_journal`` — a Parquet compaction recorded its plan, nothing merged
* ``compact_after_staging`` — its merged file is staged (outside the table)
* ``compact_after_publish`` — the merged file is in the folder beside its inputs, the
  compaction is not committed (``done``)
* ``compact_after_done``    — committed; the inputs are still in the folder
* ``compact_mid_move``      — the first input moved out of the table, the others not
* ``compact_before_publish``, ``compact_mid_roll_back`` — a compaction's lease checked,
  its merged file not yet published; a roll-back's staging deleted, its output not yet:
  where the two-compactor race test stalls one compactor (a kill there is the same as
  at ``compact_after_staging`` / ``compact_after_journal``, so they are not in the
  kill matrix)
* ``silence_before_delivery`` — a silence batch has events, none delivered yet
* ``silence_after_delivery``  — a silence batch's events are delivered (table, topic,
  callback), Spark has not recorded the batch

The first four are in the Parquet writer, ``after_registration`` in the catalog outbox (``after_staging`` also in the Arrow path's
Delta batch), the fifth in the Delta writer, the sixth in
the batch function (both formats), the source points in the Redis and Danube readers (the
first time reached), the last two in the silence query (the first batch with events, unless
``LAKESINK_FAULT_BATCH`` names one).
"""

from __future__ import annotations

import logging
import os
import signal

logger = logging.getLogger(__name__)

PARQUET_POINTS = ("after_staging", "mid_publish", "after_publish", "after_manifest")
CATALOG_POINTS = ("after_registration",)
DELTA_POINTS = ("after_delta_commit",)
COMMON_POINTS = ("after_schema_evolved",)
SOURCE_POINTS = ("source_after_take", "source_after_spool", "source_before_commit")
SILENCE_POINTS = ("silence_before_delivery", "silence_after_delivery")
COMPACT_POINTS = ("compact_after_journal", "compact_after_staging", "compact_after_publish",
                  "compact_after_done", "compact_mid_move")
RACE_POINTS = ("compact_before_publish", "compact_mid_roll_back")
POINTS = (PARQUET_POINTS + CATALOG_POINTS + DELTA_POINTS + COMMON_POINTS + SOURCE_POINTS
          + SILENCE_POINTS + COMPACT_POINTS + RACE_POINTS)


RAISE_POINTS = ("raise_after_delta_commit",)
_raised: set[str] = set()


class InjectedFault(RuntimeError):
    """Raised (not killed) at a ``raise_*`` fault point."""


def fault_point(name: str, batch_id: int | None = None) -> None:
    wanted = os.environ.get("LAKESINK_FAULT")
    if wanted != name:
        return
    only = os.environ.get("LAKESINK_FAULT_BATCH")
    if only is not None and batch_id is not None and int(only) != batch_id:
        return
    if name in RAISE_POINTS:
        if name not in _raised:
            _raised.add(name)
            logger.error("fault injection: raising at %s (batch %s)", name, batch_id)
            raise InjectedFault(f"injected fault at {name}")
        return
    message = f"fault injection: killing the process group at {name} (batch {batch_id})"
    logger.error(message)
    for h in logging.getLogger().handlers:
        h.flush()
    _tell_the_leader(message)
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _tell_the_leader(message: str) -> None:
    """Also write ``message`` to the process group leader's stderr when this is another
    process: Spark keeps a Python planner worker's stderr (the Redis readers' points) to
    itself, and the tests read the run's stderr to see where it died."""
    leader = os.getpgid(0)
    if leader == os.getpid():
        return
    try:
        with open(f"/proc/{leader}/fd/2", "a") as out:
            out.write(message + "\n")
    except OSError:
        pass
