"""kafka-delta-ingest (the Rust peer) as a benchmark case.

Runs the binary given by ``--bin`` (bench/run.py: ``--kdi-bin`` or ``KDI_BIN``) on the
topic into a Delta table partitioned like lakesink-delta's: ``location`` and
``year/month/day`` of ``ts_ms``, derived by kafka-delta-ingest's own transforms (its
jmespath functions ``epoch_millis_to_iso8601`` and ``substr``). The table is created
first (kafka-delta-ingest writes to an existing table only); its offsets go into the
table's ``txn`` actions, as it does by default.

Prints ``READY`` once its consumer has its partitions and ``PROGRESS <rows>`` per Delta
version it commits (the ``numRecords`` of the version's files): the same progress lines
as the other cases. With ``--count N`` it is stopped once its commits hold N rows (its
own ``--ends_at_latest_offsets`` never ends here: it compares each message's offset with
the partition's high watermark, which is one past the last message). SIGTERM is passed
on to it.

Consumer setting: ``fetch.wait.max.ms=5``. With librdkafka's default (500 ms) version
0.4.0 read about 40 events/s from this broker with its CPU idle (its run loop makes a
new message stream for every message and waits for the next fetch); what a user would
tune first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import PARTITION_BY, SCHEMA  # noqa: E402

ARROW = {"Int64": "int64", "Utf8": "string", "Float64": "float64"}
#: partition columns kafka-delta-ingest derives from ts_ms (an ISO 8601 text: 2026-11-18T…)
TRANSFORMS = {"year": "substr(epoch_millis_to_iso8601(ts_ms), `0`, `4`)",
              "month": "substr(epoch_millis_to_iso8601(ts_ms), `5`, `2`)",
              "day": "substr(epoch_millis_to_iso8601(ts_ms), `8`, `2`)"}
VERSION_LINE = re.compile(r"Delta version (\d+) completed")
READY_LINE = re.compile(r"POST_REBALANCE - Assign|Seeking consumer")


def create_table(table: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    fields = [pa.field(n, getattr(pa, ARROW[a])()) for n, a, _ in SCHEMA]
    fields += [pa.field(p, pa.string()) for p in PARTITION_BY if p in TRANSFORMS]
    schema = pa.schema(fields)
    write_deltalake(str(table), schema.empty_table(), partition_by=PARTITION_BY, mode="error")


def version_rows(table: Path, version: int) -> int:
    rows = 0
    for line in (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines():
        add = json.loads(line).get("add")
        if add and add.get("stats"):
            rows += int(json.loads(add["stats"]).get("numRecords", 0))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--table", required=True, type=Path)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--count", type=int, default=0, help="stop once this many rows are in")
    ap.add_argument("--allowed-latency", default="1")
    ap.add_argument("--max-messages", default="200000")
    args = ap.parse_args()

    create_table(args.table)
    cmd = [args.bin, "ingest", args.topic, str(args.table), "--kafka", args.bootstrap,
           "--consumer_group", f"bench-kdi-{os.getpid()}", "--app_id", "bench-kdi",
           "--auto_offset_reset", "earliest", "--allowed_latency", args.allowed_latency,
           "--max_messages_per_batch", args.max_messages,
           "--kafka_setting", "fetch.wait.max.ms=5"]
    for name, expr in TRANSFORMS.items():
        cmd += ["--transform", f"{name}: {expr}"]
    env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    ready = False
    done = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Latency timer expired" not in line:  # said every second when idle
            sys.stdout.write(line)
        if not ready and READY_LINE.search(line):
            ready = True
            print("READY", flush=True)
        m = VERSION_LINE.search(line)
        if m:
            rows = version_rows(args.table, int(m.group(1)))
            done += rows
            print("PROGRESS", rows, flush=True)
            if args.count and done >= args.count:  # every row committed: stop it
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                return 0
    return proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
