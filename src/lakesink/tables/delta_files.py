"""The Arrow path's Delta commit: files the tasks wrote in place, committed by delta-rs.

The tasks write a batch's Parquet files straight into the table's partition folders
under names no other attempt uses; nothing lists them until one delta-rs commit adds
them with the batch's ``SetTransaction(app id, batch id)`` — the same keying as Spark's
writer, so either writer skips a batch the other committed. Before the commit, each
file's footer must hold the rows reported for it, and their sum the rows the batch
counted (else :class:`~lakesink.errors.CommitMismatch`, nothing committed). Where
delta-rs cannot commit what Spark's writer would (CHECK constraints, column mapping,
a refused commit), the batch takes Spark's writer (:meth:`DeltaFiles.files_refusal`,
:class:`~lakesink.errors.FilesRefused`).

:class:`DeltaFiles` is a part of :class:`~lakesink.tables.delta.DeltaTableWriter`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from lakesink.errors import CommitMismatch, FilesRefused, SinkError
from lakesink.faults import fault_point
from lakesink.tables.base import BatchResult, Recount, StagedFile, check_rows
from lakesink.tables.fs import join, open_filesystem, task_path
from lakesink.tables.identity import run_tag
from lakesink.tables.paths import (
    HIVE_DEFAULT_PARTITION,
    ascii_name,
    is_safe_relative_dir,
    unescape_value,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

#: Spark type names (as the Arrow path reads them) -> Delta's primitive type names
_DELTA_TYPES = {"string": "string", "boolean": "boolean", "tinyint": "byte",
                "smallint": "short", "int": "integer", "bigint": "long", "float": "float",
                "double": "double", "timestamp": "timestamp",
                "date": "date"}

#: tries of one batch's delta-rs commit when its log version was taken meanwhile
COMMIT_ATTEMPTS = 5
#: how long a commit delta-rs refused sends the table's batches to Spark's writer
#: before delta-rs commits are tried again (a long-running stream is not slowed forever
#: by a refusal that has gone: e.g. a table feature dropped)
REFUSAL_HOLD_S = 600.0


def delta_rs_s3_options(kwargs: dict[str, Any]) -> dict[str, str]:
    """delta-rs's ``storage_options`` for the S3 client the tasks use (pyarrow
    ``S3FileSystem`` keywords, as :func:`~lakesink.runtime.storage.task_filesystem`
    builds them): the same endpoint, region, addressing and credentials (none: the
    AWS default chain), and conditional puts for the log, which S3 and SeaweedFS
    honour. Secrets: never logged."""
    opts = {"aws_region": kwargs.get("region", "us-east-1"), "aws_conditional_put": "etag",
            "aws_virtual_hosted_style_request": str(
                bool(kwargs.get("force_virtual_addressing"))).lower()}
    if kwargs.get("endpoint_override"):
        scheme = kwargs.get("scheme", "https")
        opts["aws_endpoint_url"] = f"{scheme}://{kwargs['endpoint_override']}"
        if scheme == "http":
            opts["aws_allow_http"] = "true"
    for ours, theirs in (("access_key", "aws_access_key_id"),
                         ("secret_key", "aws_secret_access_key"),
                         ("session_token", "aws_session_token")):
        if kwargs.get(ours):
            opts[theirs] = kwargs[ours]
    return opts


def delta_rs_azure_options(kwargs: dict[str, Any]) -> dict[str, str]:
    """delta-rs's ``storage_options`` for the Azure client the tasks use (pyarrow
    ``AzureFileSystem`` keywords): the same account, credentials (none: Azure's default
    chain) and emulator endpoint. Its log commits are conditional puts on Azure without
    further settings. Secrets: never logged."""
    opts = {"azure_storage_account_name": kwargs["account_name"]}
    for ours, theirs in (("account_key", "azure_storage_account_key"),
                         ("sas_token", "azure_storage_sas_key"),
                         ("client_id", "azure_client_id"),
                         ("client_secret", "azure_client_secret"),
                         ("tenant_id", "azure_tenant_id")):
        if kwargs.get(ours):
            opts[theirs] = kwargs[ours]
    if kwargs.get("blob_storage_authority"):
        scheme = kwargs.get("blob_storage_scheme", "https")
        opts["azure_storage_endpoint"] = (f"{scheme}://{kwargs['blob_storage_authority']}/"
                                          f"{kwargs['account_name']}")
        if scheme == "http":
            opts["allow_http"] = "true"
    return opts


def delta_rs_location(filesystem: tuple[str, dict[str, Any]], uri: str
                      ) -> tuple[str, dict[str, str] | None]:
    """(table URI, ``storage_options``) with which delta-rs reaches the Delta table at
    ``uri`` (a Hadoop URI) on the store of ``filesystem`` (a
    :func:`~lakesink.runtime.storage.task_filesystem` spec)."""
    kind, kwargs = filesystem
    if kind == "s3":
        return f"s3://{task_path(filesystem, uri)}", delta_rs_s3_options(kwargs)
    if kind == "azure":
        return uri, delta_rs_azure_options(kwargs)
    return task_path(filesystem, uri), None


def delta_rs_table(filesystem: tuple[str, dict[str, Any]], uri: str) -> Any:  # noqa: ANN401
    """delta-rs's handle of the Delta table at ``uri`` (see :func:`delta_rs_location`)."""
    from deltalake import DeltaTable

    location, options = delta_rs_location(filesystem, uri)
    return DeltaTable(location, storage_options=options)


