"""The per-task half of the Arrow data path: raw Kafka records in, staged Parquet files out.

Runs inside Spark's Python workers (``mapInArrow``), on the Arrow batches of one Spark
partition (one Kafka partition's offset range of the micro-batch). Plain pyarrow, no
Spark: unit-tested without a JVM. Per task:

1. **gather** the task's Arrow batches of raw records (``key``, ``value``, ``topic``,
   ``partition``, ``offset``, ``timestamp``, ``timestampType``);
2. **decode** the values with ``pyarrow.json`` against the table's schema, strictly:
   any field of another JSON type, a number that does not fit, an unknown field, a value
   that is not one JSON object. When a block fails, one syntax scan (DuckDB's
   ``json_valid``) sets its malformed records apart and the runs between them are parsed
   again; a well-formed record of another shape is found by bisecting its run. Bad
   records cost about one scan plus a parse per run, not the block again per record;
3. **certify** the decoded rows: a row is *good* only when the Arrow decode is surely
   what Spark's decoder gives for it (required fields present, no float overflow, valid
   UTF-8, a timestamp this module reads exactly). Every other record is a **suspect**:
   it is returned raw, and the driver runs Spark's decoder on the suspects — the same
   code, reasons and details as the Spark path — which rejects them (dead letters) or
   writes them. Being strict only costs speed, never a different result;
4. **derive** the partition columns (the rules of :mod:`lakesink.pipeline.partitioning`:
   epoch unit per value, UTC, zero-padded ``year/month/day/hour``, Hive escaping, the
   null folder) and the key/metadata columns;
5. **write** each partition folder's rows to
   ``<staging>/<c=v/…>/part-<task>-<attempt>-<n>.parquet`` (at most ``rows_per_file``
   rows a file), each file whole or absent. Every task attempt writes names of its own,
   so a retry or a speculative copy never truncates a file another attempt reported;
6. **report** one row per file (relative path, rows, bytes), the suspects, and the
   task's record count. The driver checks and commits (:mod:`lakesink.pipeline.arrow_path`).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakesink.pipeline.arrow_json import TooManySuspects, decode, valid_utf8
from lakesink.pipeline.partitioning import TIME_PARTS, UNIT_THRESHOLDS
from lakesink.tables.paths import (
    HIVE_DEFAULT_PARTITION,
    MAX_FOLDER_BYTES,
    escape_value,
    folder_fits,
)
from lakesink.tables.fs import open_filesystem
from lakesink.sources.record_shape import RECORD_COLUMNS, RECORD_DDL

#: Spark type names -> Arrow types the Arrow path parses them as. A timestamp or date is
#: parsed as text and certified by :func:`iso_values` (the rest is left to Spark's decoder)
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "boolean": pa.bool_(), "tinyint": pa.int8(),
    "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "timestamp": pa.string(),
    "date": pa.string(),
}
#: what a task reports (the driver's ``mapInArrow`` schema)
RESULT_DDL = f"kind string, path string, rows long, bytes long, stats string, {RECORD_DDL}"
#: a suspect's columns: the raw record (:mod:`lakesink.sources.records`)
RAW_COLUMNS = RECORD_COLUMNS
#: bytes of raw records decoded at a time
CHUNK_BYTES = 256 << 20
#: suspects' bytes (and records) *one batch's* tasks hand back to the driver at most,
#: together: every task gets its share (:func:`~lakesink.pipeline.arrow_path.
#: stage_in_tasks`); past it the batch takes the Spark path, which streams them. A
#: per-task cap alone would bring tasks x cap to a 1 GiB driver (audit-2 #8)
BATCH_SUSPECT_BYTES = 128 << 20
BATCH_SUSPECTS = 200_000
#: a task's share never goes below this (a batch of many tiny tasks still certifies some)
MIN_TASK_SUSPECT_BYTES = 256 << 10
#: timestamps Spark and Arrow both represent: years 0001-9999, in microseconds
_MIN_US, _MAX_US = -62135596800 * 10**6, 253402300799 * 10**6
#: an epoch number as text (Spark's ``trim`` removes spaces only; anything else, such as
#: ``NaN``, ``1d`` or ISO-8601, is left to Spark's path)
_NUMBER = r"^ *[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)? *$"
#: the ISO-8601 texts a timestamp field certifies: date, ``T``, time, up to 6 fraction
#: digits and an explicit zone (``Z`` or ``±hh:mm``), which Spark's from_json reads as
#: the same instant in any session time zone. Anything else (no zone, a space, more
#: digits, a JSON number: seconds to Spark) is left to Spark's decoder
_ISO_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_ISO_INSTANT = (rf"^{_ISO_DATE}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{{1,6}})?"
                r"(Z|[+-](0[0-9]|1[0-7]):[0-5][0-9])$")
#: per text-parsed type: (the texts certified, the Arrow type, Python's parser for a
#: text Arrow's cast refuses, the range as the type's integers: years 0001-9999)
_ISO_TYPES = {
    "timestamp": (_ISO_INSTANT, pa.timestamp("us", tz="UTC"), dt.datetime.fromisoformat,
                  pa.int64(), _MIN_US, _MAX_US),
    # a date: yyyy-mm-dd only (Spark also reads yyyy, yyyy-m, a trailing time...)
    "date": (f"^{_ISO_DATE}$", pa.date32(), dt.date.fromisoformat, pa.int32(),
             -719162, 2932896),
}


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, picklable (sent to the workers with the function)."""

    fields: tuple[tuple[str, str, bool], ...]  # (name, Spark type name, nullable)
    partition_by: tuple[str, ...] = ()
    timestamp_column: str | None = None
    use_kafka_timestamp: bool = False
    null_value: str = HIVE_DEFAULT_PARTITION
    key_column: str | None = None
    key_format: str = "string"
    metadata_column: str | None = None
    staging: str = ""  # the batch's Arrow staging folder, as ``filesystem`` spells it
    compression: str = "snappy"
    rows_per_file: int | None = None
    block_rows: int = 65_536  # records per pyarrow.json parse (fewer if they are big)
    chunk_rows: int = 262_144  # records decoded and written at a time (bounds memory)
    max_suspects: int = 50_000  # per task; beyond, the batch takes the Spark path
    suspect_bytes: int = 64 << 20  # per task; beyond, the batch takes the Spark path
    derived: tuple[str, ...] = field(default=())
    #: appended to file names (a Delta table's files are written in place, so their
    #: names carry the batch and the run)
    file_tag: str = ""
    #: report Delta statistics per file (numRecords, nullCount, min/max of numbers)
    stats: bool = False
    #: partition folders named in ASCII (``TableFormat.ascii_folders``: a Delta table's)
    ascii_folders: bool = False
    #: what the files are: ``parquet`` (the table's files), or ``arrow`` (Arrow IPC, a
    #: batch's rows staged for :mod:`lakesink.pipeline.arrow_merge`, which writes the
    #: folder's Parquet files from them: no Parquet encoded twice)
    stage_format: str = "parquet"
    #: ("local", {}) or ("s3", pyarrow S3FileSystem keywords: secrets, never shown)
    filesystem: tuple[str, dict] = field(default=("local", {}), repr=False)

    def open_filesystem(self) -> pafs.FileSystem:
        return open_filesystem(self.filesystem)

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, ARROW_TYPES[t], True) for n, t, _ in self.fields])


