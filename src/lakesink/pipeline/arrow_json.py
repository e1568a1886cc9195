"""The JSON decode of the Arrow path's tasks (:mod:`lakesink.pipeline.arrow_task`, step 2).

Values are parsed with ``pyarrow.json`` against the table's schema, strictly (a field
of another JSON type, a number that does not fit, an unknown field, a value that is not
one JSON object all fail). When a block fails, one syntax scan (DuckDB's
``json_valid``) sets its malformed records apart and the runs between them are parsed
again; a well-formed record of another shape is found by bisecting its run. Records
that do not decode are *suspects*, handed back raw to the driver (which runs Spark's
decoder on them); a task hands back at most its budget of them
(:class:`TooManySuspects`).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

class DecodeSpec(Protocol):
    """What the decode reads of a task's spec (:class:`~lakesink.pipeline.arrow_task.TaskSpec`)."""

    @property
    def schema(self) -> pa.Schema: ...

    block_rows: int  #: records per parse (fewer if they are big)
    max_suspects: int  #: suspects a task may hand back


#: bytes of records joined for one parse
BLOCK_BYTES = 64 << 20
#: a failed parse of at least this many records is scanned for malformed ones first
SCAN_MIN_RECORDS = 64


class TooManySuspects(Exception):
    """More suspects than a task hands back: the batch takes the Spark path."""


def candidates(values: pa.Array) -> pa.Array:
    """Records worth a parse: a value that starts with ``{``. Anything else (null,
    empty, whitespace first, a BOM, ``null``) is a suspect without a parse. Every
    candidate gives at least one row (its first line starts an object), so a range that
    parsed into as many rows as it has records holds exactly one row per record, in
    order. A raw newline inside a candidate splits it into lines of the joined text:
    inside a string (which JSON forbids, and Spark refuses) or inside an object it
    fails the parse; between two objects it makes two rows: a suspect either way.
    pyarrow's parser refuses other raw control characters inside strings too."""
    return pc.fill_null(pc.starts_with(values, b"{"), False)


