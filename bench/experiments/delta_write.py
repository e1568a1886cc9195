"""Ad-hoc experiment: what a Delta append costs next to a Parquet write, and which of
Delta's per-commit parts matter (statistics, checksum file, AQE, the shuffle).

Appends the same cached rows (the benchmark's events, from the NDJSON file
``parquet_dictionary.py`` creates) round-robin to one table per setting, with
``txnAppId``/``txnVersion`` like lakesink; prints seconds per append and the median
after two warm-up rounds.

    .venv/bin/python bench/experiments/delta_write.py 2000 14      # small batches
    .venv/bin/python bench/experiments/delta_write.py 500000 4     # large batches
"""
import collections
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pyspark.sql import functions as F

from bench.common import PARTITION_BY, SPARK_DDL
from lakesink.runtime.spark import build_spark_session

spark = build_spark_session(master="local[*]", log_level="ERROR")
rows = int(sys.argv[1]); reps = int(sys.argv[2])
df = spark.read.schema(SPARK_DDL).json(str(Path(tempfile.gettempdir()) / "ev1000000.ndjson")).limit(rows)
ts = F.timestamp_millis("ts_ms")
df = df.select("*", F.lpad(F.year(ts).cast("string"), 4, "0").alias("year"), F.lpad(F.month(ts).cast("string"), 2, "0").alias("month"), F.lpad(F.dayofmonth(ts).cast("string"), 2, "0").alias("day"))
df = df.repartition(4).cache(); df.count()
confs = {"default": {}, "nostats": {"spark.databricks.delta.stats.collect": "false"},
         "nocrc": {"spark.databricks.delta.writeChecksumFile.enabled": "false"},
         "noaqe": {"spark.sql.adaptive.enabled": "false"},
         "noshuffle": {}, "parquet": {}}
for n in confs: shutil.rmtree(str(Path(tempfile.gettempdir()) / f"ds2_{n}"), ignore_errors=True)
times = collections.defaultdict(list)
for i in range(reps):
    for name, conf in confs.items():
        for k, v in conf.items(): spark.conf.set(k, v)
        t = time.perf_counter()
        d = df if name == "noshuffle" else df.repartition(*PARTITION_BY)
        if name == "parquet":
            d.write.mode("overwrite").partitionBy(*PARTITION_BY).parquet(str(Path(tempfile.gettempdir()) / f"ds2_{name}" / str(i)))
        else:
            (d.write.format("delta").mode("append").option("txnAppId", "a").option("txnVersion", str(i))
             .partitionBy(*PARTITION_BY).save(str(Path(tempfile.gettempdir()) / f"ds2_{name}")))
        times[name].append(time.perf_counter() - t)
        for k in conf: spark.conf.unset(k)
for name, ts_ in times.items():
    print(f"{name:10s}", " ".join(f"{x:.2f}" for x in ts_), "median(2:)", f"{statistics.median(ts_[2:]):.2f}", flush=True)
