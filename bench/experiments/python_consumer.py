"""Ad-hoc experiment: what reading Kafka *in the Python tasks* (confluent-kafka over
offset ranges the driver plans) would save against Spark's Kafka source handing the
records to the Python tasks (``mapInArrow``). Both feed the same lakesink task
(``run_task``: decode, partition, write Parquet) or only count. Batch reads of one
topic with 4 partitions, one SparkSession, the variants alternating per round (the
first round warms the JVM). CPU seconds are split into the Spark JVM, its Python
workers and the broker.

    .venv/bin/python bench/experiments/python_consumer.py 1000000 [ROUNDS]
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
TOPIC = "t"


def consumed(bootstrap: str, ranges, columns: str = "all"):
    """Arrow record batches of the raw records (lakesink's RAW_COLUMNS) of each
    (partition, start, end) range, read with confluent-kafka."""
    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition

    for partition, start, end in ranges:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "exp",
                      "enable.auto.commit": False, "enable.partition.eof": False,
                      "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
                      "queued.max.messages.kbytes": 1 << 20,
                      # without it librdkafka pre-fetches 100 k records and the task waits
                      "queued.min.messages": 1_000_000})
        c.assign([TopicPartition(TOPIC, partition, start)])
        pos = start
        while pos < end:
            msgs = [m for m in c.consume(num_messages=min(20000, end - pos), timeout=10)
                    if m.error() is None]
            if not msgs:
                raise RuntimeError(f"no records at {partition}/{pos}")
            n = len(msgs)
            if columns == "value":
                yield pa.RecordBatch.from_pydict(
                    {"value": pa.array([m.value() for m in msgs], pa.binary())})
            else:
                ts = [m.timestamp() for m in msgs]
                yield pa.RecordBatch.from_pydict({
                    "key": pa.array([m.key() for m in msgs], pa.binary()),
                    "value": pa.array([m.value() for m in msgs], pa.binary()),
                    "topic": pa.array([TOPIC] * n, pa.string()),
                    "partition": pa.array([partition] * n, pa.int32()),
                    "offset": pa.array([m.offset() for m in msgs], pa.int64()),
                    "timestamp": pa.array([t[1] * 1000 for t in ts], pa.timestamp("us")),
                    "timestampType": pa.array([t[0] for t in ts], pa.int32())})
            pos = msgs[-1].offset() + 1
        c.close()


with KafkaBroker() as broker:
    broker.create_topic(TOPIC, partitions=4)
    produce(broker.bootstrap_servers, TOPIC, events(N))
    spark = build_spark_session(master="local[*]", log_level="ERROR")
    bootstrap = broker.bootstrap_servers

    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "exp-plan"})
    RANGES = [(p, *probe.get_watermark_offsets(TopicPartition(TOPIC, p))) for p in range(4)]
    probe.close()
    assert sum(e - s for _, s, e in RANGES) == N, RANGES

    import functools
    import shutil
    import tempfile

    import pyarrow as pa
    import pyarrow.compute as pc

    from bench.common import PARTITION_BY, SCHEMA
    from lakesink.pipeline.arrow_path import stage_in_tasks
    from lakesink.pipeline.arrow_task import RESULT_DDL, TaskSpec, run_task

    out_dir = tempfile.mkdtemp(prefix="py-consumer-")
    spec = TaskSpec(fields=tuple((n, d, True) for n, _, d in SCHEMA),
                    partition_by=tuple(PARTITION_BY), timestamp_column="ts_ms",
                    derived=("year", "month", "day"), filesystem=("local", {}))

    def kafka():
        return (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", TOPIC).option("startingOffsets", "earliest").load())

    def ranges_df():
        return spark.createDataFrame(RANGES, "partition int, start long, stop long"
                                     ).repartition(4, "partition")

    def in_task(task_spec, bootstrap, batches):
        from pyspark import TaskContext

        ranges = [r for b in batches for r in zip(*(b.column(i).to_pylist()
                                                    for i in range(3)), strict=True)]
        ctx = TaskContext.get()
        yield from run_task(task_spec, consumed(bootstrap, ranges), ctx.partitionId(),
                            ctx.taskAttemptId())

    def count_in_task(bootstrap, batches):
        ranges = [r for b in batches for r in zip(*(b.column(i).to_pylist()
                                                    for i in range(3)), strict=True)]
        n = sum(b.num_rows for b in consumed(bootstrap, ranges, "value"))
        yield pa.RecordBatch.from_pydict({"n": [n]})

    def count(batches):
        yield pa.RecordBatch.from_pydict({"n": [sum(b.num_rows for b in batches)]})

    def spark_source_task():
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
        shutil.rmtree(out_dir, ignore_errors=True)
        staged = stage_in_tasks(kafka(), spec, out_dir, None)
        assert staged.rows == N, staged.rows

    def python_consumer_task():
        shutil.rmtree(out_dir, ignore_errors=True)
        from dataclasses import replace
        task_spec = replace(spec, staging=out_dir)
        res = ranges_df().mapInArrow(functools.partial(in_task, task_spec, bootstrap),
                                     RESULT_DDL).toArrow()
        rows = pc.sum(res.filter(pc.equal(res.column("kind"), "file")).column("rows"))
        assert rows.as_py() == N, rows

    def spark_source_count():
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
        rows = kafka().select("value").mapInArrow(count, "n long").collect()
        assert sum(r.n for r in rows) == N

    def python_consumer_count():
        rows = ranges_df().mapInArrow(functools.partial(count_in_task, bootstrap),
                                      "n long").collect()
        assert sum(r.n for r in rows) == N

    variants = {
        "spark-source+task": spark_source_task,
        "python-consumer+task": python_consumer_task,
        "spark-source count": spark_source_count,
        "python-consumer count": python_consumer_count,
    }
    alternate(variants, ROUNDS, N)
    spark.stop()