class DeltaFiles:
    """The Arrow path's part of the Delta writer (see the module's docstring)."""

    # the writer's state this part reads and keeps (DeltaTableWriter sets it)
    task_filesystem: tuple[str, dict[str, Any]] | str
    type_widening: bool
    _committed: int | None
    _committed_known: bool
    _has_commits: bool
    _table: Any
    _refused: tuple[str, float] | None


    def arrow_refusal(self) -> str | None:
        if isinstance(self.task_filesystem, str):
            return self.task_filesystem
        if self.type_widening:
            return "type widening is a Delta feature delta-rs does not write"
        return None

    def ensure_table(self, empty: Callable[[], DataFrame], *, at_start: bool = False
                     ) -> None:
        """Create the table, if it has no commit yet, with the columns of ``empty()``
        (the batch's table columns, zero rows): from the driver, the protocol and
        metadata Spark's first append would commit (:meth:`create_table`); where that
        cannot be done, by Spark's writer appending the zero rows (a Spark job; not
        ``at_start``, which leaves it to the first batch). delta-rs then commits into
        it. No ``SetTransaction``: creating it commits no batch, so a crash right after
        leaves only an empty table."""
        if not self._has_commits:
            self._has_commits = self._known_committed() is not None or self.exists
        if self._has_commits:
            return
        self.fence()
        frame = empty()
        if self.create_table(frame.schema):
            how = "from the driver"
        elif at_start:
            return
        else:
            self._spark_writer(frame, exists=False).save(self.layout.table)
            how = "by Spark's writer"
        logger.info("%s: Delta table created (%s)", self.layout.table, how)
        self._has_commits = True
        # not taken as "no batch": another writer of this app id (one whose lease ran
        # out, a second first start) may have made the table and committed batches
        # between the look above and the builder, which then made nothing
        self._committed, self._committed_known = self._committed_after_making()

    def _committed_after_making(self) -> tuple[int | None, bool]:
        """(this app id's newest batch, known) right after the table was made: from
        delta-rs' view of the log (snapshot.transactions() would rebuild the table
        state with Spark jobs, in the first batch); (None, False) where delta-rs cannot
        read it: the first batch then reads it as for an existing table."""
        view = self.log_view()
        if view is None:
            return None, False
        found = view.transaction_version(self.app_id)
        return (None if found is None else int(found)), True

    def files_refusal(self) -> str | None:
        """Why this table's batches cannot be committed from files (None: they can):
        table features that Spark's writer enforces while writing rows, and delta-rs
        cannot check for files it did not write (CHECK constraints, column mapping)."""
        if self._refused:
            reason, since = self._refused
            if time.monotonic() - since < REFUSAL_HOLD_S:
                return reason
            logger.info("%s: trying delta-rs commits again (%s, %.0fs ago)",
                        self.layout.table, reason, time.monotonic() - since)
            self._refused = None
        table = self._delta_rs()
        config = table.metadata().configuration or {}
        if any(k.startswith("delta.constraints.") for k in config):
            return "the table has CHECK constraints (enforced by Spark's writer)"
        if config.get("delta.columnMapping.mode", "none") != "none":
            return "the table uses column mapping (physical column names)"
        return None

    def lacks_columns(self, columns: dict[str, str | None]) -> list[str]:
        """The ``columns`` (name -> Spark type name, None: any type) the table's schema
        does not have with that type. The stored schema may be ahead of the table's:
        Spark's writer adds new columns (``mergeSchema``) when it writes them, while a
        delta-rs commit keeps the table's schema, so a batch with such columns must
        take Spark's writer. Called right after :meth:`files_refusal`, whose view of
        the log it reuses."""
        # the handle files_refusal() brought up to date for this batch (one log
        # listing per check is a request per check on S3)
        fields = {f.name: getattr(f.type, "type", None)
                  for f in self._delta_rs(refresh=False).schema().fields}
        return [name for name, spark_type in columns.items()
                if name not in fields or (spark_type is not None
                                          and fields[name] != _DELTA_TYPES[spark_type])]

    def commit_files(self, batch_id: int, files: list[tuple[str, int, int, str | None]],
                     info: dict[str, Any], recount: Recount | None = None) -> BatchResult:
        """Commit files the tasks wrote in place (paths below the table folder, rows,
        bytes, statistics) as one delta-rs transaction carrying ``SetTransaction(app id,
        batch id)``, the same keying as Spark's writer: no table-state rebuild per batch.
        Before the commit, each file's footer must hold the rows reported for it and
        their sum the rows the batch counted as written (else :class:`CommitMismatch`,
        nothing committed). Files of a failed attempt are never in the log: readers do
        not see them (``VACUUM`` removes them)."""
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction

        staged = []
        for (rel, rows, size, _), (found_rows, found_size) in zip(
                files, self._footers([rel for rel, *_ in files]), strict=True):
            if found_rows != rows or found_size != size:
                raise CommitMismatch(
                    f"batch {batch_id} of {self.layout.table}: {rel} was reported with "
                    f"{rows} row(s), {size} bytes; its footer says {found_rows} row(s), "
                    f"the file has {found_size} bytes. Nothing was "
                    "committed. This is a lakesink bug: please report it with this message")
            staged.append(StagedFile(rel, rel, size, rows))
        check_rows(batch_id, self.layout.table, staged, info, recount)
        now = int(time.time() * 1000)
        adds = [AddAction(rel, size, self._partition_values(rel), now, True,
                          stats or json.dumps({"numRecords": rows}))
                for rel, rows, size, stats in files]
        unmoved = 0  # failures that left the log where it was (no race)
        try:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                table = self._delta_rs()
                recorded = table.transaction_version(self.app_id)
                if recorded is not None and recorded >= batch_id:
                    # already in the log: another writer of this app id (a zombie's
                    # race) or our own put whose response was lost. delta-rs does not
                    # refuse a txn version that is not newer (Spark's writer did)
                    logger.warning("batch %d is already in the Delta log (txn %d): not "
                                   "committed again", batch_id, recorded)
                    self._committed = recorded
                    self.mark_committed()  # a batch of this app id is in the log
                    return BatchResult(batch_id, skipped=True)
                before = table.version()
                self.fence()
                try:
                    table.create_write_transaction(
                        adds, "append", table.schema(),
                        partition_by=self.partition_by or None,
                        # no retry inside delta-rs: when the version is taken (by another
                        # commit, or by our own put whose response was lost) this loop
                        # reads the log again and skips or re-commits; delta-rs' retry
                        # would fail on a commit of our app id ("concurrent
                        # transaction") and the whole batch would be redone
                        commit_properties=CommitProperties(
                            max_commit_retries=0,
                            app_transactions=[Transaction(self.app_id, batch_id)],
                            custom_metadata={"lakesink.app_id": self.app_id,
                                             "lakesink.batch_id": batch_id,
                                             "lakesink.rows": sum(f.rows for f in staged)}))
                    fault_point("raise_after_delta_commit", batch_id)
                except CommitFailedError as exc:
                    moved = self._delta_rs().version() != before  # a race
                    if not moved:
                        # a failed put (delta-rs reports a store error the same way) or
                        # a refusal, which the second try tells apart
                        unmoved += 1
                        if unmoved == 2:
                            reason = f"delta-rs refused a commit twice ({exc})"
                            self._refused = (reason, time.monotonic())
                            raise FilesRefused(reason) from exc
                    if attempt == COMMIT_ATTEMPTS:
                        raise
                    if moved:
                        logger.info("batch %d: the Delta log moved on meanwhile; reading "
                                    "it again (attempt %d of %d)", batch_id, attempt,
                                    COMMIT_ATTEMPTS)
                    else:
                        logger.warning("batch %d: delta-rs did not commit (%s); trying "
                                       "once more", batch_id, exc)
                        time.sleep(1.0)
                    continue
                break
            else:  # unreachable: the last attempt breaks or raises
                raise SinkError(f"batch {batch_id}: no delta-rs commit attempt left")
        except BaseException:
            self._committed_known = False  # see write_batch: a commit may have landed
            raise
        self._committed = batch_id
        fault_point("after_delta_commit", batch_id)
        self.mark_committed()
        size = sum(f.bytes for f in staged)
        self.measured(int(info.get("written", 0)), size)
        return BatchResult(batch_id, files=len(staged), bytes=size, info=info)

    def stage_in_place(self, df: DataFrame, batch_id: int, rows_per_file: int | None,
                       file_tag: str) -> list[tuple[str, int, int, str | None]]:
        """Spark writes ``df`` (the suspects it accepted: few rows) into the batch's
        staging folder; each file then moves into its partition folder of the table
        as ``part-s-<n><file_tag>.parquet`` (the tag names the batch attempt, so no
        other attempt's file is ever replaced), still invisible until
        :meth:`commit_files` lists it. Returns them as the tasks report theirs
        (statistics: the row count only)."""
        folder = self.layout.staging(run_tag(self.app_id), batch_id)
        self.fs.delete(folder)
        self.stage(df, folder, rows_per_file)
        out: list[tuple[str, int, int, str | None]] = []
        for n, (path, relative, size) in enumerate(self.listed(folder)):
            rel_dir = relative.rpartition("/")[0]
            if not is_safe_relative_dir(rel_dir, self.partition_by):
                raise SinkError(f"unexpected staged path {relative!r} for partitions "
                                f"{self.partition_by}")
            rel_dir = ascii_name(rel_dir)  # Spark's folder, as the tasks name it
            name = f"part-s-{n:05d}{file_tag}.parquet"
            rel = f"{rel_dir}/{name}" if rel_dir else name
            rows = self.fs.parquet_rows(path)
            self.fs.replace(path, join(self.layout.table, rel))
            out.append((rel, rows, size, None))
        self.fs.delete(folder)
        return out

    def tidy(self, batch_id: int) -> None:
        """A committed batch's staging folder (a kill after the commit, before the
        merge's staged rows were removed, leaves it: disk, not rows)."""
        self.fs.delete(self.layout.staging(run_tag(self.app_id), batch_id))

    def sweep_staging(self) -> None:
        """At start, under the lease: this app id's batch staging folders (the merge's
        rows). No batch of this app id is in flight yet; whatever is there was left by
        a kill (a batch still to do stages its rows again; a committed one never reads
        them). The dead-letter outboxes beside them (``rejected-<batch>``) stay: a
        committed batch's replay publishes them."""
        folder = self.layout.staging_of(run_tag(self.app_id))
        for name in self.fs.list_dirs(folder):
            if name.isdigit():
                self.fs.delete(join(folder, name))

    def drop_files(self, rels: list[str]) -> None:
        """Delete files the tasks wrote for a batch that is not committed from them
        (it takes Spark's writer instead); never in the log, so only tidying."""
        for rel in rels:
            self.fs.delete(join(self.layout.table, rel), recursive=False)

    def _footers(self, rels: list[str]) -> list[tuple[int, int]]:
        """(rows in the footer, bytes) of each file below the table folder, read through
        the tasks' filesystem (on S3 a few requests per file: read concurrently)."""
        from concurrent.futures import ThreadPoolExecutor

        assert not isinstance(self.task_filesystem, str)
        fs = open_filesystem(self.task_filesystem)
        root = self._task_root()

        def footer(rel: str) -> tuple[int, int]:
            path = f"{root}/{rel}"
            with fs.open_input_file(path) as f:
                return pq.read_metadata(f).num_rows, f.size()

        if len(rels) < 2 or self.task_filesystem[0] == "local":
            return [footer(rel) for rel in rels]
        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(footer, rels))

    def _task_root(self) -> str:
        """The table folder as the tasks' filesystem spells it (S3: ``bucket/key``)."""
        assert not isinstance(self.task_filesystem, str)
        return task_path(self.task_filesystem, self.layout.table)

    def _delta_rs(self, *, refresh: bool = True) -> Any:
        """delta-rs's handle of the table, brought up to date unless ``refresh`` is
        false (it reads only the log entries added since: Spark's writer may have
        committed some). On S3 and Azure its log commits are conditional puts
        (``If-None-Match: *``): a second commit of the same version fails instead of
        replacing the first."""
        if self._table is None:
            assert not isinstance(self.task_filesystem, str)
            self._table = delta_rs_table(self.task_filesystem, self.layout.table)
        elif refresh:
            self._table.update_incremental()
        return self._table

    def _partition_values(self, rel: str) -> dict[str, str | None]:
        """A file's partition values from its folder (``c=v/…``; the Hive null folder
        is a null value, as Spark's writer records it)."""
        values: dict[str, str | None] = {}
        for part in rel.split("/")[:-1]:
            column, _, text = part.partition("=")
            value = unescape_value(text)
            values[unescape_value(column)] = None if value == HIVE_DEFAULT_PARTITION else value
        if list(values) != self.partition_by:
            raise SinkError(f"unexpected file path {rel!r} for partitions {self.partition_by}")
        return values
