"""Compaction, vacuum and repair of lakesink's Parquet tables, never losing or
duplicating a row once a compaction is finished or rolled back.

**What the table holds** (:func:`committed_files`): every committed manifest's files,
then, in order, each finished compaction's inputs replaced by its outputs. Manifests are
never rewritten, so "is batch B committed?" stays a manifest lookup after compaction.

**One compaction** merges a group of small files of one partition folder (one schema)
into one file, with a journal in ``<meta>/compactions/``:

1. ``<id>.json`` (create-if-absent): the inputs (path, rows, bytes) and the output name
   ``<folder>/part-c<id>-00000.parquet``;
2. Spark reads the inputs and writes one file into ``<meta>/staging/compact/<id>/``;
   its footer's rows must equal the inputs' rows, or the compaction is rolled back;
3. the staged file is renamed into the folder (readers that list files now see the
   inputs and the output: the *swap window*);
4. ``<id>.outcome.json`` (create-if-absent) saying ``done``: **the commit point** —
   from here the output is the truth, before it the inputs are. A rollback writes the
   same file saying ``aborted`` *before* it deletes anything, so of a stalled compactor
   and one that took over, exactly one decides;
5. the inputs are moved out of the table to ``<meta>/replaced/<id>/`` (``vacuum``
   deletes them after ``maintenance.replaced_grace_s``), closing the swap window;
6. ``<id>.finished.json``.

A crash anywhere is resumed by the next ``lakesink compact`` (or ``vacuum``, or
``repair --apply``) before it does anything else: a journal without an outcome is
rolled back (``aborted`` recorded, then its staging and output deleted — the inputs were
never touched — then ``finished``; a roll-back cut off before that is done again), one
whose outcome is ``done`` and without ``finished`` is rolled forward (step 5 again:
moving is idempotent). A running ``lakesink run`` resumes them too
(:mod:`lakesink.maintenance.watch`). One compactor per
table at a time: it holds the table's compactor lease (:mod:`lakesink.tables.lease`).

Inputs are only files of committed manifests (never a batch being published), in
folders whose newest file is older than ``maintenance.min_age_s``; a file that arrives
during the compaction is not an input and stays.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError, LeaseLost, SinkError
from lakesink.faults import fault_point
from lakesink.maintenance.base import Maintainer
from lakesink.maintenance.journal import Journal, committed_files
from lakesink.maintenance.parquet_repair import repair
from lakesink.tables.fs import join
from lakesink.tables.manifests import TableFile

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.maintenance.watch import CompactionWatch
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

logger = logging.getLogger(__name__)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


@dataclass
class CompactReport:
    table: str
    format: str = "parquet"
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    rows: int = 0  #: rows of the table by its bookkeeping (unchanged by a compaction)
    compactions: int = 0
    files_merged: int = 0
    folders_too_young: int = 0
    rolled_back: list[int] = field(default_factory=list)
    rolled_forward: list[int] = field(default_factory=list)
    #: the longest time a lister could see a group's inputs and output together (ms)
    max_swap_window_ms: float = 0.0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ParquetCompactor:
    """See the module docstring. ``small``: files below this many bytes are merged;
    ``target``: about this many bytes per output; ``min_age_s``: folder quiet time."""

    def __init__(self, spark: SparkSession, fs: HadoopFS, layout: TableLayout, *,
                 small: int, target: int, min_age_s: float, compression: str,
                 lease_s: float = 30.0) -> None:
        from lakesink.tables.lease import WriterLease

        self.spark = spark
        self.fs = fs
        self.layout = layout
        self.small = small
        self.target = target
        self.min_age_s = min_age_s
        self.compression = compression
        self.journal = Journal(fs, layout)
        self._outputs: set[str] = set()  # the files this run's compactions made
        self.lease = WriterLease(fs, join(layout.meta, "compactor"), app_id="compactor",
                                 ttl_s=lease_s, table=layout.table)

    # -- the whole run ---------------------------------------------------------------

    def run(self) -> CompactReport:
        started = time.monotonic()
        report = CompactReport(self.layout.name)
        self._outputs.clear()
        self.lease.acquire()
        try:
            self.resume(report)
            before = committed_files(self.fs, self.layout)
            report.files_before = len(before)
            report.bytes_before = sum(f.bytes for f in before.values())
            for group in self.plan(before, report):
                self.compact(group, report)
            after = committed_files(self.fs, self.layout)
            report.files_after = len(after)
            report.bytes_after = sum(f.bytes for f in after.values())
            report.rows = sum(f.rows for f in after.values())
            # batches a running stream committed meanwhile are not the compaction's
            arrived = sum(f.rows for p, f in after.items()
                          if p not in before and p not in self._outputs)
            if report.rows - arrived != sum(f.rows for f in before.values()):
                raise SinkError(f"table {self.layout.table}: compaction changed the row "
                                "count by the bookkeeping; this is a bug, stop and report")
        finally:
            self.lease.release()
        report.seconds = round(time.monotonic() - started, 3)
        return report

    def resume_locked(self, report: CompactReport) -> None:
        """:meth:`resume` under the compactor lease (``vacuum``, ``repair --apply``)."""
        self.lease.acquire()
        try:
            self.resume(report)
        finally:
            self.lease.release()

    @property
    def table(self) -> str:
        return self.layout.table

    def resume_unfinished(self) -> tuple[list[int], list[int]]:
        """:meth:`resume_locked`; the compactions (finished, undone)."""
        report = CompactReport(self.layout.name)
        self.resume_locked(report)
        return report.rolled_forward, report.rolled_back

    def crashed(self) -> bool:
        """Whether a compaction was left unfinished (for :meth:`resume`): without
        ``finished``, which a roll-back records too once its deletes are done."""
        return any(map(Journal.unfinished, self.journal.states().values()))

    def resume(self, report: CompactReport) -> None:
        """Finish or undo what a crashed compaction left (see the module docstring); a
        roll-back cut off between its deletes (``aborted`` without ``finished``) is done
        again (its output beside its inputs would be counted twice by listing readers)."""
        for cid, states in sorted(self.journal.states().items()):
            if not Journal.unfinished(states):
                continue
            if "done" in states:
                self.finish(cid, self.journal.read(cid))
                report.rolled_forward.append(cid)
            else:
                self.roll_back(cid, self.journal.read(cid))
                if "aborted" not in states:
                    report.rolled_back.append(cid)

    # -- planning ----------------------------------------------------------------------

    def plan(self, files: dict[str, TableFile], report: CompactReport
             ) -> list[list[TableFile]]:
        """Groups of at least two small files of one quiet folder and one schema, each
        at most about ``target`` bytes."""
        on_disk = {f.relative: f for f in self.fs.list_files(self.layout.table,
                                                              suffix=".parquet")}
        newest: dict[str, int] = {}
        for rel, info in on_disk.items():
            folder = rel.rpartition("/")[0]
            newest[folder] = max(newest.get(folder, 0), info.mtime_ms)
        now_ms = time.time() * 1000
        by_folder: dict[str, list[TableFile]] = {}
        for f in sorted(files.values(), key=lambda f: f.path):
            disk = on_disk.get(f.path)
            if f.bytes >= self.small or disk is None or disk.size != f.bytes:
                continue  # big enough, or missing/changed (``lakesink repair`` reports it)
            by_folder.setdefault(f.path.rpartition("/")[0], []).append(f)
        groups: list[list[TableFile]] = []
        for folder, candidates in sorted(by_folder.items()):
            if len(candidates) < 2:
                continue
            if now_ms - newest.get(folder, 0) < self.min_age_s * 1000:
                report.folders_too_young += 1
                continue
            by_schema: dict[str, list[TableFile]] = {}
            for f in candidates:
                schema = self.fs.parquet_schema(join(self.layout.table, f.path))
                by_schema.setdefault(schema, []).append(f)
            for same in by_schema.values():
                groups.extend(g for g in _pack(same, self.target) if len(g) >= 2)
        return groups

    # -- one compaction ----------------------------------------------------------------

    def _next_id(self) -> int:
        return max(self.journal.states(), default=-1) + 1

    def compact(self, inputs: list[TableFile], report: CompactReport) -> None:
        cid = self._next_id()
        folder = inputs[0].path.rpartition("/")[0]
        name = f"part-c{cid:010d}-00000.parquet"
        output = f"{folder}/{name}" if folder else name
        plan = {"id": cid, "created": _now(), "output": output,
                "inputs": [asdict(f) for f in inputs]}
        if not self.journal.record(cid, "", plan):
            raise SinkError(f"compaction {cid} of {self.layout.table} exists already: "
                            "another compactor runs on this table")
        fault_point("compact_after_journal")
        staging = join(self.layout.meta, "staging", "compact", f"{cid:010d}")
        rows = sum(f.rows for f in inputs)
        try:
            staged = self._stage(inputs, staging)
            staged_rows = self.fs.parquet_rows(staged.path)
            if staged_rows != rows:
                raise SinkError(f"compaction {cid}: the merged file has {staged_rows} rows, "
                                f"its inputs {rows}; nothing was replaced")
        except Exception:
            self.roll_back(cid, plan)
            raise
        fault_point("compact_after_staging")
        self.lease.check()
        fault_point("compact_before_publish")  # a stall here: see roll_back
        try:
            self.fs.replace(staged.path, join(self.layout.table, output))
        except Exception as exc:  # its staging gone: another compactor rolled it back
            if "aborted" in self.journal.states().get(cid, set()):
                raise SinkError(f"compaction {cid} was rolled back by another compactor "
                                "(this one stalled past its lease); its inputs stay") from exc
            raise
        opened = time.monotonic()
        fault_point("compact_after_publish")
        done = {"id": cid, "at": _now(),
                "outputs": [{"path": output, "rows": rows, "bytes": staged.size}]}
        try:
            self.lease.check()
        except LeaseLost:
            self._drop_if_aborted(cid, output)  # its publish may have landed after the
            raise                               # roll-back's delete (a copy on a store)
        if self.journal.decide(cid, "done", done) != "done":
            self._drop_if_aborted(cid, output)
            raise SinkError(f"compaction {cid} was rolled back by another compactor (this "
                            "one stalled past its lease); its inputs stay")
        self._outputs.add(output)
        fault_point("compact_after_done")
        self.finish(cid, plan)
        window = (time.monotonic() - opened) * 1000
        report.max_swap_window_ms = round(max(report.max_swap_window_ms, window), 1)
        report.compactions += 1
        report.files_merged += len(inputs)
        logger.info("compaction %d: %d file(s) of %s merged into %s (%d rows)", cid,
                    len(inputs), folder or "/", output, rows)

    def _drop_if_aborted(self, cid: int, output: str) -> None:
        """Delete the output this compactor published when another rolled its compaction
        back: the name has the compaction's id, so the file is this one's, and after
        ``aborted`` no reader's bookkeeping holds it."""
        if "aborted" in self.journal.states().get(cid, set()):
            self.fs.delete(join(self.layout.table, output), recursive=False)

    def _stage(self, inputs: list[TableFile], staging: str) -> Any:  # noqa: ANN401
        self.fs.delete(staging)
        paths = [join(self.layout.table, f.path) for f in inputs]
        (self.spark.read.parquet(*paths).coalesce(1).write.mode("overwrite")
         .option("compression", self.compression)
         .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
         .parquet(staging))
        staged = self.fs.list_files(staging, suffix=".parquet")
        if len(staged) != 1:
            raise SinkError(f"compaction staged {len(staged)} files in {staging}, not one")
        return staged[0]

    def finish(self, cid: int, plan: dict[str, Any]) -> None:
        """Step 5 and 6: move the inputs out of the table (again, after a crash)."""
        replaced = self.layout.replaced(cid)
        for i, e in enumerate(plan["inputs"]):
            source = join(self.layout.table, e["path"])
            if self.fs.exists(source):
                self.fs.replace(source, join(replaced, e["path"]))
            if i == 0:
                fault_point("compact_mid_move")
        self.fs.delete(join(self.layout.meta, "staging", "compact", f"{cid:010d}"))
        self.journal.record(cid, "finished", {"id": cid, "at": _now()})

    def roll_back(self, cid: int, plan: dict[str, Any]) -> None:
        """Undo a compaction before its commit point: ``aborted`` is recorded first (a
        compaction already ``done`` is finished instead), then its staging goes and then
        its output; its inputs (never touched) stay. Staging first: a stalled compactor
        that resumes after the staging went has nothing to publish, and one that
        published before has its output deleted here (the other order let one publish
        between the two deletes: an orphan beside its inputs, audit-2 #20b). A stalled
        one that reaches its ``done`` finds ``aborted`` and deletes its own output."""
        if self.journal.decide(cid, "aborted", {"id": cid, "at": _now()}) == "done":
            self.finish(cid, plan)
            return
        self.fs.delete(join(self.layout.meta, "staging", "compact", f"{cid:010d}"))
        fault_point("compact_mid_roll_back")
        self.fs.delete(join(self.layout.table, plan["output"]), recursive=False)
        self.journal.record(cid, "finished", {"id": cid, "at": _now(), "rolled_back": True})
        logger.warning("compaction %d rolled back: its inputs stay", cid)


