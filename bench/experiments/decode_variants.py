"""Ad-hoc experiment: what lakesink's decode path costs on cached rows, next to the
hand-written job's ``from_json``, without Kafka; a ``noop`` sink (or, with ``+w``, a
partitioned Parquet write). Prints wall and JVM CPU seconds per variant and round.

Variants: ``hand`` (``from_json`` + ``e.*`` + year/month/day); ``full`` (lakesink's
marked frame, observed, good rows), with suffixes ``-noobs`` (no observation on the
frame), ``-noextra`` (no unknown-key detection), ``-split`` (colons counted with Spark's
``split`` instead of lakesink's Java counter), ``-shuffle`` (the repartition by partition
columns), ``+w`` (write Parquet instead of ``noop``).

    .venv/bin/python bench/experiments/decode_variants.py 500000 hand,full,full-split 4
"""
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa  # noqa: E402
from pyspark.sql import Observation  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import lakesink.decode.json as json_mod  # noqa: E402
import lakesink.sources.kafka as kafka_mod  # noqa: E402
from bench.common import LAKESINK_SCHEMA, PARTITION_BY, SPARK_DDL, events  # noqa: E402
from bench.profile_variants import _cpu_s  # noqa: E402
from lakesink.app import Pipeline  # noqa: E402
from lakesink.config import load_config  # noqa: E402
from lakesink.runtime.spark import build_spark_session  # noqa: E402


def main() -> None:
    n, variants, rounds = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
    work = Path(tempfile.mkdtemp(prefix="lakesink-decode-"))
    spark = build_spark_session(master="local[*]", log_level="ERROR", conf={})
    kafka_mod.check_reachable = lambda cfg: None  # no broker: the rows are cached below
    cfg = load_config(env={}, flags={
        "source.kafka.bootstrap_servers": "127.0.0.1:1", "source.kafka.topics": ["p"],
        "decode.schema": LAKESINK_SCHEMA, "table.base_path": str(work / "lake"),
        "table.partition_by": PARTITION_BY, "table.timestamp_column": "ts_ms"})
    proc = Pipeline.build(cfg, spark).processor
    values = [v for _, v in events(n)]
    table = pa.table({
        "key": pa.array([None] * n, pa.binary()), "value": pa.array(values, pa.binary()),
        "topic": ["p"] * n, "partition": pa.array([i % 4 for i in range(n)], pa.int32()),
        "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array([0] * n, pa.int32())})
    raw = spark.createDataFrame(table.to_pandas()).repartition(4).cache()
    raw.count()
    unknown_keys = json_mod.JsonDecoder.unknown_keys

    def build(variant: str):  # noqa: ANN202
        if variant.startswith("hand"):
            ts = F.timestamp_millis(F.col("e.ts_ms"))
            return (raw.select(F.from_json(F.col("value").cast("string"), SPARK_DDL).alias("e"))
                    .select("e.*", F.year(ts).alias("year"), F.month(ts).alias("month"),
                            F.dayofmonth(ts).alias("day")))
        json_mod.JsonDecoder.unknown_keys = (
            (lambda self, v, p=None: F.array().cast("array<string>"))
            if "-noextra" in variant else unknown_keys)
        marker = proc.marker
        marker.use(marker.schema)  # rebuild the expressions with this variant's pieces
        marker.decoder.count_colons = "-split" not in variant
        marked = marker.mark(raw)
        if "-noobs" not in variant:
            marked = marked.observe(Observation(f"o{time.monotonic_ns()}"),
                                    *marker.aggregates())
        good = marker.good(marked)
        return proc.writer.shuffled(good) if "-shuffle" in variant else good

    for _ in range(rounds):
        for variant in variants:
            df = build(variant)
            cpu, started = _cpu_s(spark), time.perf_counter()
            if variant.endswith("+w"):
                (df.write.mode("overwrite").options(**proc.writer.write_options())
                 .partitionBy(*PARTITION_BY).parquet(str(work / variant)))
            else:
                df.write.format("noop").mode("overwrite").save()
            print(f"{variant:24s} wall {time.perf_counter() - started:5.2f} s  "
                  f"JVM CPU {_cpu_s(spark) - cpu:5.2f} s", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
