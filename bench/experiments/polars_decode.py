"""Ad-hoc experiment: what polars' NDJSON reader instead of ``pyarrow.json`` would save
on the real task (Spark's Kafka source → ``mapInArrow`` → lakesink's ``run_task``:
decode, certify, partition, write Parquet). Only the parse of a block changes
(``arrow_task._parse``); polars is not strict the way the Arrow path needs (it drops
unknown keys, and narrow integer types panic in polars 2.1, so they are read as Int64
and cast), so this measures the ceiling of the swap, not a safe decoder. Batch reads
of one topic with 4 partitions, one SparkSession, the variants alternating per round
(the first round warms the JVM). CPU seconds: Spark JVM, Python workers, broker.

    .venv/bin/python bench/experiments/polars_decode.py 3000000 [ROUNDS]
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


def polars_parse(values, start, stop, options):
    """``arrow_task._parse`` with polars: the block's records joined by newlines."""
    import io

    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc

    piece = values.slice(start, stop - start)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(piece)], pa.int32()),
                                                     piece), b"\n")
    schema = options.explicit_schema
    wide = {f.name: (pl.Int64 if pa.types.is_integer(f.type) else
                     pl.Float64 if pa.types.is_floating(f.type) else
                     pl.Boolean if pa.types.is_boolean(f.type) else pl.String)
            for f in schema}
    try:
        frame = pl.read_ndjson(io.BytesIO(joined[0].as_buffer()), schema=wide)
    except Exception:  # noqa: BLE001 - any failure: the range is bisected, as with pyarrow
        return None
    return frame.to_arrow().cast(schema)


def in_task(spec, use_polars, batches):
    from pyspark import TaskContext

    from lakesink.pipeline import arrow_task

    if not hasattr(arrow_task, "_pyarrow_parse"):
        arrow_task._pyarrow_parse = arrow_task._parse
    arrow_task._parse = polars_parse if use_polars else arrow_task._pyarrow_parse
    if use_polars:
        import polars as pl
        pl.thread_pool_size()  # one pool per worker process; POLARS_MAX_THREADS=1 below
    ctx = TaskContext.get()
    yield from arrow_task.run_task(spec, batches, ctx.partitionId(), ctx.taskAttemptId())


if __name__ == "__main__":
    os.environ["POLARS_MAX_THREADS"] = "1"  # two tasks share two cores (inherited by workers)
    import functools
    import shutil
    import tempfile
    from dataclasses import replace

    import pyarrow.compute as pc

    from bench.common import PARTITION_BY, SCHEMA
    from lakesink.pipeline.arrow_path import RAW_COLUMNS
    from lakesink.pipeline.arrow_task import RESULT_DDL, TaskSpec

    with KafkaBroker() as broker:
        broker.create_topic(TOPIC, partitions=4)
        produce(broker.bootstrap_servers, TOPIC, events(N))
        spark = build_spark_session(master="local[*]", log_level="ERROR")
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
        out_dir = tempfile.mkdtemp(prefix="polars-decode-")
        spec = replace(TaskSpec(fields=tuple((n, d, True) for n, _, d in SCHEMA),
                                partition_by=tuple(PARTITION_BY), timestamp_column="ts_ms",
                                derived=("year", "month", "day"), filesystem=("local", {})),
                       staging=out_dir)

        def variant(use_polars):
            def run():
                shutil.rmtree(out_dir, ignore_errors=True)
                df = (spark.read.format("kafka")
                      .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                      .option("subscribe", TOPIC).option("startingOffsets", "earliest")
                      .load().select(*RAW_COLUMNS))
                res = df.mapInArrow(functools.partial(in_task, spec, use_polars),
                                    RESULT_DDL).toArrow()
                rows = pc.sum(res.filter(pc.equal(res.column("kind"), "file")).column("rows"))
                assert rows.as_py() == N, rows
            return run

        variants = {"pyarrow.json": variant(False), "polars": variant(True)}
        alternate(variants, ROUNDS, N)
        spark.stop()
