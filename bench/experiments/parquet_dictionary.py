"""Ad-hoc experiment: the cost of Parquet dictionary encoding on high-cardinality columns.

Writes the same cached, partitioned rows (the benchmark's events, from an NDJSON file it
creates) with dictionary encoding as Spark does by default, off for seven
high-cardinality columns, and off everywhere; prints seconds and output size per round.

    .venv/bin/python bench/experiments/parquet_dictionary.py 1000000 4
"""
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pyspark.sql import functions as F

from bench.common import PARTITION_BY, SPARK_DDL, events
from lakesink.runtime.spark import build_spark_session

n = int(sys.argv[1]); rounds = int(sys.argv[2])
path = str(Path(tempfile.gettempdir()) / f"ev{n}.ndjson")
if not os.path.exists(path):
    with open(path, "wb") as f:
        f.writelines(v + b"\n" for _, v in events(n))
spark = build_spark_session(master="local[*]", log_level="ERROR")
df = spark.read.schema(SPARK_DDL).json(path)
ts = F.timestamp_millis("ts_ms")
df = df.select("*", F.lpad(F.year(ts).cast("string"), 4, "0").alias("year"), F.lpad(F.month(ts).cast("string"), 2, "0").alias("month"), F.lpad(F.dayofmonth(ts).cast("string"), 2, "0").alias("day"))
df = df.repartition(4).cache(); df.count()
hi = ["event_id", "ts_ms", "value", "battery", "lat", "lon", "seq"]
cases = {"default": {}, "nodict-hi": {f"parquet.enable.dictionary#{c}": "false" for c in hi},
         "nodict-all": {"parquet.enable.dictionary": "false"}}
def size(p):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs if f.endswith(".parquet"))
for r in range(rounds):
    for k, opts in cases.items():
        out = str(Path(tempfile.gettempdir()) / f"dict_{k}")
        t = time.perf_counter()
        df.write.mode("overwrite").options(**opts).partitionBy(*PARTITION_BY).parquet(out)
        print(f"{r} {k:12s} {time.perf_counter()-t:.2f} s {size(out)/1e6:.1f} MB", flush=True)
