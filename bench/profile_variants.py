"""What each part of lakesink's batch costs: the real streaming pipeline with one part
switched off at a time, next to the hand-written job, in one warm JVM.

    .venv/bin/python bench/profile_variants.py [--events 1000000] [--batch 250000]
        [--variants hand,full,full,noextra,noshuffle,simplets,none]

Variants (each a fresh table and checkpoint on the same topic; the first run of a
process is a JVM warm-up, so repeat ``full`` and compare the later runs):

* ``hand`` — the hand-written job (``from_json`` + Spark's parquet file sink);
* ``full`` — lakesink as shipped;
* ``noextra`` — without unknown-key detection;
* ``noshuffle`` — without the repartition by partition columns;
* ``simplets`` — ``timestamp_millis`` instead of per-value epoch-unit detection;
* ``nosort`` — concurrent output writers (``spark.sql.maxConcurrentOutputFileWriters``)
  instead of sorting each task's rows by partition before the write;
* ``nocoalesce`` — AQE does not coalesce the shuffle's partitions before the write;
* ``alldict`` — Parquet tries dictionary encoding on every column in every batch
  (lakesink's writer learns from its first batch which columns abandon it);
* ``noguard`` — Delta without the schema-change guard in the write;
* ``none`` — unknown keys, shuffle and epoch units switched off.

Also prints the cost of single decode expressions on a cached batch (``--micro``).
These are profiles for deciding what to optimize, not benchmark results; those come
from ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LAKESINK_SCHEMA, PARTITION_BY, SPARK_DDL, events  # noqa: E402
from lakesink.local.services import KafkaBroker, produce  # noqa: E402


def _cpu_s(spark) -> float:  # noqa: ANN001, ARG001
    """CPU seconds (user + system) Spark's JVM, this process's java child, used so far:
    steadier than wall time on a shared VM."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and "java" in stat.read_text():
            return (int(fields[11]) + int(fields[12])) / tick
    return float("nan")


def _report(label: str, query, started: float, cpu: float) -> None:  # noqa: ANN001
    print(f"{label}: {time.perf_counter() - started:.1f} s, JVM CPU {cpu:.1f} s", flush=True)
    for p in query.recentProgress:
        if p["numInputRows"]:
            print(f"    {p['numInputRows']} rows, addBatch {p['durationMs'].get('addBatch')} ms",
                  flush=True)


