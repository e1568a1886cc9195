"""The registration outbox: every committed batch reaches the catalog exactly once.

The Parquet writer's manifest (``manifests/<run>/<batch>.json``, the commit point) lists
the batch's files; it is the outbox entry. After the catalog accepted a batch, a mark
``registered/<catalog id>/<run>/<batch>.json`` is written. So at any moment:

* manifest, no mark — committed, not (known to be) registered: pending;
* manifest and mark — done.

A crash after the commit and before registration (fault point ``after_manifest``)
leaves a pending batch: the next start finds it (:meth:`Registrar.start` lists the
manifests of every run without a mark, so enabling a catalog on an existing table
registers what it already holds). A crash after registration and before the mark
(``after_registration``) registers the batch again, which the catalog's ``register``
must absorb (its contract, :mod:`lakesink.catalog.base`).

Registration never holds ingestion up for long: a batch is registered right after its
commit when the catalog answers (a backlog over several batches, ``budget_s`` of it per
batch); while it does not (:class:`~lakesink.errors.CatalogUnavailable`),
the backlog waits with exponential backoff (``catalog.retry_initial_s`` doubling to
``catalog.retry_max_s``), logged when it starts and when it clears, and is registered
in commit order at the first batch after the wait. At stop, one last attempt; what is
left is registered by the next start.

The marks hold for one incarnation of the catalog's table (:meth:`Catalog.generation`,
recorded in ``registered/<catalog id>/table.json``). A table dropped and made again —
by hand, by another tool, or by the next registration after a drop — holds none of the
batches the marks stand for: the outbox then drops the marks and queues every committed
batch again, and the catalog's ``register`` skips what its table already holds
(audit-2 #15: those batches stayed out of the catalog for good). A mark's name carries
its generation (``<batch>.<tag>.json``, the tag a hash of the generation), and a mark of
another one counts as absent: another process still on the old table (``lakesink dlq
replay`` beside ``lakesink run``) may write one after this one dropped the marks, and it
must not keep its batch out of the new table. A mark is written only when the catalog
showed the same generation before and after its registration (else which table took the
batch is unknown: it is queued again, and ``register`` absorbs the repeat).

Marks without a tag were written before marks carried one (or by an older lakesink
beside this one). Until ``table.json`` says ``"tagged": true`` they hold for the
recorded generation; the first look at the catalog renames them to carry it, then sets
the flag, and from then on an untagged mark counts as absent (an older process still
running writes its marks for whatever table it saw: its batches are registered again).

A batch the catalog *refuses* (a :class:`~lakesink.errors.CatalogError` from
``register``: a 413 for a batch of thousands of folders, a footer that disagrees, a
partition spec another tool changed) is set aside, not retried and not allowed to halt
ingestion: ``refused/<catalog id>/<run>/<batch>.json`` records why, it is logged as an
error and counted (``refused`` in the status), and the next start tries it again (the
mend of the cause — a catalog setting, ``lakesink repair`` — comes first). A refusal of
the catalog itself (``prepare``: a wrong token) still stops the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakesink.catalog.base import Catalog, CatalogFile, CommittedBatch
from lakesink.catalog.marks import Marks
from lakesink.errors import CatalogError, CatalogUnavailable, one_line
from lakesink.faults import fault_point
from lakesink.tables.paths import unescape_value
from lakesink.tables.fs import join
from lakesink.tables.manifests import read_manifest

if TYPE_CHECKING:
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

logger = logging.getLogger(__name__)


def partition_of(relative: str, null_value: str) -> dict[str, str | None]:
    """The Hive partition values of a file's folder (``c1=v1/c2=v2/part-….parquet``)."""
    out: dict[str, str | None] = {}
    for part in relative.split("/")[:-1]:
        col, _, value = part.partition("=")
        text = unescape_value(value)
        out[unescape_value(col)] = None if text == null_value else text
    return out


def committed_batch(manifest: dict[str, Any], *, table: str, location: str, run: str,
                    null_value: str) -> CommittedBatch:
    """The catalog's view of a manifest."""
    files = tuple(
        CatalogFile(path=join(location, f["path"]), relative=f["path"], bytes=int(f["bytes"]),
                    rows=int(f["rows"]), partition=partition_of(f["path"], null_value))
        for f in manifest["files"])
    return CommittedBatch(table=table, location=location, app_id=str(manifest["app_id"]),
                          run=run, batch_id=int(manifest["batch_id"]), files=files,
                          committed_at=str(manifest.get("committed_at", "")))


class _Unsure(Exception):  # noqa: N818 - not an error: a batch to register once more
    """Which table took a batch is unknown (it changed around the registration)."""


