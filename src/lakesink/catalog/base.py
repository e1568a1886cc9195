"""The catalog contract: a committed batch's files become known to a catalog, once.

A table's commit point (the Parquet manifest) comes first; registration follows it and
never decides whether the data is durable. Between the two a crash, a catalog that is
down or a catalog that answers 500 may intervene, so the batch's manifest *is* the
outbox (:mod:`lakesink.catalog.outbox`): a committed batch without a registration mark
is registered later — at the next batch, at the next start — and never twice.

A :class:`Catalog` implements:

* :meth:`Catalog.prepare` — at start, before any data moves: when the catalog is
  reachable, create the table (or check an existing one's partition columns against the
  configuration, raising :class:`~lakesink.errors.LayoutError`); when it is not, raise
  :class:`CatalogUnavailable` (the run goes on; registration waits);
* :meth:`Catalog.register` — make one committed batch's files part of the catalog's
  table. It must be *idempotent per batch*: the outbox writes its mark after
  ``register`` returned, so a crash between the two calls ``register`` again for the
  same batch. A catalog that can tell which batches it holds (Iceberg: the snapshot
  summary) checks first; one that cannot must deduplicate by file path (each batch's
  file names are deterministic: ``part-<batch>-<run>-<n>``). Raise
  :class:`CatalogUnavailable` for a failure worth retrying (connection refused, a
  timeout, a 5xx answer); :class:`~lakesink.errors.CatalogError` for a refusal
  (4xx), which stops the run.

Secrets (tokens) live in the catalog's config as ``SecretStr`` and are never logged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from lakesink.errors import CatalogUnavailable

__all__ = ["Catalog", "CatalogFile", "CatalogUnavailable", "CommittedBatch"]


@dataclass(frozen=True)
class CatalogFile:
    path: str  #: the file's full URI
    relative: str  #: its path below the table folder (``c1=v1/…/part-….parquet``)
    bytes: int
    rows: int
    #: the Hive partition values of its folder, unescaped (None: the null folder)
    partition: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class CommittedBatch:
    """One committed batch of a table, as its manifest records it."""

    table: str  #: the table's name
    location: str  #: the table folder's URI
    app_id: str
    run: str
    batch_id: int
    files: tuple[CatalogFile, ...]
    committed_at: str = ""

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


class Catalog(ABC):
    """Registers a table's committed batches; see the module docstring for the contract."""

    #: names the catalog in the outbox's marks (a different catalog registers anew)
    id: str

    @abstractmethod
    def prepare(self) -> None:
        """Create or check the table (before any data moves)."""

    @abstractmethod
    def register(self, batch: CommittedBatch) -> None:
        """Make ``batch``'s files part of the table, idempotently per batch."""

    def generation(self) -> str | None:
        """Which incarnation of the catalog's table :meth:`prepare` or :meth:`register`
        last saw (Iceberg: the table's uuid); None when there is no table yet or the
        catalog cannot tell. A table dropped and made again, or replaced by another tool,
        has another generation: the outbox then registers every committed batch again
        (audit-2 #15), so ``register`` must skip what the table already holds. It must
        be the same for one table on every call: a value that changed without the table
        changing would register the backlog again at every batch and mark nothing."""
        return None

    def describe(self) -> str:
        """For log lines: the catalog and table, never a secret."""
        return self.id

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