def micro(spark, n: int) -> None:  # noqa: ANN001
    """Seconds per decode expression over ``n`` cached records (noop write, 4 runs)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from lakesink.decode.json import JsonDecoder

    raw = spark.createDataFrame([(v,) for _, v in events(n)], "value binary")
    raw = raw.repartition(4).cache()
    raw.count()
    decoder = JsonDecoder(T._parse_datatype_string(SPARK_DDL))
    text = F.col("value").cast("string")
    base = raw.select("value", decoder.parse(F.col("value")).alias("_r"))
    cases = {
        "from_json only": None,
        "+ json_object_keys": decoder.unknown_keys(F.col("value")),
        "+ guarded keys (shipped)": decoder.unknown_keys(F.col("value"), F.col("_r")),
        "+ colons by replace": F.length(text) - F.length(F.replace(text, F.lit(":"), F.lit(""))),
        "+ colons by regexp_count": F.regexp_count(text, F.lit(":")),
        "+ colons by split": F.size(F.split(text, ":", -1)),
    }
    for label, expr in cases.items():
        df = base if expr is None else base.withColumn("_x", expr)
        times = []
        for i in range(4):
            t = time.perf_counter()
            df.observe(f"m{len(times)}{i}{time.monotonic_ns()}", F.count(F.lit(1))) \
              .write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - t)
        print(f"{label:28s} {' '.join(f'{x:.2f}' for x in times)} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=250_000)
    ap.add_argument("--variants", default="hand,full,full,noextra,noshuffle,simplets,none")
    ap.add_argument("--micro", type=int, default=0, help="records for the expression costs")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark conf for every variant (repeatable)")
    ap.add_argument("--format", default="parquet", choices=["parquet", "delta"],
                    help="lakesink's table format")
    ap.add_argument("--jfr", help="record a Java Flight Recorder profile to this file")
    args = ap.parse_args()

    from pyspark.sql import functions as F

    import lakesink.decode.json as json_mod
    import lakesink.pipeline.columns as columns_mod
    from lakesink.app import Pipeline
    from lakesink.config import load_config
    from lakesink.runtime.spark import build_spark_session
    from lakesink.tables.base import TableWriter

    work = Path(tempfile.mkdtemp(prefix="lakesink-variants-"))
    conf = dict(c.split("=", 1) for c in args.conf)
    if args.jfr:
        conf["spark.driver.extraJavaOptions"] = (
            f"-XX:StartFlightRecording=filename={args.jfr},settings=profile")
    spark = build_spark_session(master="local[*]", log_level="ERROR", conf=conf)
    if args.micro:
        micro(spark, args.micro)
    variants = [v for v in args.variants.split(",") if v]
    if not variants:
        spark.stop()
        return
    from lakesink.pipeline.marker import Marker
    from lakesink.tables.parquet import ParquetTableWriter

    original = (json_mod.JsonDecoder.unknown_keys, TableWriter.shuffled,
                columns_mod.PartitionSpec.timestamp, Marker._guard,
                ParquetTableWriter._learn_dictionaries)
    with KafkaBroker() as broker:
        broker.create_topic("p", partitions=4)
        produce(broker.bootstrap_servers, "p", events(args.events))
        for n, variant in enumerate(variants):
            off = {"noextra": {"extra"}, "noshuffle": {"shuffle"}, "simplets": {"ts"},
                   "noguard": {"guard"},
                   "none": {"extra", "shuffle", "ts"}}.get(variant, set())
            Marker._guard = (lambda self: None) if "guard" in off else original[3]
            ParquetTableWriter._learn_dictionaries = (
                (lambda self, *_: None) if variant == "alldict" else original[4])
            session = {"nosort": {"spark.sql.maxConcurrentOutputFileWriters": "32"},
                       "nocoalesce": {"spark.sql.adaptive.coalescePartitions.enabled": "false"},
                       }.get(variant, {})
            for key in ("spark.sql.maxConcurrentOutputFileWriters",
                        "spark.sql.adaptive.coalescePartitions.enabled"):
                if key in session:
                    spark.conf.set(key, session[key])
                elif key not in conf:
                    spark.conf.unset(key)
            json_mod.JsonDecoder.unknown_keys = (
                (lambda self, v, p=None: F.array().cast("array<string>"))
                if "extra" in off else original[0])
            TableWriter.shuffled = (lambda self, df: df) if "shuffle" in off else original[1]
            columns_mod.PartitionSpec.timestamp = (
                (lambda self, r, k: (F.timestamp_millis(r["ts_ms"]), F.lit(False)))
                if "ts" in off else original[2])
            started, cpu = time.perf_counter(), _cpu_s(spark)
            if variant == "hand":
                raw = (spark.readStream.format("kafka")
                       .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                       .option("subscribe", "p").option("startingOffsets", "earliest")
                       .option("maxOffsetsPerTrigger", args.batch).load())
                ts = F.timestamp_millis(F.col("e.ts_ms"))
                out = (raw.select(F.from_json(F.col("value").cast("string"), SPARK_DDL)
                                  .alias("e"))
                       .select("e.*", F.year(ts).alias("year"), F.month(ts).alias("month"),
                               F.dayofmonth(ts).alias("day")))
                query = (out.writeStream.format("parquet").option("path", str(work / f"h{n}"))
                         .option("checkpointLocation", str(work / f"hc{n}"))
                         .partitionBy(*PARTITION_BY).trigger(availableNow=True).start())
            else:
                cfg = load_config(env={}, flags={
                    "source.kafka.bootstrap_servers": broker.bootstrap_servers,
                    "source.kafka.topics": ["p"],
                    "source.kafka.max_offsets_per_trigger": args.batch,
                    "decode.schema": LAKESINK_SCHEMA, "table.base_path": str(work / f"l{n}"),
                    "table.partition_by": PARTITION_BY, "table.timestamp_column": "ts_ms",
                    "table.format": args.format})
                query = Pipeline.build(cfg, spark).start(until_caught_up=True)
            query.awaitTermination()
            _report(variant, query, started, _cpu_s(spark) - cpu)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
