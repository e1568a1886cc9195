"""Where a table's data and bookkeeping live.

::

    <base>/<table>/c1=v1/…/part-<batch>-<run>-<n>.parquet   the table (what readers glob)
    <base>/_rejected/<table>/part-<batch>-<run>.parquet       rejected records
    <base>/.lakesink/<table>/checkpoint/                     Spark checkpoint (default)
    <base>/.lakesink/<table>/layout.json                     format and partition columns
    <base>/.lakesink/<table>/schema.json                     the decode schema in use
    <base>/.lakesink/<table>/staging/<run>/<batch>/          a batch before publishing
    <base>/.lakesink/<table>/staging/<run>/rejected-<batch>/ its dead letters (outbox)
    <base>/.lakesink/<table>/pending/<run>/<batch>.json      files being published
    <base>/.lakesink/<table>/manifests/<run>/<batch>.json    committed batches
    <base>/.lakesink/<table>/compactions/<id>.json           a compaction's journal
    <base>/.lakesink/<table>/replaced/<id>/…                 files it replaced (vacuumed)
    <base>/.lakesink/<table>/quarantine/<time>/…             orphans `repair` moved out
    <base>/.lakesink/<table>/writer-<run>/lease-<seq>.json   the checkpoint's writer lease
    <base>/.lakesink/<table>/writer/lease-<seq>.json         a whole-table lease (Delta, S3)
    <checkpoint>/routes/<batch>.json, writer/                routed runs: the routes a
                                                             batch began under; the lease

Nothing but table files sits under ``<base>/<table>/``, so a reader's
``<table>/**/*.parquet`` glob sees every committed record once and never staging.
"""

from __future__ import annotations

from dataclasses import dataclass

from lakesink.tables.fs import join, to_uri


@dataclass(frozen=True)
class TableLayout:
    base: str
    name: str

    @classmethod
    def of(cls, base_path: str, name: str) -> TableLayout:
        return cls(to_uri(base_path), name)

    @property
    def table(self) -> str:
        return join(self.base, self.name)

    @property
    def meta(self) -> str:
        return join(self.base, ".lakesink", self.name)

    @property
    def rejected(self) -> str:
        return join(self.base, "_rejected", self.name)

    @property
    def default_checkpoint(self) -> str:
        return join(self.meta, "checkpoint")

    @property
    def layout_file(self) -> str:
        return join(self.meta, "layout.json")

    @property
    def schema_file(self) -> str:
        return join(self.meta, "schema.json")

    def staging(self, run: str, batch_id: int) -> str:
        return join(self.staging_of(run), f"{batch_id:010d}")

    def staging_of(self, run: str) -> str:
        """Every batch's staging folder of the run tag ``run``."""
        return join(self.meta, "staging", run)

    def pending(self, run: str, batch_id: int) -> str:
        return join(self.meta, "pending", run, f"{batch_id:010d}.json")

    def manifest(self, run: str, batch_id: int) -> str:
        return join(self.meta, "manifests", run, f"{batch_id:010d}.json")

    @property
    def compactions(self) -> str:
        return join(self.meta, "compactions")

    def replaced(self, compaction: int) -> str:
        return join(self.meta, "replaced", f"{compaction:010d}")

    @property
    def quarantine(self) -> str:
        return join(self.meta, "quarantine")

    def lease(self, run: str | None) -> str:
        """The folder of the writer lease: of the whole table (``run`` None), or of
        one checkpoint's writer."""
        return join(self.meta, "writer" if run is None else f"writer-{run}")

    def rejected_file(self, run: str, batch_id: int) -> str:
        return join(self.rejected, f"part-{batch_id:010d}-{run}.parquet")

    def rejected_staging(self, run: str, batch_id: int) -> str:
        return join(self.meta, "staging", run, f"rejected-{batch_id:010d}")
