"""The lake read without Spark: a pyarrow filesystem for a table's store and delta-rs's
handle of a Delta table (small JSON files and listings: :mod:`lakesink.tables.contents`).

What ``lakesink status``, the take-over checks of the compat surfaces and maintenance
read with (local disk, S3 and Azure with the ``storage`` settings; other stores are read
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
    from lakesink.runtime.storage import task_filesystem
    from lakesink.tables.fs import open_filesystem, task_path

    spec = task_filesystem(storage, base)
    if isinstance(spec, str):
        raise ConfigError("table.base_path",
                          f"lakesink status reads local disk, S3 and Azure ({spec})")
    return open_filesystem(spec), task_path(spec, base)


def delta_table(storage: StorageConfig, uri: str) -> Any:  # noqa: ANN401 - a DeltaTable
    from deltalake import DeltaTable

    from lakesink.runtime.storage import task_filesystem
    from lakesink.tables.delta_files import delta_rs_table

    spec = task_filesystem(storage, uri)
    if isinstance(spec, str):
        return DeltaTable(uri.removeprefix("file://").removeprefix("file:"))
    return delta_rs_table(spec, uri)
