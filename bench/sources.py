"""Sources side by side on the same events: Kafka (Spark's connector) vs Redis streams,
Redis lists and Danube topics (lakesink's Python data sources), each into a fresh
Parquet table.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/sources.py [--events 500000]
        [--keys 4] [--rounds 3] [--batch 100000] [--danube]

One Kafka topic of ``--keys`` partitions, ``--keys`` Redis streams and ``--keys`` Redis
lists hold the same events (split by sensor, as Kafka's key partitioner does); one
SparkSession; each run reads everything with ``until_caught_up`` into a fresh lake and
is checked by DuckDB (rows and distinct ids). Lists are consumed by reading, so they are
refilled (untimed) before each of their runs. Round 0 warms up; the table shows the
median of the warm rounds. Prints a markdown table (paste it into bench/results/).

``--danube`` adds a Danube topic of ``--keys`` partitions holding the same events, served
by the tests' protocol double (``tests/fixtures/danube_broker.py``, a Python gRPC server
in a process of its own, counted as the broker: no Danube broker can run here). Danube's
reliable dispatch sends one message per partition and waits for its ack, so this
measures that round trip plus lakesink's spool (one fsync per group of messages) more
than Spark. A subscription has no end offset: ``until_caught_up`` takes what was spooled
once the topic was quiet for ``idle_s`` (at most ten times that), so the run is repeated
from its checkpoint until the table holds every event, all of it timed. Each round reads
a topic of its own (the double publishes one copy per round before the first).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LAKESINK_SCHEMA, PARTITION_BY, alternate, events, machine, read_back
from lakesink.local.redisserver import RedisServer
from lakesink.local.services import KafkaBroker, produce


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=500_000)
    ap.add_argument("--keys", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100_000, help="records per trigger")
    ap.add_argument("--danube", action="store_true", help="add Danube (protocol double)")
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

        def ingest(source: dict[str, object], *, runs_at_most: int = 1) -> None:
            lake = work / f"lake{next(runs)}"
            cfg = load_config(env={}, flags={
                **source, "decode.schema": LAKESINK_SCHEMA, "table.name": "events",
                "table.base_path": str(lake), "table.partition_by": PARTITION_BY,
                "table.timestamp_column": "ts_ms"})
            for _ in range(runs_at_most):
                Pipeline.build(cfg, spark).run(until_caught_up=True)
                rows, distinct = read_back(lake / "events", "parquet")
                if rows >= args.events:
                    break
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
        if args.danube:
            double = start_danube(work, data, args.keys, args.rounds)
            danube_rounds = iter(range(args.rounds))
            variants["danube"] = lambda: ingest({
                "source.danube.service_url": danube_url,
                "source.danube.topics": [f"/bench/events-{next(danube_rounds)}"],
                "source.danube.subscription": "lakesink",
                "source.danube.max_records_per_trigger": args.batch}, runs_at_most=100)
            assert double.stdout is not None
            danube_url = double.stdout.readline().strip()
        try:
            alternate(variants, args.rounds, args.events,
                      prepare={"redis-lists": fill_lists})
        finally:
            if args.danube:
                double.communicate(b"")
        spark.stop()
    shutil.rmtree(work, ignore_errors=True)


def start_danube(work: Path, data: list[tuple[bytes, bytes]], partitions: int,
                 rounds: int) -> subprocess.Popen[bytes]:
    """The Danube protocol double in its own process, one topic per round published."""
    payloads = work / "danube-payloads"
    payloads.write_bytes(b"\n".join(v for _, v in data))
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "tests.fixtures.danube_broker", "--payloads", str(payloads),
           "--partitions", str(partitions)]
    for r in range(rounds):
        cmd += ["--topic", f"/bench/events-{r}"]
    return subprocess.Popen(cmd, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": f"{root / 'src'}:{root}"})


if __name__ == "__main__":
    main()
