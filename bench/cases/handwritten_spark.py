"""The job a user writes without lakesink: Kafka -> from_json -> partitioned Parquet
(and, with ``--floor``, the bound of any Spark job: read the topic, discard it).

Plain PySpark Structured Streaming with Spark's own file sink and default settings
(local[*], 2g driver, the connector jar); the same schema, partitions and batch size
as the lakesink runs. Prints ``READY`` once the query runs and ``PROGRESS <rows>`` per
micro-batch (from the query's progress reports).

    python bench/cases/handwritten_spark.py --bootstrap H:P --topic T --out DIR \
        --checkpoint DIR --jars a.jar,b.jar [--max-offsets N] [--stream]
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--jars", required=True)
    ap.add_argument("--schema", required=True)
    ap.add_argument("--max-offsets", type=int, default=0)
    ap.add_argument("--stream", action="store_true", help="1 s trigger until killed")
    ap.add_argument("--floor", action="store_true",
                    help="read the topic and discard it (format noop): the bound of any "
                    "Spark job on this topic")
    args = ap.parse_args()

    spark = (SparkSession.builder.master("local[*]").appName("handwritten")
             .config("spark.jars", args.jars).config("spark.driver.memory", "2g")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.topic).option("startingOffsets", "earliest"))
    if args.max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets)
    raw = reader.load()
    if args.floor:
        writer = (raw.select("value").writeStream.format("noop")
                  .option("checkpointLocation", args.checkpoint))
        return run(spark, writer, args.stream)
    events = raw.select(F.from_json(F.col("value").cast("string"), args.schema).alias("e"))
    ts = F.timestamp_millis(F.col("e.ts_ms"))
    out = events.select("e.*", F.year(ts).alias("year"), F.month(ts).alias("month"),
                        F.dayofmonth(ts).alias("day"))
    writer = (out.writeStream.format("parquet").option("path", args.out)
              .option("checkpointLocation", args.checkpoint)
              .partitionBy("location", "year", "month", "day"))
    run(spark, writer, args.stream)


def run(spark: SparkSession, writer: DataStreamWriter, stream: bool) -> None:
    writer = (writer.trigger(processingTime="1 second") if stream
              else writer.trigger(availableNow=True))
    query = writer.start()
    print("READY", flush=True)
    seen = 0
    while query.isActive:
        progress = query.recentProgress
        for p in progress[seen:] if len(progress) >= seen else progress:
            if p["numInputRows"]:
                print("PROGRESS", p["numInputRows"], flush=True)
        seen = len(progress)
        time.sleep(0.2)
    for p in query.recentProgress[seen:]:
        if p["numInputRows"]:
            print("PROGRESS", p["numInputRows"], flush=True)
    if query.exception():
        raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()


if __name__ == "__main__":
    main()