class Registrar:
    """Drives one table's catalog registration; see the module docstring."""

    def __init__(self, catalog: Catalog, fs: HadoopFS, layout: TableLayout, *, run: str,
                 null_value: str, retry_initial_s: float = 1.0, retry_max_s: float = 60.0,
                 budget_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.catalog = catalog
        self.fs = fs
        self.layout = layout
        self.run = run
        self.null_value = null_value
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.budget_s = budget_s
        self.clock = clock
        self.pending: list[tuple[str, int]] = []  #: (run, batch), in registration order
        self.prepared = False
        self.failures = 0
        self.next_try = 0.0
        self.registered = 0  #: batches registered by this process
        self.refused = 0  #: batches the catalog refused in this process (set aside)
        self.marks = Marks(fs, join(layout.meta, "registered", catalog.id),
                           catalog=catalog.id, describe=catalog.describe())

    # -- where things live -------------------------------------------------------------

    def refusal(self, run: str, batch_id: int) -> str:
        """Where a batch the catalog refused is recorded, with the refusal."""
        return join(self.layout.meta, "refused", self.catalog.id, run, f"{batch_id:010d}.json")

    # -- the outbox --------------------------------------------------------------------

    def start(self) -> None:
        """Find the committed batches without a mark (every run's: a table the catalog
        is new to registers what it holds), other runs' first, then this run's, each in
        batch order; then try to prepare the catalog and register them."""
        self._queue_unmarked()
        if self.pending:
            logger.info("catalog %s: %d committed batch(es) to register",
                        self.catalog.describe(), len(self.pending))
        self.drain()

    def _queue_unmarked(self) -> None:
        from lakesink.tables.manifests import committed

        manifests = [(run, b) for run, b, _ in committed(self.fs, self.layout)]
        done = self.marks.done()
        self.pending = sorted((k for k in manifests if k not in done),
                              key=lambda k: (k[0] == self.run, k[0], k[1]))

    def committed(self, batch_id: int) -> None:
        """After ``batch_id`` of this run was committed (or found committed by a
        replay): queue it, unless marked, and register what is due."""
        key = (self.run, batch_id)
        if key not in self.pending and not self.marks.marked(*key):
            self.pending.append(key)
        self.drain()

    def drain(self, *, force: bool = False) -> int:
        """Register pending batches in order until one fails (then back off), none is
        left or ``budget_s`` is spent (a long backlog is registered over several batches,
        so it never holds ingestion up for long); returns how many were registered.
        Waits for the backoff unless ``force``."""
        if not self.pending and self.prepared:
            return 0
        if not force and self.clock() < self.next_try:
            return 0
        done, started = 0, self.clock()
        try:
            if not self.prepared:
                self.catalog.prepare()
                self.prepared = True
                if self._reconcile():
                    self._queue_unmarked()
            while self.pending and self.clock() - started < self.budget_s:
                run, batch_id = self.pending[0]
                requeue = False
                try:
                    requeue = self._register(run, batch_id)
                except _Unsure:
                    requeue = True
                except CatalogUnavailable:
                    raise
                except CatalogError as exc:
                    self._set_aside(run, batch_id, exc)
                else:
                    done += 1
                self.pending.pop(0)
                if requeue:
                    self._queue_unmarked()
        except CatalogUnavailable as exc:
            self.registered += done
            self._failed(exc)
            return done
        if self.failures:
            logger.warning("catalog %s: reachable again after %d failed attempt(s); the "
                           "backlog is registered", self.catalog.describe(), self.failures)
        self.failures, self.next_try = 0, 0.0
        self.registered += done
        return done

    def _register(self, run: str, batch_id: int) -> bool:
        """Register one batch and mark it; True when the marks were dropped (every
        committed batch is to be queued again). Raises :class:`_Unsure` when the
        catalog's table changed around the registration: the batch stays unmarked."""
        if self.marks.marked(run, batch_id):  # another process registered it
            return False
        path = join(self.layout.meta, "manifests", run, f"{batch_id:010d}.json")
        try:
            manifest = read_manifest(self.fs, self.layout, run, batch_id)
        except ValueError:  # an empty manifest (a kill mid-write, before writes were
            logger.error("catalog %s: the manifest %s is unreadable; its files are not "  # atomic)
                         "registered (check the table with lakesink repair)",
                         self.catalog.describe(), path)
            return False
        if manifest is None:  # rolled up or removed since it was listed: nothing to do
            return False
        batch = committed_batch(manifest, table=self.layout.name, location=self.layout.table,
                                run=run, null_value=self.null_value)
        before = self.catalog.generation()
        batch = self._register_current(batch)
        dropped = self._reconcile()
        if self.catalog.generation() != before:
            # the table changed around the registration (or was made by it): which one
            # took the batch is unknown; unmarked, it is queued again
            raise _Unsure
        fault_point("after_registration", batch_id)
        self.marks.write(run, batch_id, {"batch_id": batch_id, "app_id": batch.app_id,
                                         "files": len(batch.files), "rows": batch.rows})
        if self.fs.exists(self.refusal(run, batch_id)):  # refused before, accepted now
            self.fs.delete(self.refusal(run, batch_id), recursive=False)
        logger.info("catalog %s: batch %d registered (%d file(s), %d row(s))",
                    self.catalog.describe(), batch_id, len(batch.files), batch.rows)
        return dropped

    def _reconcile(self) -> bool:
        """The marks against the catalog's table now (:meth:`Marks.reconcile`): True when
        they were dropped (here or by another process), and the queue is made again."""
        return self.marks.reconcile(self.catalog.generation())

    def _register_current(self, committed: CommittedBatch) -> CommittedBatch:
        """Register ``committed`` with the files that hold its rows now. When the catalog
        cannot read them: once more if a compaction moved them meanwhile; a batch whose
        files are gone (deleted by hand, quarantined) — and stay gone by a second look
        at the compaction journal — is a refusal: set aside, reported, the backlog
        behind it goes on (known-open L9: it failed as "unavailable" and held every
        later batch back forever). A store that cannot be read to tell keeps it an
        outage."""
        batch = self._current(committed)
        try:
            self.catalog.register(batch)
            return batch
        except CatalogUnavailable as exc:
            unavailable = exc
        again = self._current(committed)
        if again != batch:  # a compaction swapped its files meanwhile
            self.catalog.register(again)
            return again
        try:
            gone = [f.relative for f in batch.files if not self.fs.exists(f.path)]
            settled = bool(gone) and self._current(committed) == batch
        except Exception:  # noqa: BLE001 - the store unreadable: an outage, not a refusal
            raise unavailable from None
        if not settled:
            raise unavailable
        raise CatalogError(
            f"{len(gone)} of batch {committed.batch_id}'s {len(batch.files)} file(s) are "
            f"no longer in the table ({', '.join(gone[:3])}{' …' if len(gone) > 3 else ''}):"
            " deleted or moved outside lakesink; `lakesink repair` reports them")

    def _current(self, batch: CommittedBatch) -> CommittedBatch:
        """The batch with the files that hold its rows *now*: a file a compaction merged
        (before the batch was registered: a catalog enabled on a compacted table, an
        outage longer than ``maintenance.min_age_s``) is the compaction's output, in the
        same folder (audit-2 #4: it was read where it had been, failing forever). Only a
        catalog that registers folders (Hive) ever sees such a batch: the others refuse
        a compacted table."""
        from dataclasses import replace

        from lakesink.tables.manifests import compacted_into

        into = compacted_into(self.fs, self.layout)
        if not into or not any(f.relative in into for f in batch.files):
            return batch
        files: dict[str, CatalogFile] = {}
        for f in batch.files:
            now = into.get(f.relative)
            if now is None:
                files[f.relative] = f
            elif now.path not in files:
                files[now.path] = CatalogFile(
                    path=join(self.layout.table, now.path), relative=now.path,
                    bytes=now.bytes, rows=now.rows,
                    partition=partition_of(now.path, self.null_value))
        return replace(batch, files=tuple(files.values()))

    def _set_aside(self, run: str, batch_id: int, exc: CatalogError) -> None:
        """A batch the catalog refused: recorded and reported, ingestion goes on."""
        self.refused += 1
        why = one_line(exc, name=False)
        self.fs.write_json(self.refusal(run, batch_id), {
            "batch_id": batch_id, "run": run, "catalog": self.catalog.id, "refusal": why,
            "at": time.time()})
        logger.error("catalog %s refused batch %d (%s): it is set aside (its rows are in "
                     "the table, not in the catalog); ingestion goes on, and the next start "
                     "tries it again", self.catalog.describe(), batch_id, why)

    def _failed(self, exc: CatalogUnavailable) -> None:
        wait = min(self.retry_max_s, self.retry_initial_s * 2 ** self.failures)
        self.failures += 1
        self.next_try = self.clock() + wait
        log = logger.warning if self.failures == 1 or wait >= self.retry_max_s else logger.info
        log("catalog %s unavailable (%s); %d batch(es) wait for registration, next try in "
            "%.0fs; ingestion goes on", self.catalog.describe(), exc, len(self.pending), wait)

    def close(self) -> None:
        """One last attempt; what is left is registered by the next start. Never raises
        (closing must go on to release the writers and leases)."""
        try:
            self.drain(force=True)
        except Exception as exc:  # noqa: BLE001 - reported; the next start retries
            logger.error("catalog %s: registration failed at stop (%s)",
                         self.catalog.describe(), one_line(exc, name=False))
        if self.pending:
            logger.warning("catalog %s: %d committed batch(es) not registered yet; the "
                           "next start registers them", self.catalog.describe(),
                           len(self.pending))
        try:
            self.catalog.close()
        except Exception:  # noqa: BLE001
            logger.debug("closing the catalog client failed", exc_info=True)

    def status(self) -> dict[str, Any]:
        return {"catalog": self.catalog.describe(), "pending": len(self.pending),
                "registered": self.registered, "refused": self.refused,
                "failures": self.failures}
