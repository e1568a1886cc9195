"""A read-only :class:`~lakesink.tables.fs.HadoopFS` without a JVM: the same reads
(``exists``, ``list_files``, ``list_dirs``, ``read_text``/``read_json``, a Parquet
footer's schema and rows) over a pyarrow filesystem, for the commands that only look at
a table (``dlq show``, ``repair`` without ``--apply``, ``vacuum --dry-run``, a
``compact`` with nothing to do): they answer in a second instead of starting Spark.

Paths are spelled as :class:`HadoopFS` spells them (``file:/…``, ``s3a://bucket/…``,
``abfss://container@account…/…``), so the table layouts and the bookkeeping readers
work unchanged. Local disk, S3 and Azure only
(:func:`~lakesink.runtime.lake.filesystem`); :meth:`ArrowFS.open` returns None for the
other stores, which take the Spark path. Writing is not part of it: a step that would
write raises, it never silently does nothing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NoReturn

from lakesink.errors import ConfigError
from lakesink.tables.fs import FileInfo, azure_path, local_path

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from lakesink.config.storage import StorageConfig


class ArrowFS:
    """See the module docstring."""

    object_store = False  # only read: the write paths that ask are never taken

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

    @classmethod
    def open(cls, storage: StorageConfig, root: str) -> ArrowFS | None:
        """The read-only filesystem of ``root``'s store (None: a store read only
        through Spark)."""
        from lakesink.runtime.lake import filesystem
        from lakesink.tables.fs import to_uri

        try:
            fs, _ = filesystem(storage, to_uri(root))
        except ConfigError:
            return None
        return cls(fs)

    @staticmethod
    def _native(path: str) -> str:
        if path.startswith("file:"):
            return str(local_path(path))
        if path.startswith(("abfs:", "abfss:")):
            return azure_path(path)
        return path.split("://", 1)[1] if "://" in path else path

    def _info(self, path: str) -> Any:  # noqa: ANN401
        return self.fs.get_file_info(self._native(path))

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self._info(path).type != pafs.FileType.NotFound)

    def list_files(self, path: str, *, suffix: str = "") -> list[FileInfo]:
        """:meth:`HadoopFS.list_files`: every file below ``path``, hidden and
        ``_``-prefixed files and folders skipped, sorted by relative path."""
        import pyarrow.fs as pafs

        root = self._native(path).rstrip("/") + "/"
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(root, recursive=True,
                                                            allow_not_found=True))
        except FileNotFoundError:
            return []
        # on an Azure account without a hierarchical namespace, hadoop-azure's mkdirs
        # leaves a blob named like the folder (a marker): a file that is a folder too
        # (an emptied folder's marker has no folder beside it: on Azure, a 0-byte file
        # without an extension is taken for one — lakesink's files all have one)
        folders = {i.path for i in infos if i.type == pafs.FileType.Directory}
        azure = isinstance(self.fs, pafs.AzureFileSystem)
        out = []
        for i in infos:
            if i.type != pafs.FileType.File or not i.path.startswith(root) \
                    or i.path in folders or (azure and not i.size and "." not in i.base_name):
                continue
            rel = i.path[len(root):]
            if any(part.startswith((".", "_")) for part in rel.split("/")) \
                    or not rel.endswith(suffix):
                continue
            mtime = int(i.mtime.timestamp() * 1000) if i.mtime is not None else 0
            out.append(FileInfo(f"{path.rstrip('/')}/{rel}", rel, int(i.size or 0), mtime))
        return sorted(out, key=lambda f: f.relative)

    def list_dirs(self, path: str) -> list[str]:
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self._native(path),
                                                        allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def read_text(self, path: str) -> str | None:
        try:
            with self.fs.open_input_stream(self._native(path)) as f:
                return bytes(f.read()).decode("utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def read_json(self, path: str) -> Any:  # noqa: ANN401
        text = self.read_text(path)
        return None if text is None else json.loads(text)

    def parquet_schema(self, path: str) -> str:
        """As :meth:`HadoopFS.parquet_schema` reads a local file: pyarrow's schema."""
        import pyarrow.parquet as pq

        with self.fs.open_input_file(self._native(path)) as f:
            return str(pq.read_schema(f).remove_metadata())

    def parquet_rows(self, path: str) -> int:
        import pyarrow.parquet as pq

        with self.fs.open_input_file(self._native(path)) as f:
            return int(pq.read_metadata(f).num_rows)

    def dataset(self, paths: list[str]) -> Any:  # noqa: ANN401 - a pyarrow Dataset
        """Parquet files as one dataset (scanned lazily, e.g. by DuckDB)."""
        import pyarrow.dataset as ds

        return ds.dataset([self._native(p) for p in paths], filesystem=self.fs,
                          format="parquet")

    def _refuse(self, *_: object, **__: object) -> NoReturn:
        raise NotImplementedError("ArrowFS only reads; this step needs the Spark path")

    mkdirs = delete = rename = replace = write_text = write_once = write_json = _refuse
