"""What the write stage's engines share: the values they hand back, and the two steps
every engine takes around its commit.

An engine (:class:`Engine`) writes one batch's good rows and commits them through the
table writer, exactly once per batch id (:mod:`lakesink.tables.base`). Before the
commit point it stages the batch's dead letters in the outbox (:meth:`BatchContext.
stage_dead_letters`, published by the batch function after the commit) and builds what
the commit records (:meth:`BatchContext.commit_info`). It returns a
:class:`WriteOutcome`; the Arrow engine may instead return a :class:`Fallback` — nothing
of its attempt is committed, and the batch function hands the batch to the Spark engine.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pyspark.sql import functions as F

from lakesink.pipeline.marks import MARK, BatchCounts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakesink.pipeline.evolver import SchemaEvolver
    from lakesink.pipeline.marker import Marker
    from lakesink.tables.base import BatchResult, TableWriter
    from lakesink.tables.rejected import RejectedWriter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteOutcome:
    """A written batch: the writer's result, the batch's counts, what the commit
    recorded, and the marked frame the batch function unpersists (if any)."""

    result: BatchResult
    counts: BatchCounts
    info: dict[str, Any]
    marked: DataFrame | None = None


@dataclass(frozen=True)
class Fallback:
    """The Arrow engine leaves the batch to the Spark engine: why (a log message with
    its arguments, logged once by the batch function at ``level``). Nothing of the
    attempt is committed."""

    message: str
    args: tuple[Any, ...] = ()
    level: int = logging.INFO


class Engine(Protocol):
    """Writes and commits one batch (idempotent per batch id)."""

    def write(self, df: DataFrame, batch_id: int) -> WriteOutcome | Fallback: ...


@dataclass
class BatchContext:
    """One table's stages as the engines use them."""

    marker: Marker
    evolver: SchemaEvolver
    writer: TableWriter
    dead_letters: RejectedWriter
    app_id: str

    def stage_dead_letters(self, marked: DataFrame, counts: BatchCounts, batch_id: int
                           ) -> BatchCounts:
        """Stage the batch's dead letters before the table's commit (see
        :class:`~lakesink.tables.rejected.RejectedWriter`); the counts with ``rejected``
        the number staged (checked against an exact count if they differ)."""
        if not counts.rejected:
            return counts
        staged = self.dead_letters.stage(
            batch_id, self.marker.dead_letters(marked, batch_id, self.app_id),
            expected=counts.rejected,
            recount=lambda: marked.where(F.col(MARK.fail).isNotNull()).count())
        return dataclasses.replace(counts, rejected=staged)

    def commit_info(self, counts: BatchCounts, marked: DataFrame | None, batch_id: int
                    ) -> dict[str, Any]:
        """What is recorded with the commit; reports fields dropped as unknown."""
        info: dict[str, Any] = {"records": counts.records, "rejected": counts.rejected,
                                "written": counts.written,
                                "schema_fields": len(self.marker.schema.fields)}
        if counts.unknown:
            assert marked is not None
            names = self.evolver.unknown_names(marked)
            info["unknown_fields_dropped"] = {"records": counts.unknown, "names": names}
            logger.warning("batch %d: %d record(s) had fields outside the schema, dropped: %s",
                           batch_id, counts.unknown, ", ".join(names))
        return info
