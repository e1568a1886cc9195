"""What a table format's maintenance does (:class:`Maintainer`), and what every format's
shares: the table it works on, the writer lease around its commits.

Each :class:`~lakesink.tables.formats.TableFormat` names its maintainer
(``TableFormat.maintainer``: Parquet's in :mod:`lakesink.maintenance.parquet`, with
lakesink's own journal; Delta's in :mod:`lakesink.maintenance.delta`, Delta's own
commands); :mod:`lakesink.maintenance` runs it for every table of a config and adds
what is the same for every format (the dead letters' retention).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.config.plan import TableSpec
    from lakesink.maintenance.watch import CompactionWatch
    from lakesink.runtime.arrow_fs import ArrowFS
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout


class Maintainer(ABC):
    """One table's ``compact``, ``vacuum`` and ``repair``. Each returns the report as a
    dict; ``nothing_to_do`` (a table with no commit yet) short-cuts all three."""

    def __init__(self, spec: TableSpec, spark: SparkSession | None, fs: HadoopFS | ArrowFS,
                 layout: TableLayout) -> None:
        self.spec = spec
        self.spark = spark
        self.fs = fs
        self.layout = layout

    def nothing_to_do(self, operation: str) -> dict[str, Any] | None:
        """The report of ``operation`` on a table that holds nothing to maintain yet (None:
        there is something)."""
        return None

    def without_spark(self, what: str, **options: Any) -> dict[str, Any] | None:  # noqa: ANN401
        """The report of ``what`` (``compact``, ``vacuum``, ``repair`` with their
        options) done without Spark (``self.spark`` is None, ``self.fs`` an
        :class:`~lakesink.runtime.arrow_fs.ArrowFS`, which writes only when opened so:
        ``self.fs.writes``); None when it needs Spark. A step that turns out to need it
        midway raises :class:`~lakesink.runtime.arrow_fs.NeedsSpark` (the command then
        runs through Spark: every step is idempotent)."""
        return None

    def watch(self) -> CompactionWatch | None:
        """What a running ``lakesink run`` keeps an eye on for this table (Parquet: its
        compaction journal, :mod:`lakesink.maintenance.watch`); None: nothing."""
        return None

    @abstractmethod
    def files(self) -> list[dict[str, Any]]:
        """What the table holds, by its bookkeeping: each committed file (``path`` below
        the table folder, ``rows``, ``bytes``) — after compactions and manifest
        roll-ups, for readers that want committed batches only (``lakesink files``)."""

    @abstractmethod
    def compact(self, *, partition: tuple[str, str] | None,
                target_file_size: int | None) -> dict[str, Any]: ...

    @abstractmethod
    def vacuum(self, *, force: bool, dry_run: bool) -> dict[str, Any]: ...

    @abstractmethod
    def repair(self, *, apply: bool) -> dict[str, Any]: ...


@contextlib.contextmanager
def table_commits(spec: TableSpec, fs: HadoopFS, layout: TableLayout,
                  fmt: str) -> Iterator[None]:
    """Around a maintenance command's commits to ``layout``'s table (of format ``fmt``):
    the whole-table writer lease when the table needs one (Delta on S3 with the
    single-driver log store, or on Azure, where two drivers committing at once can lose
    a commit):
    refused while a stream writes there."""
    from lakesink.runtime.storage import lease_options
    from lakesink.tables.lease import WriterLease

    options = lease_options(spec.storage, spec.table, fmt)
    if not options["lease_per_table"]:
        yield
        return
    lease = WriterLease(fs, layout.lease(None), app_id="lakesink-maintenance",
                        ttl_s=options["lease_s"], table=layout.table)
    lease.acquire()
    try:
        yield
    finally:
        lease.release()
