"""Where the Arrow path's merge (``table.files_per_partition``) spends its time.

    .venv/bin/python bench/profile_merge.py [events]

One broker, one SparkSession; the bench's records and table (``bench/common.py``), run
with ``files_per_partition`` 1 (staged as Arrow IPC, merged per folder) and 0 (the
tasks' own Parquet files), twice each in turn. Prints, per run, the seconds spent in
the staging job (``stage_in_tasks``), in the merge (``merge_in_tasks``) and in the
whole batch function, summed over the batches.
"""
from __future__ import annotations

import functools
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LAKESINK_SCHEMA, PARTITION_BY, events  # noqa: E402
from lakesink.app import Pipeline  # noqa: E402
from lakesink.config import load_config  # noqa: E402
from lakesink.local.services import KafkaBroker, produce  # noqa: E402
from lakesink.pipeline import arrow_engine, arrow_merge  # noqa: E402
from lakesink.runtime.spark import build_spark_session  # noqa: E402

SPENT: dict[str, float] = {}


def timed(module: object, name: str) -> None:
    real = getattr(module, name)

    @functools.wraps(real)
    def wrapper(*args: object, **kwargs: object) -> object:
        started = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            SPENT[name] = SPENT.get(name, 0.0) + time.monotonic() - started

    setattr(module, name, wrapper)


timed(arrow_engine, "stage_in_tasks")
timed(arrow_merge, "merge_in_tasks")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
work = Path(tempfile.mkdtemp(prefix="profile-merge-"))
with KafkaBroker() as broker:
    broker.create_topic("sensors", partitions=4)
    produce(broker.bootstrap_servers, "sensors", list(events(n)))
    spark = build_spark_session(master="local[*]", log_level="ERROR")
    for run in range(4):
        setting = 1 - run % 2
        shutil.rmtree(work / "lake", ignore_errors=True)
        SPENT.clear()
        cfg = load_config(env={}, flags={
            "source.kafka.bootstrap_servers": broker.bootstrap_servers,
            "source.kafka.topics": ["sensors"], "source.kafka.max_offsets_per_trigger": 500_000,
            "decode.schema": LAKESINK_SCHEMA, "table.base_path": str(work / "lake"),
            "table.name": "sensors", "table.partition_by": PARTITION_BY,
            "table.timestamp_column": "ts_ms", "table.files_per_partition": setting})
        pipeline = Pipeline.build(cfg, spark)
        started = time.monotonic()
        query = pipeline.start(until_caught_up=True)
        query.awaitTermination()
        total = time.monotonic() - started
        pipeline.processor.close()
        print(f"files_per_partition {setting}: {total:.1f} s, batch function "
              f"{pipeline.stats.seconds:.1f} s, "
              + ", ".join(f"{k} {v:.2f} s" for k, v in SPENT.items()), flush=True)
shutil.rmtree(work, ignore_errors=True)
