"""Parquet compaction of a table built from many small batches: files, mean size and a
DuckDB query's time before and after, with the rows checked.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/maintenance.py \
        [--batches 200] [--per-batch 1000] [--queries 5]

A real Kafka broker (KRaft, started here) holds ``batches × per-batch`` events; one
``lakesink run --until-caught-up`` in process ingests them ``per-batch`` records per
trigger into a table partitioned by ``location`` (six folders: one small file per
folder per batch); ``lakesink compact`` (in process, ``min_age_s: 0``) merges them.
DuckDB runs the same aggregate over ``<table>/**/*.parquet`` ``--queries`` times before
and after (median); rows and distinct ids are checked both times. Prints a markdown
table (paste it into bench/results/).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench.common import LAKESINK_SCHEMA, events, machine  # noqa: E402
from lakesink.local.services import KafkaBroker, produce  # noqa: E402

QUERY = ("SELECT location, count(*), count(DISTINCT event_id), avg(value) FROM "
         "read_parquet('{table}/**/*.parquet', hive_partitioning=true) GROUP BY 1")


def table_shape(table: Path, queries: int) -> dict[str, float]:
    import duckdb

    files = sorted(table.rglob("*.parquet"))
    sizes = [p.stat().st_size for p in files]
    times = []
    for _ in range(queries):
        started = time.perf_counter()
        rows = duckdb.sql(QUERY.format(table=table)).fetchall()
        times.append(time.perf_counter() - started)
    total = sum(r[1] for r in rows)
    distinct = sum(r[2] for r in rows)
    return {"files": len(files), "mean_kib": round(statistics.mean(sizes) / 1024, 1),
            "bytes": sum(sizes), "query_ms": round(statistics.median(times) * 1000, 1),
            "rows": total, "distinct_ids": distinct}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--per-batch", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=5)
    args = ap.parse_args()
    print(machine(), flush=True)

    from lakesink import maintenance
    from lakesink.app import Pipeline
    from lakesink.config import load_config
    from lakesink.runtime.spark import build_spark_session

    n = args.batches * args.per_batch
    work = Path(tempfile.mkdtemp(prefix="lakesink-bench-maintenance-"))
    with KafkaBroker() as broker:
        broker.create_topic("events", partitions=1)
        produce(broker.bootstrap_servers, "events", list(events(n)))
        spark = build_spark_session(master="local[*]", log_level="ERROR")
        cfg = load_config(env={}, flags={
            "source.kafka.bootstrap_servers": broker.bootstrap_servers,
            "source.kafka.topics": ["events"],
            "source.kafka.max_offsets_per_trigger": args.per_batch,
            "decode.schema": LAKESINK_SCHEMA, "table.name": "events",
            "table.base_path": str(work / "lake"), "table.partition_by": ["location"],
            "maintenance.min_age_s": 0})
        started = time.perf_counter()
        stats = Pipeline.build(cfg, spark).run(until_caught_up=True)
        ingest_s = time.perf_counter() - started
        table = work / "lake" / "events"
        before = table_shape(table, args.queries)
        report = maintenance.compact(cfg, spark)
        after = table_shape(table, args.queries)
        spark.stop()
    assert before["rows"] == before["distinct_ids"] == after["rows"] \
        == after["distinct_ids"] == n, (before, after)
    print(f"\n{stats.batches} batches of {args.per_batch} events ingested in "
          f"{ingest_s:.1f}s; compact: {report['compactions']} merge(s) of "
          f"{report['files_merged']} files in {report['seconds']}s, longest swap window "
          f"{report['max_swap_window_ms']} ms\n")
    print("| table | files | mean file size | bytes | DuckDB query (median of "
          f"{args.queries}) | rows | distinct ids |")
    print("|---|---|---|---|---|---|---|")
    for name, shape in (("before compact", before), ("after compact", after)):
        print(f"| {name} | {shape['files']} | {shape['mean_kib']} KiB | {shape['bytes']} | "
              f"{shape['query_ms']} ms | {shape['rows']} | {shape['distinct_ids']} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
