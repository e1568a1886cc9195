"""The per-task work, measured alone (one thread, no Spark, no broker): which decoder and
writer the Arrow path should use. Same events as bench/run.py.

    .venv/bin/python bench/decoders.py [--events 1000000] [--bad-every 0]

Cases, each on the same Arrow array of raw values (the shape a task receives):

* ``pyarrow.json`` — ``read_json`` with the table's schema, strict (the Arrow path's
  decoder);
* ``polars`` — ``polars.read_ndjson`` with the schema (if polars is installed);
* ``task`` — the whole task of the Arrow path (``run_task``: decode, certify, partition
  columns, Parquet files in Hive folders), with ``--bad-every N`` one malformed record in
  N (0: none), so the cost of bad records shows.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.json as pj  # noqa: E402

from bench.common import PARTITION_BY, SCHEMA, events  # noqa: E402
from lakesink.pipeline.arrow_task import ARROW_TYPES, TaskSpec, run_task  # noqa: E402


def _batch(values: list[bytes]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "key": pa.nulls(n, pa.binary()), "value": pa.array(values, pa.binary()),
        "topic": pa.array(["bench"] * n), "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array([0] * n, pa.int32())})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--bad-every", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    values = [v for _, v in events(args.events)]
    if args.bad_every:
        for i in range(args.bad_every // 2, len(values), args.bad_every):
            values[i] = b'{"event_id": oops'
    schema = pa.schema([(n, ARROW_TYPES[d]) for n, _, d in SCHEMA])
    joined = b"\n".join(values)
    print(f"{len(values):,} events, {len(joined) / len(values):.0f} B each, "
          f"bad every {args.bad_every or '-'}; {platform.processor() or platform.machine()}, "
          f"pyarrow {pa.__version__}", flush=True)

    def pyarrow_json() -> int:
        options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
        try:
            return pj.read_json(io.BytesIO(joined), parse_options=options,
                                read_options=pj.ReadOptions(use_threads=False,
                                                            block_size=64 << 20)).num_rows
        except pa.ArrowInvalid:  # a malformed line fails the whole read
            return -1

    cases = {"pyarrow.json": pyarrow_json}
    try:
        import polars as pl

        polars_schema = {n: {"bigint": pl.Int64, "double": pl.Float64, "string": pl.String}[d]
                         for n, _, d in SCHEMA}

        def polars_ndjson() -> int:
            try:
                return pl.read_ndjson(io.BytesIO(joined), schema=polars_schema).height
            except Exception:  # noqa: BLE001 - a malformed line fails the whole read
                return -1

        cases[f"polars {pl.__version__}"] = polars_ndjson
    except ImportError:
        print("polars not installed: skipped", flush=True)

    staging = Path(tempfile.mkdtemp(prefix="decoders-"))
    spec = TaskSpec(fields=tuple((n, d, True) for n, _, d in SCHEMA),
                    partition_by=tuple(PARTITION_BY), timestamp_column="ts_ms",
                    derived=("year", "month", "day"), staging=str(staging))
    batch = _batch(values)

    def task() -> int:
        shutil.rmtree(staging, ignore_errors=True)
        slices = [batch.slice(i, 10_000) for i in range(0, batch.num_rows, 10_000)]
        out = pa.Table.from_batches(list(run_task(spec, slices, task=0)))
        return sum(out.filter(pc.equal(out.column("kind"), "file")).column("rows").to_pylist())

    cases["task (decode+certify+write)"] = task
    for name, fn in cases.items():
        best = None
        for _ in range(args.rounds):
            started = time.perf_counter()
            rows = fn()
            took = time.perf_counter() - started
            best = took if best is None else min(best, took)
        assert best is not None
        print(f"{name:30s} {best:6.2f} s  {len(values) / best:12,.0f} events/s  rows {rows:,}",
              flush=True)
    shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    main()