def _pack(files: list[TableFile], target: int) -> list[list[TableFile]]:
    """Consecutive files (by name: by batch) into groups of at most about ``target``."""
    groups: list[list[TableFile]] = []
    current: list[TableFile] = []
    size = 0
    for f in files:
        if current and size + f.bytes > target:
            groups.append(current)
            current, size = [], 0
        current.append(f)
        size += f.bytes
    if current:
        groups.append(current)
    return groups


@dataclass
class VacuumReport:
    table: str
    format: str = "parquet"
    files_deleted: int = 0
    bytes_deleted: int = 0
    compactions_vacuumed: list[int] = field(default_factory=list)
    manifests_rolled_up: int = 0  #: per-batch manifests now in a rollup file
    kept_in_grace: int = 0  #: finished compactions whose replaced files are kept for now
    dry_run: bool = False
    files_to_delete: int = 0  #: with ``dry_run``: what would have been deleted

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def vacuum_replaced(fs: HadoopFS, layout: TableLayout, grace_s: float, *,
                    dry_run: bool = False) -> VacuumReport:
    """Delete the files finished compactions replaced, once ``grace_s`` has passed
    since they finished (a reader that listed the table before the swap may still be
    reading them); roll complete ranges of per-batch manifests up
    (:mod:`lakesink.tables.manifests`). Idempotent. ``dry_run``: only count what would
    be deleted (nothing is deleted or rolled up)."""
    from lakesink.tables.manifests import roll_up

    report = VacuumReport(layout.name)
    report.dry_run = dry_run
    if not dry_run:
        report.manifests_rolled_up = roll_up(fs, layout)
    journal = Journal(fs, layout)
    now = dt.datetime.now(dt.UTC)
    for cid, states in sorted(journal.states().items()):
        if "finished" not in states:
            continue
        folder = layout.replaced(cid)
        if not fs.exists(folder):
            continue
        at = dt.datetime.fromisoformat(journal.read(cid, "finished")["at"])
        if (now - at).total_seconds() < grace_s:
            report.kept_in_grace += 1
            continue
        files = fs.list_files(folder)
        if dry_run:
            report.files_to_delete += len(files)
            continue
        fs.delete(folder)
        report.files_deleted += len(files)
        report.bytes_deleted += sum(f.size for f in files)
        report.compactions_vacuumed.append(cid)
    return report


