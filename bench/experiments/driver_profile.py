"""Ad-hoc experiment: where lakesink's batch function spends driver time.

Runs the real streaming pipeline (local broker, the benchmark's events) twice in one
process with cProfile around ``BatchFunction.__call__`` (which runs on py4j's callback
thread, so a process-wide profiler would miss it); prints each batch's seconds, Spark's
progress durations and the profile of the second (warm) run.

    .venv/bin/python bench/experiments/driver_profile.py 400000 50000 parquet
"""
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import LAKESINK_SCHEMA, PARTITION_BY, events  # noqa: E402
from lakesink.app import Pipeline  # noqa: E402
from lakesink.config import load_config  # noqa: E402
from lakesink.pipeline.batch import BatchFunction  # noqa: E402
from lakesink.local.services import KafkaBroker, produce  # noqa: E402
from lakesink.runtime.spark import build_spark_session  # noqa: E402


def main() -> None:
    n, batch, fmt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    state = {"prof": cProfile.Profile(), "times": []}
    original = BatchFunction.__call__

    def profiled(self, df, batch_id):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        state["prof"].enable()
        try:
            return original(self, df, batch_id)
        finally:
            state["prof"].disable()
            state["times"].append(time.perf_counter() - started)

    BatchFunction.__call__ = profiled
    spark = build_spark_session(master="local[*]", log_level="ERROR", conf={})
    work = Path(tempfile.mkdtemp(prefix="lakesink-driver-"))
    with KafkaBroker() as broker:
        broker.create_topic("p", partitions=4)
        produce(broker.bootstrap_servers, "p", events(n))
        for run in range(2):  # the first run warms the JVM up
            state["prof"], state["times"] = cProfile.Profile(), []
            cfg = load_config(env={}, flags={
                "source.kafka.bootstrap_servers": broker.bootstrap_servers,
                "source.kafka.topics": ["p"], "source.kafka.max_offsets_per_trigger": batch,
                "decode.schema": LAKESINK_SCHEMA, "table.base_path": str(work / f"l{run}"),
                "table.partition_by": PARTITION_BY, "table.timestamp_column": "ts_ms",
                "table.format": fmt})
            started = time.perf_counter()
            query = Pipeline.build(cfg, spark).start(until_caught_up=True)
            query.awaitTermination()
            print(f"run {run}: {time.perf_counter() - started:.2f} s; batch function seconds",
                  [round(t, 2) for t in state["times"]])
            for p in query.recentProgress:
                print("   ", p["numInputRows"], p["durationMs"])
    spark.stop()
    pstats.Stats(state["prof"]).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