def warm_up(spec: TaskSpec) -> None:
    """What a Python worker does once, done before the first batch: the imports, a
    parse and a Parquet write (in a temporary folder, on local disk), the DuckDB scan
    of malformed records, and the S3 client's set-up (no request). Without it the
    first batch after a start waits for all of that (the first seconds of a run had a
    p99 latency of 3.9 s against 1.4-2.1 s later, bench/run.py)."""
    import tempfile
    from dataclasses import replace

    n = 2
    batch = pa.RecordBatch.from_pydict({
        "key": pa.nulls(n, pa.binary()), "value": pa.array([b"{}", b"{"], pa.binary()),
        "topic": pa.array(["warm-up"] * n), "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array([0] * n, pa.int32())})
    with tempfile.TemporaryDirectory(prefix="lakesink-warm-up-") as folder:
        local = replace(spec, staging=folder, filesystem=("local", {}), rows_per_file=None)
        for _ in run_task(local, [batch], task=0):
            pass
    if spec.filesystem[0] != "local":
        spec.open_filesystem()


def run_task(spec: TaskSpec, batches: Iterable[pa.RecordBatch], task: int,
             attempt: int = 0) -> Iterator[pa.RecordBatch]:
    """Steps 1-6 for one task (``task``: its Spark partition id; ``attempt``: this
    attempt's id, in its file names), ``spec.chunk_rows`` records at a time; a folder's
    file numbers go on across chunks. More than ``spec.max_suspects`` suspects: the
    task reports ``overflow`` and the files it wrote before (the driver removes them and
    redoes the batch on the Spark path)."""
    numbers: dict[str, int] = {}  # files written per folder so far
    records = handed = handed_bytes = 0
    out: list[pa.RecordBatch] = []
    try:
        for raw in _chunks(batches, spec.chunk_rows):
            records += raw.num_rows
            decoded, ok = decode(spec, raw.column("value"), [spec.max_suspects - handed])
            good, ok = certify(spec, raw, decoded, ok)
            suspects = raw.filter(pc.invert(ok))
            handed += suspects.num_rows
            handed_bytes += suspects.nbytes
            if handed > spec.max_suspects or handed_bytes > spec.suspect_bytes:
                raise TooManySuspects
            if good.num_rows:
                out += [_file(*written)
                        for written in write_folders(spec, good, task, numbers, attempt)]
            if suspects.num_rows:
                out.append(_suspects(suspects))
    except TooManySuspects:  # the files written so far, so the driver can remove them
        yield from (b for b in out if b.column(0)[0].as_py() == "file")
        yield _row(1, kind=pa.array(["overflow"]))
        return
    yield from out
    yield _count(records)


def _chunks(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """The task's Arrow batches regrouped into tables of about ``rows`` records."""
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        pending.append(batch)
        size += batch.num_rows
        if size >= rows or sum(b.nbytes for b in pending) >= CHUNK_BYTES:
            yield pa.Table.from_batches(pending).combine_chunks()
            pending, size = [], 0
    if pending:
        yield pa.Table.from_batches(pending).combine_chunks()


# -- certify -----------------------------------------------------------------------------


def certify(spec: TaskSpec, raw: pa.Table, decoded: pa.Table, ok: pa.Array
            ) -> tuple[pa.Table, pa.Array]:
    """The table rows (payload, derived partition columns, key/metadata columns) of the
    records whose Arrow decode is surely Spark's, and the final mask of those records."""
    checks = [ok]
    for name, type_name, nullable in spec.fields:
        col = decoded.column(name)
        if not nullable:
            checks.append(pc.is_valid(col))
        if type_name in ("float", "double"):
            # finite only: Spark rejects a float that overflowed to infinity, and reads
            # NaN/Infinity tokens its own way (pyarrow also takes Inf and -NaN)
            checks.append(pc.fill_null(pc.is_finite(col), True))
        if type_name == "string":  # Arrow's JSON reader does not check UTF-8
            checks.append(valid_utf8(col))
            if name in spec.partition_by and name not in spec.derived:
                checks.append(_folders_fit(name, col, spec.ascii_folders))
                if spec.null_value != HIVE_DEFAULT_PARTITION:  # Spark's path rejects it
                    checks.append(pc.fill_null(pc.not_equal(col, HIVE_DEFAULT_PARTITION),
                                               True))
    values: dict[str, pa.Array] = {}  # each field's value (timestamps, dates: certified)
    for name, type_name, _ in spec.fields:
        values[name] = decoded.column(name).combine_chunks()
        if type_name in _ISO_TYPES:  # read as text: certified even if a derived part
            values[name], certified = iso_values(values[name], type_name)  # replaces it
            checks.append(certified)
    columns = {name: values[name] for name, _, _ in spec.fields if name not in spec.derived}
    if spec.timestamp_column:  # Spark's path rejects an unreadable one (derived or not)
        micros, valid = timestamp_micros(spec, values[spec.timestamp_column],
                                         raw.column("timestamp"))
        checks.append(valid)
        ts = micros.cast(pa.timestamp("us", tz="UTC"))
        for name in spec.derived:
            columns[name] = time_part(ts, name)
    if spec.key_column:
        key = raw.column("key").combine_chunks()
        if spec.key_format == "string":
            checks.append(valid_utf8(key))
            key = _as_string(key)
        columns[spec.key_column] = key
    if spec.metadata_column:
        columns[spec.metadata_column] = pa.StructArray.from_arrays(
            [raw.column(c).combine_chunks().cast(t) for c, t in (
                ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()))],
            names=["topic", "partition", "offset", "timestamp", "timestamp_type"])
    mask = checks[0]
    for check in checks[1:]:
        mask = pc.and_(mask, pc.fill_null(check, False))
    table = pa.table(columns)
    return table.filter(mask), mask


def _folders_fit(name: str, col: pa.Array | pa.ChunkedArray, ascii_only: bool) -> pa.Array:
    """Per value of a text partition column: it can name a folder (``folder_fits``);
    checked exactly only for values long enough or holding a NUL."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    prefix = len(f"{escape_value(name, ascii_only=ascii_only)}=".encode())
    risky = pc.fill_null(pc.or_(
        pc.greater(pc.add(pc.multiply(pc.binary_length(col), 3), prefix), MAX_FOLDER_BYTES),
        pc.match_substring(col, "\x00")), False)
    if not pc.any(risky).as_py():
        return pa.array([True] * len(col), pa.bool_())
    values = col.cast(pa.binary()).to_pylist()
    return pa.array([not r or v is None or folder_fits(name, v.decode("utf-8", "replace"),
                                                        ascii_only=ascii_only)
                     for v, r in zip(values, risky.to_pylist(), strict=True)], pa.bool_())


def _as_string(col: pa.Array) -> pa.Array:
    """Binary -> string; invalid values (already suspects) become null."""
    try:
        return col.cast(pa.string())
    except pa.ArrowInvalid:
        texts = []
        for v in col.to_pylist():
            try:
                texts.append(None if v is None else v.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        return pa.array(texts, pa.string())


def iso_values(text: pa.Array, type_name: str) -> tuple[pa.Array, pa.Array]:
    """(values, certified) of a ``timestamp`` (UTC, microseconds) or ``date`` field parsed
    as text: certified are nulls and the ISO-8601 texts of :data:`_ISO_TYPES` inside
    years 0001-9999, which Spark's from_json reads as the same value."""
    pattern, target, parse, integers, low, high = _ISO_TYPES[type_name]
    shaped = pc.fill_null(pc.match_substring_regex(text, pattern), False)
    kept = pc.if_else(shaped, text, pa.scalar(None, pa.string()))
    try:
        values = kept.cast(target)
    except pa.ArrowInvalid:  # a day the month does not have (2026-02-30): value by value
        def one(value: str | None) -> object:
            try:
                return None if value is None else parse(value)
            except ValueError:
                return None

        parsed = [one(v) for v in kept.to_pylist()]
        shaped = pc.and_(shaped, pa.array([p is not None for p in parsed]))
        values = pa.array(parsed, target)
    number = values.cast(integers)
    inside = pc.and_(pc.greater_equal(number, low), pc.less_equal(number, high))
    certified = pc.or_(pc.is_null(text), pc.and_(shaped, pc.fill_null(inside, False)))
    return values, certified


def timestamp_micros(spec: TaskSpec, col: pa.ChunkedArray | pa.Array,
                     kafka_ts: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """(UTC microseconds, certified) per record: the timestamp column read as an epoch
    number whose unit is told by its magnitude (numeric strings too), or a timestamp or
    date field's value (a date: its midnight, UTC). ISO-8601 text and values outside
    years 0001-9999 are not certified (Spark's path reads them)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
        # certified by iso_values (within years 0001-9999); null: no timestamp
        result = col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        certified = pa.array([True] * len(col), pa.bool_())
    else:
        result, certified = _epoch_micros(col)
    if spec.use_kafka_timestamp:
        kafka = kafka_ts.combine_chunks() if isinstance(kafka_ts, pa.ChunkedArray) else kafka_ts
        kafka_us = kafka.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        fallback = pc.is_null(col)
        kafka_ok = pc.and_(pc.greater_equal(kafka_us, _MIN_US), pc.less_equal(kafka_us, _MAX_US))
        certified = pc.and_(certified, pc.or_(pc.invert(fallback),
                                              pc.fill_null(kafka_ok, True)))
        result = pc.if_else(fallback, pc.if_else(pc.fill_null(kafka_ok, False), kafka_us,
                                                 pa.scalar(None, pa.int64())), result)
    return result, certified


def _epoch_micros(col: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(UTC microseconds, certified) of epoch numbers, or numbers as text, whose unit
    their magnitude tells; nulls are certified (no timestamp)."""
    if pa.types.is_string(col.type):
        numeric = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
        text = pc.if_else(numeric, pc.utf8_trim(col, " "), pa.scalar(None, pa.string()))
        number = pc.cast(text, pa.float64())
        certified = pc.or_(pc.is_null(col), numeric)
    else:
        # like Spark's cast to double: a bigint past 2**53 rounds (no error)
        number = pc.cast(col, pa.float64(), safe=False)
        certified = pa.array([True] * len(col), pa.bool_())
    magnitude = pc.abs(number)
    micros = None
    for bound, _unit, per in reversed(UNIT_THRESHOLDS):
        scaled = pc.multiply(number, pa.scalar(per, pa.float64()))
        micros = scaled if micros is None else pc.if_else(
            pc.greater_equal(magnitude, pa.scalar(bound, pa.float64())), scaled, micros)
    assert micros is not None
    floored = pc.floor(micros)
    in_range = pc.and_(pc.greater_equal(floored, float(_MIN_US)),
                       pc.less_equal(floored, float(_MAX_US)))
    certified = pc.and_(certified, pc.fill_null(in_range, True))  # null: no timestamp
    safe = pc.if_else(pc.fill_null(in_range, False), floored, pa.scalar(None, pa.float64()))
    return pc.cast(safe, pa.int64()), certified


def time_part(ts: pa.Array, name: str) -> pa.Array:
    """``year`` (4 digits), ``month``/``day``/``hour`` (2), zero-padded strings."""
    assert name in TIME_PARTS
    value = {"year": pc.year, "month": pc.month, "day": pc.day, "hour": pc.hour}[name](ts)
    width = 4 if name == "year" else 2
    return pc.utf8_lpad(value.cast(pa.string()), width=width, padding="0")


# -- write -------------------------------------------------------------------------------


def folder_names(spec: TaskSpec, table: pa.Table) -> pa.Array:
    """Each row's partition folder ``c1=v1/…`` (Hive-escaped; null and empty values
    go to the null folder), computed once per distinct value."""
    parts = []
    for col in spec.partition_by:
        values = table.column(col).combine_chunks()
        if pa.types.is_boolean(values.type):
            text = pc.if_else(values, "true", "false")
        else:
            text = values.cast(pa.string())
        text = pc.if_else(pc.fill_null(pc.equal(text, ""), True),
                          pa.scalar(None, pa.string()), text)
        distinct = pc.unique(text)
        names = [f"{escape_value(col, ascii_only=spec.ascii_folders)}="
                 f"{escape_value(spec.null_value if v is None else v, ascii_only=spec.ascii_folders)}"
                 for v in distinct.to_pylist()]
        index = pc.index_in(text, value_set=distinct, skip_nulls=False)
        parts.append(pc.take(pa.array(names, pa.string()), index))
    if not parts:
        return pa.array([""] * table.num_rows, pa.string())
    return pc.binary_join_element_wise(*parts, "/")


def write_folders(spec: TaskSpec, table: pa.Table, task: int,
                  numbers: dict[str, int] | None = None, attempt: int = 0
                  ) -> list[tuple[str, int, int, str | None]]:
    """Write the rows into their partition folders under ``spec.staging``; returns
    (path relative to the staging folder, rows, bytes, Delta statistics as JSON or
    None) per file. ``numbers``: files per folder written before (by earlier chunks of
    the task), updated."""
    numbers = {} if numbers is None else numbers
    fs = spec.open_filesystem()
    folders = folder_names(spec, table)
    data = table.drop_columns(list(spec.partition_by)) if spec.partition_by else table
    order = pc.sort_indices(folders)  # stable: rows keep their order within a folder
    folders = pc.take(folders, order)
    data = data.take(order)
    encoded = pc.run_end_encode(folders)
    ends = encoded.run_ends.to_pylist()
    names = encoded.values.to_pylist()
    out = []
    start = 0
    for end, folder in zip(ends, names, strict=True):
        rows = end - start
        step = spec.rows_per_file or rows
        for offset in range(start, end, step):
            piece = data.slice(offset, min(step, end - offset))
            n = numbers.get(folder, 0)
            numbers[folder] = n + 1
            # the attempt in the name: attempts of one task (a retry, a speculative
            # copy, a straggler of an earlier batch attempt) never write the same file
            name = f"part-{task:05d}-{attempt}-{n:05d}{spec.file_tag}.{spec.stage_format}"
            rel = f"{folder}/{name}" if folder else name
            ipc = spec.stage_format == "arrow"
            encoded = ipc_bytes(piece) if ipc else parquet_bytes(piece, spec.compression)
            out.append((rel, piece.num_rows, put(fs, f"{spec.staging}/{rel}", encoded),
                        file_stats(piece) if spec.stats and not ipc else None))
        start = end
    return out


def file_stats(piece: pa.Table) -> str:
    """A file's statistics as a Delta ``add`` action carries them: ``numRecords`` and,
    per top-level column, ``nullCount``; ``minValues``/``maxValues`` of number columns
    only (exact, so a reader that skips files by them never skips a match; strings and
    timestamps would need Delta's truncation rules). Struct columns are left out: no
    statistics is always a safe answer."""
    stats: dict[str, object] = {"numRecords": piece.num_rows}
    nulls: dict[str, int] = {}
    lows: dict[str, object] = {}
    highs: dict[str, object] = {}
    for name, col in zip(piece.column_names, piece.columns, strict=True):
        if pa.types.is_nested(col.type):
            continue
        nulls[name] = col.null_count
        if (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)) \
                and col.null_count < len(col):
            low, high = pc.min_max(col).values()
            lows[name], highs[name] = low.as_py(), high.as_py()
    stats.update(minValues=lows, maxValues=highs, nullCount=nulls)
    return json.dumps(stats, separators=(",", ":"), allow_nan=False)


def parquet_bytes(piece: pa.Table, compression: str) -> pa.Buffer:
    buffer = pa.BufferOutputStream()
    pq.write_table(piece, buffer, compression=compression)
    return buffer.getvalue()


def ipc_bytes(piece: pa.Table) -> pa.Buffer:
    buffer = pa.BufferOutputStream()
    with pa.ipc.new_file(buffer, piece.schema) as writer:
        writer.write_table(piece)
    return buffer.getvalue()


def put(fs: pafs.FileSystem, path: str, data: pa.Buffer) -> int:
    """Store an encoded file with one write (one PUT on S3: a file appears whole or not
    at all); returns its size."""
    target = path
    if isinstance(fs, pafs.LocalFileSystem):  # written aside, then renamed: whole or absent
        fs.create_dir(path.rpartition("/")[0], recursive=True)
        target = f"{path}.{uuid.uuid4().hex}.tmp"
    with fs.open_output_stream(target) as out:
        out.write(data)
    if target != path:
        fs.move(target, path)
    return data.size


# -- report ------------------------------------------------------------------------------

_RESULT = pa.schema([
    ("kind", pa.string()), ("path", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()),
    ("stats", pa.string()),
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
])


def _row(n: int, **columns: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type)
         for f in _RESULT], schema=_RESULT)


def _file(path: str, rows: int, size: int, stats: str | None) -> pa.RecordBatch:
    return _row(1, kind=pa.array(["file"]), path=pa.array([path]), rows=pa.array([rows]),
                bytes=pa.array([size]), stats=pa.array([stats], pa.string()))


def _count(records: int) -> pa.RecordBatch:
    return _row(1, kind=pa.array(["count"]), rows=pa.array([records]))


def _suspects(raw: pa.Table) -> pa.RecordBatch:
    n = raw.num_rows
    return _row(n, kind=pa.array(["suspect"] * n),
                **{c: raw.column(c).combine_chunks() for c in RAW_COLUMNS})


__all__ = ["RESULT_DDL", "TaskSpec", "certify", "decode", "file_stats", "folder_names", "run_task",
           "timestamp_micros", "write_folders"]
