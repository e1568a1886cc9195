"""The lake read without Spark: a pyarrow filesystem for a table's store and delta-rs's
handle of a Delta table (small JSON files and listings: :mod:`lakesink.tables.contents`).

What ``lakesink status``, the take-over checks of the compat surfaces and maintenance
read with (local disk and S3 with the ``storage.s3`` settings; other stores are read
through Spark and refused here with the reason).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from lakesink.config.storage import StorageConfig


def filesystem(storage: StorageConfig, base: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for ``base`` (a URI) and the path inside it."""
    import pyarrow.fs as pafs

    from lakesink.runtime.storage import task_filesystem

    spec = task_filesystem(storage, base)
    if isinstance(spec, str):
        raise ConfigError("table.base_path", f"lakesink status reads local disk and S3 ({spec})")
    kind, kwargs = spec
    if kind == "local":
        return pafs.LocalFileSystem(), base.removeprefix("file://").removeprefix("file:")
    return pafs.S3FileSystem(**kwargs), base.split("://", 1)[1]


def delta_table(storage: StorageConfig, uri: str) -> Any:  # noqa: ANN401 - a DeltaTable
    from deltalake import DeltaTable

    from lakesink.runtime.storage import task_filesystem
    from lakesink.tables.delta_files import delta_rs_s3_options

    spec = task_filesystem(storage, uri)
    if isinstance(spec, str) or spec[0] == "local":
        return DeltaTable(uri.removeprefix("file://").removeprefix("file:"))
    return DeltaTable(f"s3://{uri.split('://', 1)[1]}",
                      storage_options=delta_rs_s3_options(spec[1]))
