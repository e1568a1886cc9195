"""File operations on any Hadoop filesystem (local, s3a, hdfs, gs, abfss) through Spark's JVM.

Using Hadoop's ``FileSystem`` keeps one code path for every store Spark can write to.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakesink.tables.azure_blob import AzureBlobs

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession


S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
OBJECT_STORES = frozenset({"s3a", "s3", "gs", "abfs", "abfss", "wasb", "wasbs", "oss"})


def to_uri(path: str) -> str:
    """Local paths become absolute ``file:`` URIs; URIs with a scheme pass unchanged.

    The local path is kept as it is, not percent-encoded: Hadoop reads the characters
    of a ``file:`` URI literally (``file:///a%20b`` is the folder ``a%20b``), so an
    encoded URI would put a table under ``my%20lake`` when the user said ``my lake``.
    """
    if "://" in path or path.startswith("file:"):
        return path.rstrip("/")
    return f"file://{Path(path).expanduser().resolve()}"


def local_path(uri: str) -> Path:
    """The local path of a ``file:`` URI, read the way Hadoop reads it: literally, with
    no percent-decoding (see :func:`to_uri`); an authority (``file://host/``) is dropped."""
    rest = uri.removeprefix("file:")
    if rest.startswith("//"):
        rest = "/" + rest[2:].partition("/")[2]
    return Path(rest)


def open_filesystem(filesystem: tuple[str, dict]) -> Any:
    """pyarrow's filesystem for ``("local", {})``, ``("s3", S3FileSystem keywords)`` or
    ``("azure", AzureFileSystem keywords)``: how the Python tasks (and delta-rs' footer
    checks) reach the table's store."""
    import pyarrow.fs as pafs

    kind, kwargs = filesystem
    if kind == "s3":
        return pafs.S3FileSystem(**kwargs)
    if kind == "azure":
        return pafs.AzureFileSystem(**kwargs)
    return pafs.LocalFileSystem()


def task_path(filesystem: tuple[str, dict], uri: str) -> str:
    """A Hadoop URI as :func:`open_filesystem`'s filesystem spells it (S3: ``bucket/key``;
    Azure: ``container/path``, the account being the filesystem's)."""
    if filesystem[0] == "s3":
        return uri.split("://", 1)[1].rstrip("/")
    if filesystem[0] == "azure":
        return azure_path(uri)
    return str(local_path(uri))


def on_azure(uri: str) -> bool:
    return uri.startswith(("abfs://", "abfss://"))


def azure_path(uri: str) -> str:
    """``abfs[s]://container@account.dfs.core.windows.net/p`` → ``container/p``."""
    authority, _, rest = uri.split("://", 1)[1].partition("/")
    return "/".join(p for p in (authority.split("@", 1)[0], rest.strip("/")) if p)


def join(*parts: str) -> str:
    head, *rest = parts
    return "/".join([head.rstrip("/"), *(p.strip("/") for p in rest if p)])


@dataclass(frozen=True)
class FileInfo:
    path: str  #: full path as the filesystem spells it
    relative: str  #: path below the listed folder, e.g. ``c1=v1/part-0.parquet``
    size: int
    mtime_ms: int = 0  #: last modification, ms since the epoch (the store's clock)


class HadoopFS:
    """A thin wrapper over ``org.apache.hadoop.fs.FileSystem`` for one root URI."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        self._Path = jvm.org.apache.hadoop.fs.Path
        self.fs: Any = self._Path(root).getFileSystem(self._conf)
        #: small files on Azure go through the Blob API (see :mod:`.azure_blob`)
        self._blobs = AzureBlobs(self._conf.get)

    def _p(self, path: str) -> Any:
        return self._Path(path)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(self._p(path)))

    def mkdirs(self, path: str) -> None:
        self.fs.mkdirs(self._p(path))

    def delete(self, path: str, *, recursive: bool = True) -> bool:
        return bool(self.fs.delete(self._p(path), recursive))

    def rename(self, src: str, dst: str) -> bool:
        return bool(self.fs.rename(self._p(src), self._p(dst)))

    def replace(self, src: str, dst: str, *,
                before_delete: Callable[[], None] | None = None) -> None:
        """Move ``src`` to ``dst``, replacing what is there; creates the parent folder.
        ``before_delete`` is called right before an existing ``dst`` is deleted (a writer
        proves there that the file is still its own to replace).

        A rename is atomic on local disk and HDFS, so readers see the old file or the
        new one, never a partial one.
        """
        self.mkdirs(dst.rpartition("/")[0])
        if self.exists(dst):
            if before_delete is not None:
                before_delete()
            self.delete(dst, recursive=False)
        if self.rename(src, dst):
            return
        if self.object_store:  # some stores' clients refuse a rename (GCS emulators): a
            # copy (one upload: the object appears whole) and a delete do the same
            util = self._jvm.org.apache.hadoop.fs.FileUtil
            if util.copy(self.fs, self._p(src), self.fs, self._p(dst), True, True, self._conf):
                return
        raise OSError(f"could not move {src} to {dst}")

    def parquet_dictionary_columns(self, path: str) -> dict[str, bool]:
        """Column path -> whether the Parquet file at ``path`` kept a dictionary page
        for it in every row group (read from the footer only)."""
        hadoop = self._jvm.org.apache.parquet.hadoop
        reader = hadoop.ParquetFileReader.open(
            hadoop.util.HadoopInputFile.fromPath(self._p(path), self._conf))
        try:
            blocks = list(reader.getFooter().getBlocks())
        finally:
            reader.close()
        kept: dict[str, bool] = {}
        for block in blocks:
            for column in block.getColumns():
                name = column.getPath().toDotString()
                kept[name] = kept.get(name, True) and bool(column.hasDictionaryPage())
        return kept

    def parquet_schema(self, path: str) -> str:
        """The Parquet schema (message type) a file's footer records, as text."""
        if path.startswith("file:"):
            import pyarrow.parquet as pq

            return str(pq.read_schema(str(local_path(path))).remove_metadata())
        hadoop = self._jvm.org.apache.parquet.hadoop
        reader = hadoop.ParquetFileReader.open(
            hadoop.util.HadoopInputFile.fromPath(self._p(path), self._conf))
        try:
            return str(reader.getFooter().getFileMetaData().getSchema().toString())
        finally:
            reader.close()

    def parquet_rows(self, path: str) -> int:
        """The row count a Parquet file's footer records (local files through pyarrow,
        others through Parquet's Hadoop reader: a footer read, not a scan)."""
        if path.startswith("file:"):
            import pyarrow.parquet as pq

            return int(pq.read_metadata(str(local_path(path))).num_rows)
        hadoop = self._jvm.org.apache.parquet.hadoop
        reader = hadoop.ParquetFileReader.open(
            hadoop.util.HadoopInputFile.fromPath(self._p(path), self._conf))
        try:
            return int(reader.getRecordCount())
        finally:
            reader.close()

    def list_files(self, path: str, *, suffix: str = "") -> list[FileInfo]:
        """Every file below ``path`` (recursive), skipping hidden and ``_``-prefixed files
        and folders, sorted by relative path."""
        if path.startswith("file:"):
            return _list_local(path, suffix)
        if not self.exists(path):
            return []
        # Hadoop spells paths its own way (file:/x for file:///x): compare qualified ones.
        root = self.fs.makeQualified(self._p(path)).toUri().getPath().rstrip("/") + "/"
        out: dict[str, FileInfo] = {}
        it = self.fs.listFiles(self._p(path), True)
        while it.hasNext():
            status = it.next()
            p = status.getPath()
            name = p.getName()
            if name.startswith((".", "_")) or not name.endswith(suffix):
                continue
            full = p.toUri().getPath()
            if not full.startswith(root):
                raise OSError(f"{full} is not below {root}")
            rel = full[len(root):]
            if any(part.startswith((".", "_")) for part in rel.split("/")[:-1]):
                continue
            # keyed by path: hadoop-azure 3.5's recursive listing of a Blob account
            # returns a file once per folder marker above it
            out[rel] = FileInfo(p.toString(), rel, int(status.getLen()),
                                int(status.getModificationTime()))
        return sorted(out.values(), key=lambda f: f.relative)

    def list_dirs(self, path: str) -> list[str]:
        """Names of the folders directly below ``path`` (none if it does not exist)."""
        if not self.exists(path):
            return []
        return sorted(str(st.getPath().getName()) for st in self.fs.listStatus(self._p(path))
                      if st.isDirectory())

    def read_text(self, path: str) -> str | None:
        """The file's text; None if it does not exist (also when it is removed while
        this reads it)."""
        if path.startswith("file:"):  # without a JVM round trip (bookkeeping reads)
            try:
                return local_path(path).read_text(encoding="utf-8")
            except (FileNotFoundError, NotADirectoryError):
                return None
        if not self.exists(path):
            return None
        try:
            return self._read(path)
        except Exception as exc:
            if not_found(exc):  # removed between the check and the read (a lease step
                return None     # another writer pruned): absent, as the contract says
            raise

    def _read(self, path: str) -> str:
        stream = self.fs.open(self._p(path))
        try:
            reader = self._jvm.java.io.BufferedReader(
                self._jvm.java.io.InputStreamReader(stream, "UTF-8")
            )
            lines = []
            line = reader.readLine()
            while line is not None:
                lines.append(line)
                line = reader.readLine()
            return "\n".join(lines)
        finally:
            stream.close()

    @property
    def object_store(self) -> bool:
        """True for stores where one PUT makes a whole object appear (S3, GCS, Azure)."""
        return str(self.fs.getScheme()) in OBJECT_STORES

    def write_text(self, path: str, text: str) -> None:
        """Write a small file so that readers see all of it or nothing.

        On an object store that is one PUT. Elsewhere the bytes go to a hidden
        temporary name beside it first, then are renamed into place (atomic on local
        disk and HDFS).
        """
        if on_azure(path):
            self._blobs.put(path, text.encode("utf-8"), if_absent=False)
            return
        if self.object_store:
            out = self.fs.create(self._p(path), True)
            try:
                out.write(bytearray(text.encode("utf-8")))
            finally:
                out.close()
            return
        parent, _, name = path.rpartition("/")
        tmp = f"{parent}/.{name}.tmp"
        out = self.fs.create(self._p(tmp), True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        self.replace(tmp, path)

    @property
    def s3a(self) -> bool:
        """Whether this is Hadoop's S3A client, whatever the URI's scheme: ``s3://``
        paths are mapped to S3A too, and S3A's ``getScheme()`` returns the URI's."""
        return str(self.fs.getClass().getName()) == S3A_CLASS

    def write_once(self, path: str, text: str) -> bool:
        """Create ``path`` with ``text`` only if it does not exist; False if it did.
        Readers see the whole file or none (a crash mid-write leaves no partial file).

        S3 (S3A, ``s3a://`` or ``s3://``): a conditional PUT (``If-None-Match: *``),
        which the store enforces atomically. Local disk: the text goes to a hidden
        temporary file, then a hard link names it (``link`` fails if the name exists).
        HDFS: a temporary file renamed into place (``rename`` refuses an existing
        destination, atomically in the NameNode). Azure: a Blob API PUT with
        ``If-None-Match: *`` (:mod:`.azure_blob`; ABFS's own create only checks first).
        GCS: ``create`` without overwrite, which its connector enforces with a
        precondition.
        """
        if path.startswith("file:"):
            return link_once(local_path(path), text)
        if on_azure(path):
            return self._blobs.put(path, text.encode("utf-8"), if_absent=True)
        p = self._p(path)
        try:
            if self.s3a or self.object_store:
                if self.s3a:
                    out = (self.fs.createFile(p).overwrite(False)
                           .must("fs.option.create.conditional.overwrite", True).build())
                else:
                    out = self.fs.create(p, False)
                try:
                    out.write(bytearray(text.encode("utf-8")))
                finally:
                    out.close()
                return True
            if self.exists(path):
                return False
            parent, _, name = path.rpartition("/")
            tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"
            out = self.fs.create(self._p(tmp), True)
            try:
                out.write(bytearray(text.encode("utf-8")))
            finally:
                out.close()
            try:
                return bool(self.fs.rename(self._p(tmp), p))
            finally:
                self.delete(tmp, recursive=False)
        except Exception:
            if self.exists(path):  # someone else created it first
                return False
            raise

    def read_json(self, path: str) -> Any:
        text = self.read_text(path)
        return None if text is None else json.loads(text)

    def write_json(self, path: str, data: Any) -> None:
        self.write_text(path, json.dumps(data, indent=1, sort_keys=True))


def not_found(exc: BaseException) -> bool:
    """Whether a JVM call failed because the file was not there: a
    ``java.io.FileNotFoundException`` anywhere in its chain of causes (HDFS's client
    unwraps the NameNode's ``RemoteException`` into one; S3A and local disk raise it)."""
    java = getattr(exc, "java_exception", None)
    for _ in range(10):
        if java is None:
            return False
        if str(java.getClass().getName()) == "java.io.FileNotFoundException":
            return True
        java = java.getCause()
    return False


def link_once(path: Path, text: str) -> bool:
    """Create ``path`` with ``text`` unless it exists, all or nothing (a hard link of a
    complete temporary file; ``link`` fails atomically on an existing name)."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _list_local(uri: str, suffix: str) -> list[FileInfo]:
    """:meth:`HadoopFS.list_files` for ``file:`` URIs without a JVM round trip per file."""
    import os

    root = local_path(uri)
    if not root.is_dir():
        return []
    out: list[FileInfo] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in files:
            if name.startswith((".", "_")) or not name.endswith(suffix):
                continue
            full = Path(folder) / name
            st = full.stat()
            out.append(FileInfo(f"file:{full}", full.relative_to(root).as_posix(),
                                st.st_size, int(st.st_mtime * 1000)))
    return sorted(out, key=lambda f: f.relative)