#: default "small" without a target file size: Parquet files below it are merged
DEFAULT_SMALL = 64 * 1024 * 1024


class ParquetMaintainer(Maintainer):
    """lakesink's own compaction journal, replaced-file vacuum and repair (see the
    module's docstring). A compaction a crash left open is resumed first by each."""

    def compactor(self) -> ParquetCompactor:
        m, table = self.spec.maintenance, self.spec.table
        target = int(table.target_file_size or 2 * DEFAULT_SMALL)
        small = int(m.small_file_size or target // 2)
        return ParquetCompactor(self.spark, self.fs, self.layout, small=small, target=target,
                                min_age_s=m.min_age_s, compression=table.compression)

    def compact(self, *, partition: tuple[str, str] | None,
                target_file_size: int | None) -> dict[str, Any]:
        if partition is not None:
            raise ConfigError("partition", "compacting one partition is for Delta tables")
        catalog = self.spec.catalog.type
        if catalog in ("iceberg", "quix"):
            raise ConfigError("catalog.type", f"compacting a Parquet table registered in a "
                              f"{catalog} catalog is not supported yet: the catalog lists "
                              "the files compaction replaces (a Hive catalog, which lists "
                              "folders, is fine)")
        return self.compactor().run().as_dict()

    def watch(self) -> CompactionWatch | None:
        from lakesink.maintenance.watch import CompactionWatch

        every = self.spec.maintenance.resume_every_s
        return CompactionWatch(self.compactor(), every) if every > 0 else None

    def files(self) -> list[dict[str, Any]]:
        return [{"path": f.path, "rows": f.rows, "bytes": f.bytes}
                for f in sorted(committed_files(self.fs, self.layout).values(),
                                key=lambda f: f.path)]

    def without_spark(self, what: str, **options: Any) -> dict[str, Any] | None:  # noqa: ANN401
        """``repair`` without ``--apply``, ``vacuum --dry-run``, a ``vacuum`` where the
        filesystem writes (local disk; Azure unless a crashed compaction is to be
        finished first: that moves files), a ``repair --apply`` where it moves (local
        disk), and a ``compact`` that finds nothing to merge and no compaction to
        resume."""
        writes, moves = getattr(self.fs, "writes", False), getattr(self.fs, "moves", False)
        if what == "repair" and (not options["apply"] or moves):
            return self.repair(apply=options["apply"])
        if what == "vacuum" and (options["dry_run"] or moves or (
                writes and not self.compactor().crashed())):
            # on Azure, a compaction that crashes after this check: its resume's first
            # move raises NeedsSpark, and the command runs again through Spark
            return self.vacuum(force=options["force"], dry_run=options["dry_run"])
        if what == "compact" and options.get("partition") is None:
            compactor = self.compactor()
            if compactor.crashed():
                return None  # a crashed compaction to finish or undo: it writes
            report = CompactReport(self.layout.name)
            files = committed_files(self.fs, self.layout)
            if compactor.plan(files, report):
                return None
            report.files_before = report.files_after = len(files)
            report.bytes_before = report.bytes_after = sum(f.bytes for f in files.values())
            report.rows = sum(f.rows for f in files.values())
            return report.as_dict()
        return None

    def vacuum(self, *, force: bool, dry_run: bool) -> dict[str, Any]:
        if not dry_run:
            self.compactor().resume_locked(CompactReport(self.layout.name))
        grace = 0 if force else self.spec.maintenance.replaced_grace_s
        return vacuum_replaced(self.fs, self.layout, grace, dry_run=dry_run).as_dict()

    def repair(self, *, apply: bool) -> dict[str, Any]:
        if apply:  # a compaction a crash left open is finished (or undone) first
            self.compactor().resume_locked(CompactReport(self.layout.name))
        return repair(self.fs, self.layout, apply=apply,
                      min_age_s=self.spec.maintenance.min_age_s).as_dict()
