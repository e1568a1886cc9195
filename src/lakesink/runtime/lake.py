"""The lake read without Spark: a pyarrow filesystem for a table's store, small JSON
files, file listings, and delta-rs's handle of a Delta table.

What ``lakesink status``, the take-over checks of the compat surfaces and maintenance
read with (local disk and S3 with the ``storage.s3`` settings; other stores are read
through Spark and refused here with the reason).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from lakesink.config.models import LakesinkConfig


def filesystem(cfg: LakesinkConfig, base: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for ``base`` (a URI) and the path inside it."""
    import pyarrow.fs as pafs

    from lakesink.runtime.storage import task_filesystem

    spec = task_filesystem(cfg, base)
    if isinstance(spec, str):
        raise ConfigError("table.base_path", f"lakesink status reads local disk and S3 ({spec})")
    kind, kwargs = spec
    if kind == "local":
        return pafs.LocalFileSystem(), base.removeprefix("file://").removeprefix("file:")
    return pafs.S3FileSystem(**kwargs), base.split("://", 1)[1]


def read_json(fs: pafs.FileSystem, path: str) -> Any:  # noqa: ANN401
    try:
        with fs.open_input_stream(path) as f:
            return json.loads(f.read())
    except (FileNotFoundError, OSError, ValueError):
        return None


def list_files(fs: pafs.FileSystem, folder: str, *, recursive: bool = False) -> list[str]:
    import pyarrow.fs as pafs

    try:
        infos = fs.get_file_info(pafs.FileSelector(folder, recursive=recursive,
                                                   allow_not_found=True))
    except (FileNotFoundError, OSError):
        return []
    return [i.path for i in infos if i.type == pafs.FileType.File]


def delta_table(cfg: LakesinkConfig, uri: str) -> Any:  # noqa: ANN401 - a DeltaTable
    from deltalake import DeltaTable

    from lakesink.runtime.storage import task_filesystem
    from lakesink.tables.delta_files import delta_rs_s3_options

    spec = task_filesystem(cfg, uri)
    if isinstance(spec, str) or spec[0] == "local":
        return DeltaTable(uri.removeprefix("file://").removeprefix("file:"))
    return DeltaTable(f"s3://{uri.split('://', 1)[1]}",
                      storage_options=delta_rs_s3_options(spec[1]))
