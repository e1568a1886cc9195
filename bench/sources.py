"""Sources side by side on the same events: Kafka (Spark's connector) vs Redis streams
and Redis lists (lakesink's Python data sources), each into a fresh Parquet table.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/sources.py [--events 500000]
        [--keys 4] [--rounds 3] [--batch 100000]

One Kafka topic of ``--keys`` partitions, ``--keys`` Redis streams and ``--keys`` Redis
lists hold the same events (split by sensor, as Kafka's key partitioner does); one
SparkSession; each run reads everything with ``until_caught_up`` into a fresh lake and
is checked by DuckDB (rows and distinct ids). Lists are consumed by reading, so they are
refilled (untimed) before each of their runs. Round 0 warms up; the table shows the
median of the warm rounds. Prints a markdown table (paste it into bench/results/).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LAKESINK_SCHEMA, PARTITION_BY, alternate, events, machine, read_back
from lakesink.runtime.redisserver import RedisServer
from lakesink.runtime.services import KafkaBroker, produce


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=500_000)
    ap.add_argument("--keys", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100_000, help="records per trigger")
    args = ap.parse_args()
    print(machine(), flush=True)

    from lakesink.app import Pipeline
    from lakesink.config import load_config
    from lakesink.runtime.spark import build_spark_session

    data = list(events(args.events))
    shards: list[list[bytes]] = [[] for _ in range(args.keys)]
    for key, value in data:
        shards[zlib.crc32(key) % args.keys].append(value)
    work = Path(tempfile.mkdtemp(prefix="lakesink-bench-sources-"))
    streams = [f"s{i}" for i in range(args.keys)]
    lists = [f"l{i}" for i in range(args.keys)]
    with KafkaBroker() as broker, RedisServer() as redis:
        broker.create_topic("events", partitions=args.keys)
        produce(broker.bootstrap_servers, "events", data)
        client = redis.client()
        for name, values in zip(streams, shards, strict=True):
            pipe = client.pipeline(transaction=False)
            for v in values:
                pipe.xadd(name, {"data": v})
            pipe.execute()

        def fill_lists() -> None:
            client.delete(*lists)
            for name, values in zip(lists, shards, strict=True):
                for i in range(0, len(values), 10_000):
                    client.rpush(name, *values[i:i + 10_000])

        spark = build_spark_session(master="local[*]", log_level="ERROR")
        runs = iter(range(1_000_000))

        def ingest(source: dict[str, object]) -> None:
            lake = work / f"lake{next(runs)}"
            cfg = load_config(env={}, flags={
                **source, "decode.schema": LAKESINK_SCHEMA, "table.name": "events",
                "table.base_path": str(lake), "table.partition_by": PARTITION_BY,
                "table.timestamp_column": "ts_ms"})
            Pipeline.build(cfg, spark).run(until_caught_up=True)
            rows, distinct = read_back(lake / "events", "parquet")
            assert rows == distinct == args.events, (source, rows, distinct)
            shutil.rmtree(lake, ignore_errors=True)

        variants = {
            "kafka": lambda: ingest({
                "source.kafka.bootstrap_servers": broker.bootstrap_servers,
                "source.kafka.topics": ["events"],
                "source.kafka.max_offsets_per_trigger": args.batch}),
            "redis-streams": lambda: ingest({
                "source.redis.port": redis.port, "source.redis.streams": streams,
                "source.redis.max_records_per_trigger": args.batch}),
            "redis-lists": lambda: ingest({
                "source.redis.port": redis.port, "source.redis.lists": lists,
                "source.redis.max_records_per_trigger": args.batch}),
        }
        alternate(variants, args.rounds, args.events, prepare={"redis-lists": fill_lists})
        spark.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
