"""Catalog registration after the commit (``catalog:``): see :mod:`lakesink.catalog.base`
for the contract and :mod:`lakesink.catalog.outbox` for how each batch gets there once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakesink.catalog.base import Catalog, CatalogFile, CommittedBatch
from lakesink.catalog.outbox import Registrar
from lakesink.errors import ConfigError

if TYPE_CHECKING:
    from lakesink.config.models import CatalogConfig, TableConfig
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

__all__ = ["Catalog", "CatalogFile", "CommittedBatch", "Registrar", "registrar"]


def registrar(config: CatalogConfig, table: TableConfig, fs: HadoopFS, layout: TableLayout,
              *, run: str) -> Registrar | None:
    """The table's registrar, or None when no catalog is configured."""
    if config.type == "none":
        return None
    if table.format != "parquet":
        raise ConfigError("catalog.type", f"the {config.type} catalog registers Parquet "
                          f"files; table {layout.name} is {table.format}",
                          fix="use table.format parquet, or no catalog for this table")
    from lakesink.catalog.quix import QuixCatalog

    assert config.quix is not None  # the model fills it for type quix
    catalog = QuixCatalog(config.quix, table=layout.name, location=layout.table,
                          partition_by=list(table.partition_by))
    return Registrar(catalog, fs, layout, run=run, null_value=table.null_partition_value,
                     retry_initial_s=config.retry_initial_s, retry_max_s=config.retry_max_s)
