"""Hive partition folders: how a value names a folder and how a folder is read back.

``<col>=<escaped value>`` with Hive's escaping (what Spark's ``partitionBy`` writes),
the null folder, the longest name every backend takes, and the check that a relative
folder is exactly one partition's. Both engines (Spark's expressions in
:mod:`lakesink.pipeline.partitioning`, the Arrow tasks) and the table writers, the
catalogs and maintenance read these rules from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote, unquote

HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# Hive's FileUtils.escapePathName character set (what Spark's partitionBy uses).
_ESCAPE = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(0x01, 0x20)}
# the same set as a Java regular expression character class
ESCAPE_CLASS = '[\\x01-\\x1F\\x7F"#%\'*/:=?\\\\{\\[\\]\\^]'
#: the longest partition folder name ``<col>=<escaped value>``, in UTF-8 bytes: the
#: name limit of ext4, XFS and HDFS (``dfs.namenode.fs-limits.max-component-length``)
MAX_FOLDER_BYTES = 255


def ascii_name(name: str) -> str:
    """``name`` (Hive-escaped folder names) with every non-ASCII character
    percent-encoded as its UTF-8 bytes: ``location=Zürich`` -> ``location=Z%C3%BCrich``.

    The folders of files a Delta table's log gets from delta-rs are named so (as
    delta-rs' own writer names them). delta-rs writes a file's path into the log
    percent-encoded, non-ASCII included; Delta-Spark's ``VACUUM`` compares the log's
    paths with the listed ones without decoding them, so a live file in a folder named
    with raw non-ASCII characters (Spark's way) looks untracked to it and is deleted
    once past the retention. ASCII names are spelled alike by both.
    """
    if name.isascii():
        return name
    return "".join(c if c.isascii() else quote(c, safe="") for c in name)


def escape_value(value: str, *, ascii_only: bool = False) -> str:
    """Hive path escaping of one partition value (with ``ascii_only``, then
    :func:`ascii_name`)."""
    escaped = "".join(f"%{ord(c):02X}" if c in _ESCAPE else c for c in value)
    return ascii_name(escaped) if ascii_only else escaped


def folder_fits(col: str, value: str, *, ascii_only: bool = False) -> bool:
    """Whether ``value`` can name a folder of partition column ``col`` on every backend:
    it holds no NUL (no file system takes one, and Hive's escaping leaves it as it is)
    and ``<col>=<escaped value>`` is at most :data:`MAX_FOLDER_BYTES` (``ascii_only``:
    escaped by :func:`ascii_name` too, a Delta table's rule). A record whose value does
    not fit is a dead letter (``invalid_partition_value``): written, it would fail its
    batch on every retry."""
    return "\x00" not in value and len(
        f"{escape_value(col, ascii_only=ascii_only)}="
        f"{escape_value(value, ascii_only=ascii_only)}".encode()) <= MAX_FOLDER_BYTES


def unescape_value(value: str) -> str:
    """Inverse of :func:`escape_value` (either spelling: percent-encoded UTF-8 bytes
    decode to their character)."""
    return unquote(value, errors="strict") if "%" in value else value


def is_safe_relative_dir(rel: str, columns: Sequence[str]) -> bool:
    """True when ``rel`` is exactly ``c1=v1/…/cn=vn`` for the partition columns, in order."""
    if not columns:
        return rel in ("", ".")
    parts = rel.split("/")
    if len(parts) != len(columns):
        return False
    for part, col in zip(parts, columns, strict=True):
        name, sep, value = part.partition("=")
        if not sep or name != col or not value or "/" in value:
            return False
    return True
