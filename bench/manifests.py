"""What the manifest rollup saves: reading the bookkeeping of a Parquet table of 10 000
committed batches, before and after ``lakesink vacuum`` rolls it up.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/manifests.py [--batches 10000]

The table's bookkeeping is made directly (``--batches`` manifests of one run, each
naming one file of 1000 rows, as a real batch's manifest does), on local disk. Timed,
median of three: the listing a catalog's outbox does at start (every committed batch:
``lakesink.tables.manifests.committed``), reading every manifest (what ``status``,
``repair`` and ``compact`` do: ``manifests``), and ``lakesink status`` without Spark.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench.common import machine  # noqa: E402


def timed(fn, rounds: int = 3) -> float:  # noqa: ANN001
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=10_000)
    args = ap.parse_args()
    print(machine(), flush=True)

    from lakesink.config import load_config
    from lakesink.runtime.spark import build_spark_session
    from lakesink.status import status
    from lakesink.tables import manifests
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

    work = Path(tempfile.mkdtemp(prefix="lakesink-bench-manifests-"))
    run = "0a1b2c3d"
    folder = work / "lake" / ".lakesink" / "events" / "manifests" / run
    folder.mkdir(parents=True)
    for b in range(args.batches):
        (folder / f"{b:010d}.json").write_text(json.dumps({
            "batch_id": b, "app_id": "0a1b2c3d-bench", "rows": 1000,
            "committed_at": f"2026-11-29T00:00:{b % 60:02d}.000+00:00",
            "files": [{"path": f"location=oslo/part-{b:010d}-{run}-00000.parquet",
                       "bytes": 20000, "rows": 1000}], "written": 1000}, indent=1))
    spark = build_spark_session(master="local[2]", log_level="ERROR")
    layout = TableLayout.of(str(work / "lake"), "events")
    fs = HadoopFS(spark, layout.base)
    cfg = load_config(env={}, flags={"source.kafka.bootstrap_servers": "127.0.0.1:1",
                                     "source.kafka.topics": ["events"],
                                     "table.name": "events", "table.partition_by": [],
                                     "table.base_path": str(work / "lake")})
    cfg.source.kafka = None  # no lag: only the table's bookkeeping is read

    def measure() -> dict[str, float]:
        return {"files": len(list(folder.iterdir())),
                "list": timed(lambda: sum(1 for _ in manifests.committed(fs, layout))),
                "read_all": timed(lambda: sum(1 for _ in manifests.manifests(fs, layout))),
                "status": timed(lambda: status(cfg))}

    before = measure()
    started = time.perf_counter()
    rolled = manifests.roll_up(fs, layout)
    roll_s = time.perf_counter() - started
    after = measure()
    assert status(cfg)[0].batches == args.batches
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.batches} batches; roll-up of {rolled} manifests took {roll_s:.1f}s\n")
    print("| bookkeeping | files | list committed batches (outbox start) | read every "
          "manifest (repair, compact) | lakesink status |")
    print("|---|---|---|---|---|")
    for name, m in (("per-batch manifests", before), ("rolled up", after)):
        print(f"| {name} | {m['files']} | {m['list'] * 1000:.0f} ms | "
              f"{m['read_all'] * 1000:.0f} ms | {m['status'] * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