def decode(spec: DecodeSpec, values: pa.ChunkedArray | pa.Array, budget: list[int] | None = None
           ) -> tuple[pa.Table, pa.Array]:
    """(rows decoded against the schema, one per record; a mask of the records that
    decoded). Rows of records that did not decode are all null. ``budget``: suspects
    this task may still hand back (raises :class:`TooManySuspects` when spent)."""
    schema = spec.schema
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    values = values.cast(pa.binary())
    budget = budget if budget is not None else [spec.max_suspects]
    n = len(values)
    # records per parse: spec.block_rows, fewer for big records (a parse joins its
    # records into one buffer, whose offsets are 32-bit)
    mean = max(1, values.nbytes // max(1, n))
    block = max(1, min(spec.block_rows, BLOCK_BYTES // mean))
    parts: list[tuple[int, pa.Table | None]] = []  # (start, table or None), in order
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    for start, stop, candidate in _runs(candidates(values)):
        if not candidate:
            for i in range(start, stop):
                _suspect(parts, i, budget)
            continue
        for first in range(start, stop, block):
            _parse_range(values, first, min(stop, first + block), options, schema, parts,
                         budget)
    ok = []
    tables = []
    for begin, end, table in _spans(parts, n):
        if table is None:
            ok.append(pa.array([False] * (end - begin)))
            tables.append(_nulls(schema, end - begin))
        else:
            ok.append(pa.array([True] * (end - begin)))
            tables.append(table)
    decoded = pa.concat_tables(tables).combine_chunks() if tables else _nulls(schema, 0)
    mask = pa.concat_arrays(ok) if ok else pa.array([], pa.bool_())
    return decoded, mask


def _runs(mask: pa.Array) -> Iterator[tuple[int, int, bool]]:
    """(start, stop, value) of the runs of equal values of a boolean mask (no nulls)."""
    flags = np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)
    if not len(flags):
        return
    edges = np.flatnonzero(flags[1:] != flags[:-1]) + 1
    bounds = [0, *edges.tolist(), len(flags)]
    for start, stop in zip(bounds, bounds[1:]):
        yield start, stop, bool(flags[start])


def _suspect(out: list[tuple[int, pa.Table | None]], index: int, budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise TooManySuspects
    out.append((index, None))


def _parse_range(values: pa.Array, start: int, stop: int, options: pj.ParseOptions,
                 schema: pa.Schema, out: list[tuple[int, pa.Table | None]],
                 budget: list[int], scanned: bool = False) -> None:
    """Parse records [start, stop) in one go. On failure, a syntax scan of the range
    (one fast pass) sets the records that are not well-formed JSON apart and the runs
    between them are parsed again; what still fails (a well-formed record of another
    shape) is bisected. So the cost of bad records grows with their number, not with
    the block's size times the depth of a bisection. Appends (start, table) for ranges
    that parsed, (index, None) for single records that did not."""
    count = stop - start
    table = _parse(values, start, stop, options)
    if table is not None and table.num_rows == count:
        out.append((start, table.cast(schema)))
        return
    if count == 1:
        _suspect(out, start, budget)
        return
    if not scanned and count >= SCAN_MIN_RECORDS:
        runs = list(_runs(well_formed(values.slice(start, count))))
        if len(runs) > 1 or not runs[0][2]:
            for first, last, good in runs:
                if good:
                    _parse_range(values, start + first, start + last, options, schema, out,
                                 budget, scanned=True)
                else:
                    for i in range(start + first, start + last):
                        _suspect(out, i, budget)
            return
    middle = start + count // 2
    _parse_range(values, start, middle, options, schema, out, budget, scanned=True)
    _parse_range(values, middle, stop, options, schema, out, budget, scanned=True)


def well_formed(values: pa.Array) -> pa.Array:
    """Per record: one well-formed JSON text, by DuckDB's ``json_valid`` (yyjson; one
    thread, about 1 GB/s). Only a hint for where to split a failed parse: it accepts a
    few texts pyarrow refuses (``NaN``, a trailing comma), which the parse that follows
    then sets apart. Invalid UTF-8 counts as not well-formed (a suspect either way)."""
    global _DUCKDB
    import duckdb

    if _DUCKDB is None:  # one per Python worker, made on first use (after the fork)
        _DUCKDB = duckdb.connect(config={"threads": 1})
    utf8 = valid_utf8(values)
    text = pc.if_else(utf8, values, pa.scalar(b"", pa.binary()))
    _DUCKDB.register("lakesink_values", pa.table({"v": text.cast(pa.string())}))
    try:
        result = _DUCKDB.sql("SELECT coalesce(json_valid(v), false) AS ok "
                             "FROM lakesink_values").arrow().read_all()
    finally:
        _DUCKDB.unregister("lakesink_values")
    return pc.and_(result.column("ok").combine_chunks(), utf8)


_DUCKDB = None


def _parse(values: pa.Array, start: int, stop: int, options: pj.ParseOptions
           ) -> pa.Table | None:
    piece = values.slice(start, stop - start)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(piece)], pa.int32()),
                                                     piece), b"\n")
    data = joined[0].as_buffer()
    # one block, one thread: two tasks share two cores, and a block must hold a record
    read = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, data.size + 1))
    try:
        return pj.read_json(io.BytesIO(data), parse_options=options, read_options=read)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _spans(parts: list[tuple[int, pa.Table | None]], n: int
           ) -> Iterator[tuple[int, int, pa.Table | None]]:
    for i, (start, table) in enumerate(parts):
        end = parts[i + 1][0] if i + 1 < len(parts) else n
        yield start, end, table


def _nulls(schema: pa.Schema, n: int) -> pa.Table:
    return pa.table({f.name: pa.nulls(n, f.type) for f in schema}, schema=schema)


def valid_utf8(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Per value: valid UTF-8 (or null). Checked once per column; per value only when
    the column as a whole is not."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    try:
        col.cast(pa.binary()).cast(pa.string()).validate(full=True)
        return pa.array([True] * len(col), pa.bool_())
    except (pa.ArrowInvalid, ValueError):
        pass
    return pa.array([decodes(v) for v in col.cast(pa.binary()).to_pylist()], pa.bool_())


def decodes(value: bytes | None) -> bool:
    if value is None:
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
