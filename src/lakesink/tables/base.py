"""The table-writer contract: one micro-batch, exactly once.

A :class:`TableWriter` is driven by Spark's ``foreachBatch``. Spark records a batch's
offset range in the checkpoint *before* running it and marks it done only *after* the
batch function returned. So a crash anywhere in :meth:`TableWriter.write_batch` means
the same batch id, with the same rows, runs again on restart. The contract:

* **Idempotent per (app id, batch id).** Writing batch *b* again leaves the table as if
  *b* was written once: a committed *b* is skipped; an uncommitted *b*'s leftovers are
  removed and *b* is redone. The app id lives inside the checkpoint, so a new
  checkpoint (batch ids restarting at 0) never collides with an old one's batches.
* **Nothing is acknowledged before it is durable.** ``write_batch`` returns only after
  the commit point (Parquet: the manifest; Delta: the log entry) is durable. Offsets
  advance only through Spark's checkpoint after that.
* **before_commit** runs after the rows are staged and before the commit point. It must
  be idempotent per batch id itself; the rejected-record writer uses it, so rejected
  rows and table rows of one batch become durable together.
* **prepare** runs once at start, before any data moves, and refuses an existing table
  whose layout differs from the configuration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass
class BatchResult:
    batch_id: int
    skipped: bool = False
    files: int = 0
    bytes: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class TableWriter(ABC):
    """Writes micro-batches to one table; see the module docstring for the contract."""

    @abstractmethod
    def prepare(self) -> None:
        """Validate an existing table against the config and create what is missing."""

    @abstractmethod
    def write_batch(
        self,
        batch_id: int,
        df: DataFrame,
        *,
        before_commit: Callable[[], dict[str, Any]] | None = None,
    ) -> BatchResult:
        """Make ``df``'s rows part of the table exactly once for ``batch_id``."""
