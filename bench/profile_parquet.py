"""Where a Parquet micro-batch spends its time (issue 4 starts here).

    .venv/bin/python bench/profile_parquet.py

Times every HadoopFS call and the Spark write of each batch (wrapping them), twice on
the same SparkSession (the first run includes JVM warm-up), and prints Spark's own
per-batch durations from the query progress.
"""
import time, functools
from lakesink.config import load_config
from lakesink.demo import DEMO_SCHEMA, TOPIC, sensor_events
from lakesink.local.services import KafkaBroker, produce
from lakesink.runtime.spark import build_spark_session
from lakesink.app import Pipeline
import lakesink.tables.fs as fsm
T = {}
def timed(cls, name):
    orig = getattr(cls, name)
    @functools.wraps(orig)
    def w(*a, **k):
        t = time.monotonic()
        try: return orig(*a, **k)
        finally: T[f"{cls.__name__}.{name}"] = T.get(f"{cls.__name__}.{name}", 0) + time.monotonic() - t
    setattr(cls, name, w)
for n in ("list_files","replace","write_json","read_json","exists","delete","mkdirs"): timed(fsm.HadoopFS, n)
from pyspark.sql import DataFrameWriter
timed(DataFrameWriter, "parquet")
with KafkaBroker() as b:
    b.create_topic(TOPIC, partitions=4)
    produce(b.bootstrap_servers, TOPIC, sensor_events(100000))
    spark = build_spark_session(master="local[*]", log_level="ERROR")
    for run in range(2):
        import shutil; shutil.rmtree("/tmp/prof-lake", ignore_errors=True)
        T.clear()
        cfg = load_config(env={}, flags={"source.kafka.bootstrap_servers": b.bootstrap_servers, "source.kafka.topics": [TOPIC],
            "source.kafka.max_offsets_per_trigger": 25000, "decode.schema": DEMO_SCHEMA, "table.base_path": "/tmp/prof-lake",
            "table.partition_by": ["location","year","month","day"], "table.timestamp_column": "ts_ms", "table.files_per_partition": 0})
        p = Pipeline.build(cfg, spark)
        q = p.start(until_caught_up=True); t=time.monotonic(); q.awaitTermination(); total=time.monotonic()-t
        print("run", run, "total", round(total,1), "batch fn", round(p.stats.seconds,1))
        print({k: round(v,2) for k,v in T.items()})
        for pr in q.recentProgress:
            print(pr["batchId"], pr["numInputRows"], pr["durationMs"])
