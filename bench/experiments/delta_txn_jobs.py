"""Ad-hoc experiment: what Delta's ``txnAppId`` check costs per append.

Appends the same 20 000 cached rows six times per variant and prints each append's
seconds and Spark job count:

* ``default`` — ``txnAppId``/``txnVersion`` like lakesink;
* ``notxn`` — without them (no exactly-once: for comparison only);
* ``pre`` — like ``default``, with the new snapshot's transactions read right after each
  append (its state computed before the next append starts);
* ``sp1`` — like ``default`` with ``spark.databricks.delta.snapshotPartitions=1``.

    .venv/bin/python bench/experiments/delta_txn_jobs.py default,notxn,pre,sp1
"""
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pyspark.sql import functions as F

from lakesink.runtime.spark import build_spark_session

spark = build_spark_session(master="local[*]", log_level="ERROR")
sc = spark.sparkContext
df = spark.range(20000).select((F.col("id") % 5).cast("string").alias("loc"), F.col("id"),
                               F.rand().alias("v")).cache()
df.count()
for n, name in enumerate(sys.argv[1].split(",")):
    path = tempfile.mkdtemp() + "/t"
    spark.conf.set("spark.databricks.delta.snapshotPartitions", "1" if name == "sp1" else "4")
    for i in range(6):
        group = f"{n}-{name}-{i}"
        sc.setJobGroup(group, group)
        t = time.perf_counter()
        w = df.write.format("delta").mode("append").partitionBy("loc")
        if name != "notxn":
            w = w.option("txnAppId", "a").option("txnVersion", str(i))
        w.save(path)
        seconds = time.perf_counter() - t
        jobs = len(sc.statusTracker().getJobIdsForGroup(group))
        if name == "pre":
            log = sc._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
            log.unsafeVolatileSnapshot().setTransactions()
        print(f"{name} append {i}: {seconds:.2f} s, {jobs} job(s)", flush=True)
spark.stop()
