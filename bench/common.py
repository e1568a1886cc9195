"""Shared pieces of the benchmark: the dataset, the machine, process-tree RSS, readers."""

from __future__ import annotations

import json
import os
import platform
import random
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

LOCATIONS = ["berlin", "lisbon", "oslo", "madrid", "warsaw", "dublin"]
KINDS = {"temperature": ("C", 21.0, 6.0), "humidity": ("%", 55.0, 15.0),
         "pressure": ("hPa", 1013.0, 8.0), "co2": ("ppm", 600.0, 150.0)}
START_MS = 1_795_000_000_000
DAYS = 5
PARTITION_BY = ["location", "year", "month", "day"]

# the declared schema, as lakesink config (Arrow names) and as Spark DDL
SCHEMA = [
    ("event_id", "Int64", "bigint"), ("sensor_id", "Utf8", "string"),
    ("location", "Utf8", "string"), ("site", "Utf8", "string"),
    ("sensor_type", "Utf8", "string"), ("ts_ms", "Int64", "bigint"),
    ("value", "Float64", "double"), ("unit", "Utf8", "string"),
    ("battery", "Float64", "double"), ("rssi", "Int64", "bigint"),
    ("lat", "Float64", "double"), ("lon", "Float64", "double"),
    ("status", "Utf8", "string"), ("firmware", "Utf8", "string"),
    ("seq", "Int64", "bigint"), ("gateway", "Utf8", "string"),
]
LAKESINK_SCHEMA = [{"name": n, "type": a} for n, a, _ in SCHEMA]
SPARK_DDL = ", ".join(f"{n} {d}" for n, _, d in SCHEMA)


def events(n: int, *, start_id: int = 0, seed: int = 11, now_ms: bool = False
           ) -> Iterator[tuple[bytes, bytes]]:
    """``n`` JSON sensor events of about 300 bytes, ids ``start_id…``, over ``DAYS`` days
    (or stamped with the current time when ``now_ms``, for latency runs)."""
    rng = random.Random(seed + start_id)
    span = DAYS * 24 * 3600 * 1000
    for i in range(start_id, start_id + n):
        kind = rng.choice(list(KINDS))
        unit, mean, sd = KINDS[kind]
        sensor = f"{kind[:3]}-{rng.randrange(500):04d}"
        loc = LOCATIONS[zlib.crc32(sensor.encode()) % len(LOCATIONS)]
        event = {
            "event_id": i, "sensor_id": sensor, "location": loc,
            "site": f"{loc}-site-{rng.randrange(20):02d}", "sensor_type": kind,
            "ts_ms": int(time.time() * 1000) if now_ms else START_MS + (i * span) // max(n, 1),
            "value": round(rng.gauss(mean, sd), 3), "unit": unit,
            "battery": round(rng.uniform(0.05, 1.0), 3), "rssi": -rng.randrange(30, 110),
            "lat": round(rng.uniform(36, 60), 5), "lon": round(rng.uniform(-9, 21), 5),
            "status": rng.choice(["ok", "ok", "ok", "degraded", "maintenance"]),
            "firmware": f"v{rng.randrange(1, 4)}.{rng.randrange(10)}.{rng.randrange(30)}",
            "seq": rng.randrange(1 << 40), "gateway": f"gw-{rng.randrange(64):03d}.{loc}.example.net",
        }
        yield sensor.encode(), json.dumps(event, separators=(",", ":")).encode()


def machine() -> dict[str, object]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), platform.processor())
    mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
    import duckdb
    import pyarrow
    import pyspark

    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1),
            "os": platform.platform(), "python": platform.python_version(),
            "pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__,
            "duckdb": duckdb.__version__}


