"""A read-only :class:`~lakesink.tables.fs.HadoopFS` without a JVM: the same reads
(``exists``, ``list_files``, ``list_dirs``, ``read_text``/``read_json``, a Parquet
footer's schema and rows) over a pyarrow filesystem, for the commands that only look at
a table (``dlq show``, ``repair`` without ``--apply``, ``vacuum --dry-run``, a
``compact`` with nothing to do): they answer in a second instead of starting Spark.

Paths are spelled as :class:`HadoopFS` spells them (``file:/…``, ``s3a://bucket/…``,
``abfss://container@account…/…``), so the table layouts and the bookkeeping readers
work unchanged. Local disk, S3 and Azure only
(:func:`~lakesink.runtime.lake.filesystem`); :meth:`ArrowFS.open` returns None for the
other stores, which take the Spark path.

Opened with ``writes=True`` it also writes where the store gives Python a create-if-absent
as atomic as :meth:`HadoopFS.write_once`'s — local disk (a hard link of a complete
temporary file) and Azure (a Blob API PUT with ``If-None-Match: *``, the same
:class:`~lakesink.tables.azure_blob.AzureBlobs` the Spark path uses) — so a Parquet
``vacuum`` takes the compactor lease and deletes without Spark. pyarrow's S3 client has
no conditional PUT: on S3 (and HDFS) ``open(..., writes=True)`` returns None. Moves
(``rename``/``replace``) only on local disk, where ``rename(2)`` is as atomic as
Hadoop's local rename (so ``repair --apply`` and the resume of a crashed compaction run
there too); on Azure they are Spark's (ABFS). A step it cannot take raises
:class:`NeedsSpark`; it never silently does nothing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError
from lakesink.tables.fs import FileInfo, link_once, azure_path, local_path, on_azure

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow.fs as pafs

    from lakesink.config.storage import StorageConfig
    from lakesink.tables.azure_blob import AzureBlobs


class NeedsSpark(NotImplementedError):
    """A step :class:`ArrowFS` cannot take on this store (a move, or a write on a store
    it only reads): the command runs again through Spark."""


class ArrowFS:
    """See the module docstring."""

    object_store = False  # the write paths that ask (HadoopFS.replace) are never taken

    def __init__(self, fs: pafs.FileSystem, blobs: AzureBlobs | None = None, *,
                 writes: bool = False) -> None:
        self.fs = fs
        self._blobs = blobs
        #: whether the write steps work (see the module docstring)
        self.writes = writes

    @property
    def moves(self) -> bool:
        """Whether moves work too (local disk)."""
        return self.writes and self._blobs is None

    @classmethod
    def open(cls, storage: StorageConfig, root: str, *,
             writes: bool = False) -> ArrowFS | None:
        """The filesystem of ``root``'s store (None: a store read only through Spark,
        or, with ``writes``, one written only through Spark)."""
        from lakesink.runtime.lake import filesystem
        from lakesink.tables.fs import to_uri

        uri = to_uri(root)
        try:
            fs, _ = filesystem(storage, uri)
        except ConfigError:
            return None
        if not writes:
            return cls(fs)
        if uri.startswith("file:"):
            return cls(fs, writes=True)
        if on_azure(uri):
            from lakesink.runtime.storage import azure_options
            from lakesink.tables.azure_blob import AzureBlobs

            return cls(fs, AzureBlobs(azure_options(storage.azure, [uri]).get), writes=True)
        return None

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

    # -- writes (``writes=True``: local disk and Azure) ---------------------------------

    def _writable(self) -> None:
        if not self.writes:
            raise NeedsSpark("this store is written through Spark only here")

    def write_once(self, path: str, text: str) -> bool:
        """:meth:`HadoopFS.write_once`: create ``path`` with ``text`` only if it does not
        exist (False if it did), all or nothing."""
        self._writable()
        if self._blobs is not None:
            return self._blobs.put(path, text.encode("utf-8"), if_absent=True)
        return link_once(local_path(path), text)

    def write_text(self, path: str, text: str) -> None:
        """:meth:`HadoopFS.write_text`: readers see the whole file or none."""
        self._writable()
        if self._blobs is not None:
            self._blobs.put(path, text.encode("utf-8"), if_absent=False)
            return
        import os
        import uuid

        target = local_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)

    def write_json(self, path: str, data: Any) -> None:  # noqa: ANN401
        self.write_text(path, json.dumps(data, indent=1, sort_keys=True))

    def mkdirs(self, path: str) -> None:
        self._writable()
        self.fs.create_dir(self._native(path), recursive=True)

    def delete(self, path: str, *, recursive: bool = True) -> bool:
        """:meth:`HadoopFS.delete`: False when nothing was there. On Azure a folder can
        also be a 0-byte blob of its own name (hadoop-azure's ``mkdirs`` marker), which
        pyarrow reports as a file: what lies below the name goes too, then the marker
        (only a 0-byte file is listed as a folder: a hierarchical account refuses to
        list a file)."""
        import pyarrow.fs as pafs

        self._writable()
        native = self._native(path)
        info = self.fs.get_file_info(native)
        kind = info.type
        below = []
        if kind == pafs.FileType.Directory or (self._blobs is not None and not info.size
                                               and kind == pafs.FileType.File):
            below = self.fs.get_file_info(pafs.FileSelector(native, allow_not_found=True))
        if kind == pafs.FileType.NotFound and not below:
            return False
        if below:
            if not recursive:
                raise OSError(f"{path} is a folder that is not empty")
            self.fs.delete_dir(native)
        elif kind == pafs.FileType.Directory:
            self.fs.delete_dir(native)
        if self.fs.get_file_info(native).type == pafs.FileType.File:
            self.fs.delete_file(native)
        return True

    def _movable(self) -> None:
        self._writable()
        if not self.moves:
            raise NeedsSpark("a move on Azure: this step needs the Spark path (ABFS)")

    def rename(self, src: str, dst: str) -> bool:
        """:meth:`HadoopFS.rename` on local disk: False when ``dst`` exists."""
        self._movable()
        if self.exists(dst):
            return False
        import os

        target = local_path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(local_path(src), target)
        return True

    def replace(self, src: str, dst: str, *,
                before_delete: Callable[[], None] | None = None) -> None:
        """:meth:`HadoopFS.replace` on local disk: one atomic ``rename(2)`` over what is
        at ``dst`` (``before_delete`` first, when there is something)."""
        self._movable()
        import os

        target = local_path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        if before_delete is not None and target.exists():
            before_delete()
        os.replace(local_path(src), target)
