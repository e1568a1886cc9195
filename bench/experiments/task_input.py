"""Ad-hoc experiment: what it costs the JVM to hand Kafka records to Python tasks
(``mapInArrow`` with a count-only function), by the columns handed over, the Arrow batch
size and the Kafka fetch size; ``noop`` of the same columns for the floor. Batch reads of
one topic, one SparkSession, the variants alternating per round (the first round warms
the JVM).

    .venv/bin/python bench/experiments/task_input.py 1000000 [ROUNDS]
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench.common import alternate, events  # noqa: E402
from lakesink.local.services import KafkaBroker, produce  # noqa: E402
from lakesink.runtime.spark import build_spark_session  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
ALL = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
LEAN = ["key", "value", "partition", "offset", "timestamp"]


def count(batches):
    import pyarrow as pa
    n = 0
    for b in batches:
        n += b.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n]})


with KafkaBroker() as broker:
    broker.create_topic("t", partitions=4)
    produce(broker.bootstrap_servers, "t", events(N))
    spark = build_spark_session(master="local[*]", log_level="ERROR")

    def kafka(**opts):
        r = (spark.read.format("kafka").option("kafka.bootstrap.servers",
                                               broker.bootstrap_servers)
             .option("subscribe", "t").option("startingOffsets", "earliest"))
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()

    def arrow(cols, per_batch="10000", **opts):
        def run():
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", per_batch)
            rows = kafka(**opts).select(*cols).mapInArrow(count, "n long").collect()
            assert sum(r.n for r in rows) == N
        return run

    def noop(cols):
        return lambda: kafka().select(*cols).write.format("noop").mode("overwrite").save()

    big = {"kafka.max.partition.fetch.bytes": str(16 << 20),
           "kafka.fetch.max.bytes": str(64 << 20)}
    import shutil
    import tempfile

    from bench.common import PARTITION_BY, SCHEMA
    from lakesink.pipeline.arrow_path import stage_in_tasks
    from lakesink.pipeline.arrow_task import TaskSpec

    out_dir = tempfile.mkdtemp(prefix="task-input-")
    spec = TaskSpec(fields=tuple((n, d, True) for n, _, d in SCHEMA),
                    partition_by=tuple(PARTITION_BY), timestamp_column="ts_ms",
                    derived=("year", "month", "day"), filesystem=("local", {}))

    def lakesink_task(per_batch="10000"):
        def run():
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", per_batch)
            shutil.rmtree(out_dir, ignore_errors=True)
            staged = stage_in_tasks(kafka(), spec, out_dir, None)
            assert staged.rows == N, staged.rows
        return run

    variants = {
        "lakesink-task": lakesink_task(),
        "noop-value": noop(["value"]),
        "noop-all": noop(ALL),
        "arrow-all": arrow(ALL),
        "arrow-lean": arrow(LEAN),
        "arrow-value": arrow(["value"]),
        "arrow-lean-100k": arrow(LEAN, "100000"),
        "arrow-lean-fetch16m": arrow(LEAN, **big),
    }
    alternate(variants, ROUNDS, N)
    spark.stop()
