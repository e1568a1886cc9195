"""The decoder interface: binary record values -> the table's typed fields.

Contract for every decoder:

* **Spark expressions only.** ``parse``, ``failure`` and ``explain`` build Columns; no
  per-row Python, so a batch decodes inside the JVM in one pass.
* **Never drop, never raise per record.** A value the decoder cannot turn into a row
  gets a non-null ``failure`` marker; the batch sends it to the rejected area with the
  ``explain`` reason and detail, and its raw bytes. Everything else becomes a row — or,
  for a decoder that ``explodes`` (Arrow IPC: a record holds a stream of rows), the
  rows :meth:`Decoder.rows` gives.
* **Deterministic.** The same bytes give the same row or the same rejection, so a
  replayed batch writes exactly what the first attempt wrote (exactly-once depends on it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql import types as T

#: the record has no value (a tombstone); every format rejects it
NULL_VALUE = "null_value"
#: ``wire: confluent`` and the value lacks the Confluent framing
BAD_MAGIC_BYTE = "bad_magic_byte"
CONFLUENT_HEADER = 5  # magic byte 0 + a 4-byte schema id


def combine(op: Callable[[Column, Column], Column], columns: Sequence[Column]) -> Column:
    """``c1 op c2 op … op cn`` as a balanced tree: a record with thousands of fields
    makes an expression log2(n) deep, not n deep (a left fold over 5 000 columns
    overflows the JVM stack when Spark converts it)."""
    items = list(columns)
    if not items:
        raise ValueError("combine needs at least one column")
    while len(items) > 1:
        pairs = [op(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
        items = pairs + ([items[-1]] if len(items) % 2 else [])
    return items[0]


def confluent_framed(value: Column) -> Column:
    """True when ``value`` starts with the Confluent framing (magic byte 0, schema id)."""
    return (F.length(value) >= CONFLUENT_HEADER) & (
        F.substring(value, 1, 1) == F.unhex(F.lit("00")))


def framing_detail(value: Column) -> Column:
    """The dead-letter detail of a value without the Confluent framing."""
    return F.concat(
        F.lit("expected the Confluent framing (magic byte 0 + 4-byte schema id), got "),
        F.coalesce(F.hex(F.substring(value, 1, CONFLUENT_HEADER)), F.lit("")),
        F.lit(" ("), F.length(value).cast("string"), F.lit(" bytes)"))


class Decoder(ABC):
    """One payload format. ``schema`` is the struct that :meth:`parse` yields."""

    #: reason codes this decoder may write (documented in docs/operations.md)
    reasons: tuple[str, ...] = (NULL_VALUE,)
    #: True when a record holds any number of rows (``rows`` gives them)
    explodes: bool = False

    def __init__(self, schema: T.StructType) -> None:
        self.schema = schema

    @property
    def fields(self) -> list[str]:
        return self.schema.fieldNames()

    @abstractmethod
    def parse(self, value: Column) -> Column:
        """A struct with (at least) the fields of ``schema``; fields of a rejected
        record may hold anything."""

    @abstractmethod
    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        """NULL for a good record, else a non-null marker (cheap: runs on every row)."""

    @abstractmethod
    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        """(reason code, human detail) of a rejected record (runs on rejected rows only)."""

    def rows(self, parsed: Column) -> Column:
        """An exploding decoder's rows of a record (an array of ``schema`` structs)."""
        raise NotImplementedError(f"{type(self).__name__} gives one row per record")

    def unknown_keys(self, value: Column, parsed: Column | None = None) -> Column:
        """Top-level fields outside the schema; formats with a fixed schema have none."""
        return F.array().cast("array<string>")