class TreeRSS:
    """Samples the summed RSS of a process and all its descendants; keeps the peak. Also
    the tree's CPU seconds (user + system): each process's own, as last sampled, summed
    (a process's last ``interval`` before it exits is not seen: a lower bound by at
    most ``interval`` per process; the cases' processes live for the whole run)."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        #: the processes at the peak: "java" / "python" / … -> summed RSS bytes
        self.breakdown: dict[str, int] = {}
        #: pid -> its CPU seconds when last sampled
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            names: dict[int, str] = {}  # each process's name, read once per sample
            jvm_cmdlines = {}
            for p in procs:
                try:
                    names[p.pid] = p.name()
                    if names[p.pid] == "java":
                        jvm_cmdlines[p.pid] = p.cmdline()
                    t = p.cpu_times()
                    self.cpu[p.pid] = t.user + t.system
                except psutil.NoSuchProcess:
                    pass
            total = 0
            parts: dict[str, int] = {}
            for p in procs:
                if p.pid not in names:
                    continue  # gone already
                try:
                    if (p.ppid() in jvm_cmdlines and names[p.pid] != "java"
                            and p.cmdline() == jvm_cmdlines[p.ppid()]):
                        # A JVM forks only to run a tool (Hadoop's Shell: readlink,
                        # chmod…); until the child execs it shares the JVM's pages
                        # (posix_spawn's vfork), and counting them again doubled the
                        # peak: 2.3 GiB "peaks" of a 1.1 GiB JVM, 2026-11-26.
                        continue
                    rss = p.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
                total += rss
                parts[names[p.pid]] = parts.get(names[p.pid], 0) + rss
            if total > self.peak:
                self.peak, self.breakdown = total, parts
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=2)
        return self.peak

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process so far (0: gone)."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return t.user + t.system


def cpu_by_process() -> dict[str, float]:
    """CPU seconds so far of this process's children: the Spark JVM (``jvm``), its Python
    workers (``py``) and a Kafka broker, redis-server or Danube double started by this
    process (``broker``)."""
    import psutil

    out = {"jvm": 0.0, "py": 0.0, "broker": 0.0}
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            if child.name() == "java":
                kind = "broker" if "kafka.Kafka" in " ".join(child.cmdline()) else "jvm"
            elif child.name().startswith("redis-server") or (
                    "tests.fixtures.danube_broker" in child.cmdline()):
                kind = "broker"
            else:
                kind = "py"
            out[kind] += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def alternate(variants: dict[str, object], rounds: int, n: int,
              prepare: dict[str, object] | None = None) -> None:
    """Run each variant (a function of no arguments) once per round, alternating (round
    0 warms the JVM), print each run's seconds and CPU (:func:`cpu_by_process`), then a
    table of the warm rounds' median per variant, per ``n`` records. ``ONLY=a,b`` in the
    environment keeps those variants. ``prepare[name]``, if given, runs untimed before
    each run of that variant."""
    only = os.environ.get("ONLY")
    if only:
        variants = {k: v for k, v in variants.items() if k in only.split(",")}
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {k: [] for k in variants}
    for r in range(rounds):
        for name, fn in variants.items():
            if prepare and name in prepare:
                prepare[name]()  # type: ignore[operator]
            before = cpu_by_process()
            t = time.perf_counter()
            fn()  # type: ignore[operator]
            took = time.perf_counter() - t
            used = {k: v - before[k] for k, v in cpu_by_process().items()}
            runs[name].append((took, used))
            print(f"round {r} {name:24s} {took:6.2f}s  cpu jvm {used['jvm']:5.1f}  py "
                  f"{used['py']:5.1f}  broker {used['broker']:5.1f}", flush=True)
    print(f"\n{n:,} records, warm rounds (median)\n")
    print("| variant | seconds | records/s | CPU-s per 1 M: Spark JVM | Python | broker |")
    print("|---|---|---|---|---|---|")
    for name, results in runs.items():
        warm = sorted(results[1:] or results, key=lambda x: x[0])
        took, used = warm[len(warm) // 2]
        per = {k: v / n * 1e6 for k, v in used.items()}
        print(f"| {name} | {took:.2f} | {n / took:,.0f} | {per['jvm']:.2f} | {per['py']:.2f} "
              f"| {per['broker']:.2f} |")


def parquet_files(table: Path) -> list[Path]:
    """Data files of a table folder (no Delta log, no Spark metadata, no hidden files)."""
    return [p for p in table.rglob("*.parquet")
            if not any(part.startswith(("_", ".")) for part in p.relative_to(table).parts)]


def read_back(table: Path, fmt: str) -> tuple[int, int]:
    """(rows, distinct event ids) as an independent reader sees the output."""
    if fmt == "delta":
        from deltalake import DeltaTable

        ids = DeltaTable(str(table)).to_pyarrow_table(columns=["event_id"]).column("event_id")
        return len(ids), len(set(ids.to_pylist()))
    import duckdb

    files = [str(p) for p in parquet_files(table)]
    if not files:
        return 0, 0
    row = duckdb.sql(f"SELECT count(*), count(DISTINCT event_id) FROM read_parquet({files!r}, "
                     "union_by_name=true)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=1))
