"""Parquet vs Delta ingest on the demo data, in one run, plus files per partition folder.

    .venv/bin/python bench/formats.py [--events 100000] [--partitions 4]

One local broker, one topic of demo sensor events, one SparkSession; each case ingests
the whole topic into a fresh table with ``--until-caught-up`` semantics and is checked
(row count and distinct ids) by an independent reader: DuckDB for Parquet, delta-rs for
Delta. Writes a markdown table and the raw JSON to ``bench/results/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine  # noqa: E402
from lakesink.config import load_config
from lakesink.demo import DEMO_SCHEMA, TOPIC, sensor_events
from lakesink.local.services import KafkaBroker, produce

CASES = [
    ("parquet", 1), ("delta", 1),   # default: one new file per partition folder per batch
    ("parquet", 0), ("delta", 0),   # no shuffle: one file per Spark task per folder
]


def read_back(table: Path, fmt: str) -> tuple[int, int]:
    if fmt == "delta":
        from deltalake import DeltaTable

        ids = DeltaTable(str(table)).to_pyarrow_table(columns=["event_id"]).column("event_id")
        return len(ids), len(set(ids.to_pylist()))
    import duckdb

    return duckdb.sql(f"SELECT count(*), count(DISTINCT event_id) FROM "
                      f"read_parquet('{table}/**/*.parquet')").fetchone()  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-offsets", type=int, default=25_000,
                        help="max_offsets_per_trigger: several batches per run")
    args = parser.parse_args()

    from lakesink.app import Pipeline
    from lakesink.runtime.spark import build_spark_session

    work = Path(tempfile.mkdtemp(prefix="lakesink-bench-"))
    rows = []
    with KafkaBroker() as broker:
        broker.create_topic(TOPIC, partitions=args.partitions)
        produced = produce(broker.bootstrap_servers, TOPIC, sensor_events(args.events))
        spark = build_spark_session(master="local[*]", log_level="ERROR")
        for i, (fmt, files_per_partition) in enumerate(CASES):
            lake = work / f"lake{i}"
            cfg = load_config(env={}, flags={
                "source.kafka.bootstrap_servers": broker.bootstrap_servers,
                "source.kafka.topics": [TOPIC],
                "source.kafka.max_offsets_per_trigger": args.max_offsets,
                "decode.schema": DEMO_SCHEMA,
                "table.base_path": str(lake),
                "table.format": fmt,
                "table.files_per_partition": files_per_partition,
                "table.partition_by": ["location", "year", "month", "day"],
                "table.timestamp_column": "ts_ms",
            })
            started = time.monotonic()
            stats = Pipeline.build(cfg, spark).run(until_caught_up=True)
            seconds = time.monotonic() - started
            table = lake / TOPIC
            count, distinct = read_back(table, fmt)
            per_folder = Counter(str(p.parent.relative_to(table)) for p in table.rglob("*.parquet")
                                 if "_delta_log" not in p.parts)
            sizes = [p.stat().st_size for p in table.rglob("*.parquet")
                     if "_delta_log" not in p.parts]
            rows.append({
                "format": fmt, "files_per_partition": files_per_partition,
                "seconds": round(seconds, 1), "events_per_s": round(stats.written / seconds),
                "batches": stats.batches, "rows": count, "distinct_ids": distinct,
                "valid": count == distinct == args.events,
                "folders": len(per_folder), "files": sum(per_folder.values()),
                "files_per_folder_mean": round(statistics.mean(per_folder.values()), 1),
                "mean_file_kib": round(statistics.mean(sizes) / 1024, 1),
            })
            print(rows[-1], flush=True)
        spark.stop()
    shutil.rmtree(work, ignore_errors=True)

    header = ("| format | files_per_partition | seconds | events/s | batches | rows | valid | "
              "folders | files | files/folder | mean file KiB |")
    lines = [header, "|" + "---|" * 11]
    for r in rows:
        lines.append(f"| {r['format']} | {r['files_per_partition']} | {r['seconds']} | "
                     f"{r['events_per_s']:,} | {r['batches']} | {r['rows']:,} | {r['valid']} | "
                     f"{r['folders']} | {r['files']} | {r['files_per_folder_mean']} | "
                     f"{r['mean_file_kib']} |")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    info = {"date": stamp, "machine": machine(), "events": args.events, "produced": produced,
            "topic_partitions": args.partitions, "max_offsets_per_trigger": args.max_offsets,
            "command": "python bench/formats.py " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
            "rows": rows}
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"formats-{stamp}.json").write_text(json.dumps(info, indent=1))
    md = (f"# Parquet vs Delta ingest, {stamp}\n\n`{info['command']}`\n\n"
          f"Machine: {json.dumps(info['machine'])}\n\n" + "\n".join(lines) + "\n")
    (out / f"formats-{stamp}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
