"""Catalog registration after the commit (``catalog:``): see :mod:`lakesink.catalog.base`
for the contract and :mod:`lakesink.catalog.outbox` for how each batch gets there once."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lakesink.catalog.base import Catalog, CatalogFile, CommittedBatch
from lakesink.catalog.outbox import Registrar
from lakesink.errors import ConfigError
from lakesink.tables.formats import table_format

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.config.catalog import CatalogConfig, IcebergCatalogConfig
    from lakesink.config.storage import StorageConfig
    from lakesink.config.table import TableConfig
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

__all__ = ["Catalog", "CatalogFile", "CommittedBatch", "Registrar", "registrar"]

logger = logging.getLogger(__name__)


def registrar(config: CatalogConfig, table: TableConfig, fs: HadoopFS, layout: TableLayout,
              *, run: str, storage: StorageConfig | None = None,
              spark: SparkSession | None = None) -> Registrar | None:
    """The table's registrar, or None when no catalog is configured. ``spark``: the
    session, the Hive catalog's client."""
    if config.type == "none":
        return None
    fmt = table_format(table.format)
    if config.type in ("iceberg", "quix") and not fmt.has_log \
            and fs.list_files(layout.compactions, suffix=".json"):
        raise ConfigError("catalog.type", f"table {layout.name} was compacted (lakesink "
                          f"compact); a {config.type} catalog lists a Parquet table's "
                          "files, and would register files compaction replaced: not "
                          "supported yet")
    retry = {"null_value": table.null_partition_value, "retry_initial_s": config.retry_initial_s,
             "retry_max_s": config.retry_max_s}
    if config.type == "hive":  # Parquet through the outbox; Delta once, by its log
        from lakesink.catalog.hive import DeltaRegistrar, HiveCatalog

        assert config.hive is not None and spark is not None
        hive = HiveCatalog(config.hive, spark, table=layout.name, location=layout.table,
                           partition_by=list(table.partition_by), fmt=table.format)
        kind = DeltaRegistrar if fmt.has_log else Registrar  # a log: the table, once
        return kind(hive, fs, layout, run=run, **retry)
    if fmt.has_log and config.from_environment:
        logger.warning("Quix__Lakehouse__Catalog__Url is set, but the catalog registers "
                       "Parquet files and table %s is %s: it is not registered",
                       layout.name, table.format)
        return None
    if fmt.has_log:  # the other catalogs register a table's files, batch by batch
        raise ConfigError("catalog.type", f"the {config.type} catalog registers Parquet "
                          f"files; table {layout.name} is {table.format}",
                          fix="use table.format parquet, catalog.type hive (Delta tables "
                          "register there), or no catalog for this table")
    catalog: Catalog
    if config.type == "iceberg":
        from lakesink.catalog.iceberg import IcebergCatalog

        assert config.iceberg is not None
        catalog = IcebergCatalog(config.iceberg, table=layout.name, location=layout.table,
                                 partition_by=list(table.partition_by),
                                 properties=iceberg_properties(config.iceberg, storage))
    else:
        from lakesink.catalog.quix import QuixCatalog

        assert config.quix is not None  # the model fills it for type quix
        catalog = QuixCatalog(config.quix, table=layout.name, location=layout.table,
                              partition_by=list(table.partition_by))
    return Registrar(catalog, fs, layout, run=run, **retry)


def iceberg_properties(config: IcebergCatalogConfig, storage: StorageConfig | None
                       ) -> dict[str, str]:
    """pyiceberg's catalog and FileIO properties: the section's, its secrets, and the S3
    settings of ``storage.s3`` where the section leaves them unset (the catalog's FileIO
    reads the files' footers and writes the table's metadata)."""
    props: dict[str, str] = {"type": config.kind, "uri": config.uri}
    if config.warehouse:
        props["warehouse"] = config.warehouse
    if storage is not None:
        s3 = storage.s3
        for key, value in (
                ("s3.endpoint", s3.endpoint), ("s3.region", s3.region),
                ("s3.access-key-id", s3.access_key_id and s3.access_key_id.get_secret_value()),
                ("s3.secret-access-key",
                 s3.secret_access_key and s3.secret_access_key.get_secret_value()),
                ("s3.session-token", s3.session_token and s3.session_token.get_secret_value()),
                ("s3.path-style-access", None if s3.path_style_access is None and not s3.endpoint
                 else str(s3.path_style_access is not False).lower())):
            if value:
                props[key] = value
    props.update(config.properties)
    props.update({k: v.get_secret_value() for k, v in config.secret_properties.items()})
    return props
