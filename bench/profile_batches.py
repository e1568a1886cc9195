"""Where a micro-batch's time goes: wall time per phase of lakesink's batch function.

    .venv/bin/python bench/profile_batches.py [--format parquet|delta] [--events 20000]
        [--batch 2000]

Runs the real pipeline in-process on a local broker with small batches (the latency
regime: the fixed cost per batch is what matters there) and wraps the phases — the
committed check, the counting pass, the table write (and its parts), the Delta
metrics query — with timers. Prints the mean per batch for each phase.
"""

from __future__ import annotations

import argparse
import collections
import functools
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LAKESINK_SCHEMA, PARTITION_BY, events  # noqa: E402
from lakesink.config import load_config  # noqa: E402
from lakesink.local.services import KafkaBroker, produce  # noqa: E402

TIMES: dict[str, list[float]] = collections.defaultdict(list)


def timed(obj: object, name: str, label: str | None = None) -> None:
    fn = getattr(obj, name)

    @functools.wraps(fn)
    def wrapper(*a, **k):  # noqa: ANN002, ANN003, ANN202
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TIMES[label or name].append(time.perf_counter() - t)

    setattr(obj, name, wrapper)


def _cpu(broker: KafkaBroker) -> dict[str, float]:
    """CPU seconds (user + system) so far: this process (the driver's Python), the
    Spark JVM, its Python workers, the broker."""
    import psutil

    def secs(p: psutil.Process) -> float:
        t = p.cpu_times()
        return t.user + t.system

    me = psutil.Process()
    out = {"driver python": secs(me), "python workers": 0.0}
    for child in me.children(recursive=True):
        try:
            name = "spark jvm" if child.name() == "java" else "python workers"
            out[name] = out.get(name, 0.0) + secs(child) + (
                child.cpu_times().children_user + child.cpu_times().children_system)
        except psutil.NoSuchProcess:
            pass
    if broker.process is not None:
        b = psutil.Process(broker.process.pid)
        out["broker"] = secs(b) + sum(secs(c) for c in b.children(recursive=True))
    return out


def _jvm_threads(skip: int = -1) -> list[tuple[str, float]]:
    """The Spark JVM's CPU seconds per thread name (digits dropped), most first."""
    import os
    import re

    import psutil

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = collections.defaultdict(float)
    for child in psutil.Process().children(recursive=True):
        if child.name() != "java" or child.pid == skip:
            continue
        for task in Path(f"/proc/{child.pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1: stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[re.sub(r"[\d#]+", "", name).strip()] += (int(fields[11]) + int(fields[12])) / tick
    return sorted(out.items(), key=lambda kv: -kv[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", default="parquet")
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=2_000)
    args = ap.parse_args()

    from lakesink.app import Pipeline
    from lakesink.pipeline import arrow_engine as arrow_engine_mod
    from lakesink.pipeline import batch as batch_mod
    from lakesink.pipeline import evolver as evolver_mod
    from lakesink.pipeline import marker as marker_mod
    from lakesink.runtime.spark import build_spark_session
    from lakesink.tables import delta, fs, parquet

    work = Path(tempfile.mkdtemp(prefix="lakesink-prof-"))
    with KafkaBroker() as broker:
        broker.create_topic("p", partitions=4)
        produce(broker.bootstrap_servers, "p", events(args.events))
        spark = build_spark_session(master="local[*]", log_level="ERROR")
        cfg = load_config(env={}, flags={
            "source.kafka.bootstrap_servers": broker.bootstrap_servers,
            "source.kafka.topics": ["p"], "source.kafka.max_offsets_per_trigger": args.batch,
            "decode.schema": LAKESINK_SCHEMA, "table.base_path": str(work / "lake"),
            "table.format": args.format, "table.partition_by": PARTITION_BY,
            "table.timestamp_column": "ts_ms"})
        timed(batch_mod.BatchFunction, "__call__", "batch.__call__")
        for name in ("count", "observed", "mark"):
            timed(marker_mod.Marker, name, f"marker.{name}")
        timed(evolver_mod.SchemaEvolver, "unknown_names", "evolver.unknown_names")
        W = delta.DeltaTableWriter if args.format == "delta" else parquet.ParquetTableWriter
        for name in ("is_committed", "write_batch", "begin", "skip_committed",
                     "commit_staged", "commit_files", "named", "ensure_table",
                     "files_refusal", "lacks_columns"):
            if hasattr(W, name):
                timed(W, name, f"writer.{name}")
        timed(arrow_engine_mod, "stage_in_tasks", "arrow.stage_in_tasks")
        if args.format == "delta":
            for name in ("_commit_metrics", "committed_version", "_snapshot"):
                timed(W, name, f"delta.{name}")
        for name in ("exists", "list_files", "write_json", "replace", "delete", "read_json"):
            timed(fs.HadoopFS, name, f"fs.{name}")
        pipeline = Pipeline.build(cfg, spark)
        before = _cpu(broker)
        skip = broker.process.pid if broker.process else -1
        threads0 = dict(_jvm_threads(skip))
        import threading

        series: list[str] = []
        done = threading.Event()

        def sample() -> None:
            last = dict(_jvm_threads(skip))
            while not done.wait(2.0):
                now = dict(_jvm_threads(skip))
                series.append("/".join(f"{now.get(k, 0) - last.get(k, 0):.1f}" for k in (
                    "C CompilerThre", "Executor task i")))
                last = now

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t = time.perf_counter()
        stats = pipeline.run(until_caught_up=True)
        done.set()
        total = time.perf_counter() - t
        used = {k: v - before.get(k, 0.0) for k, v in _cpu(broker).items()}
        threads = [(k, v - threads0.get(k, 0.0)) for k, v in _jvm_threads(skip)]
        threads.sort(key=lambda kv: -kv[1])
        spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    batches = max(1, stats.batches)
    print(f"{args.format}: {stats.written} rows, {batches} batches, {total:.1f} s total, "
          f"{total / batches:.2f} s per batch (query start included)")
    print("CPU seconds during the run: " + ", ".join(
        f"{k} {v:.1f}" for k, v in sorted(used.items(), key=lambda kv: -kv[1])))
    print("Spark JVM threads by name, CPU seconds during the run: " + ", ".join(
        f"{k} {v:.1f}" for k, v in threads[:12]))
    print("per 2 s, JIT/executor CPU s: " + " ".join(series))
    print("| phase | calls | total s | per batch s |\n|---|---|---|---|")
    for label, values in sorted(TIMES.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {label} | {len(values)} | {sum(values):.2f} | {sum(values) / batches:.3f} |")


if __name__ == "__main__":
    main()
