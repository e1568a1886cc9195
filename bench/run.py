"""The benchmark: lakesink against a hand-written Spark job, the Quix sink and pyarrow.

One command, one run, everything on this machine:

    .venv/bin/python bench/run.py [--events 5000000] [--partitions 4]
        [--cases lakesink-parquet,lakesink-parquet-spark,lakesink-delta,lakesink-delta-spark,
                 spark-handwritten,
                 spark-kafka-floor,quix,pyarrow] [--repeat 3]
        [--latency-rate 2000 --latency-seconds 40]

1. starts the local Kafka broker (KRaft, from the jars) and produces ``--events`` JSON
   sensor events of ~300 bytes over 5 days into ``--partitions`` partitions, and writes
   the same value bytes to an NDJSON file for the pyarrow bound;
2. throughput: runs each case as its own process on the whole topic until caught up,
   sampling the summed RSS of its process tree (JVM and Python workers included) and
   stamping its progress lines; checks every output's rows and distinct ids with an
   independent reader (DuckDB for Parquet, delta-rs for Delta) — a wrong count voids the
   row;
3. latency: for each streaming case, a fresh topic fed at ``--latency-rate`` events/s
   for ``--latency-seconds``, each event stamped with its produce time; a poller reads
   every file as soon as a reader can see it (Parquet: listed in the folder; Delta:
   added by a log entry) and records produce -> visible per event;
4. prints a markdown table and writes it with the raw JSON to ``bench/results/``.

The Quix case runs in ``bench/.venv-quix`` (quixstreams[quixdatalake] 3.28.1; its
quixportal needs Python >= 3.12), created on first use from a ``python3.12``/``3.13``
found on PATH or under pyenv; without one the row says so.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    LAKESINK_SCHEMA,
    PARTITION_BY,
    SPARK_DDL,
    TreeRSS,
    process_cpu,
    events,
    machine,
    parquet_files,
    read_back,
    write_json,
)
from lakesink.runtime.jars import connector_jars  # noqa: E402
from lakesink.local.services import KafkaBroker, produce  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
QUIX_VENV = BENCH / ".venv-quix"
QUIX_REQ = "quixstreams[quixdatalake]==3.28.1"
ALL_CASES = ["lakesink-parquet", "lakesink-parquet-spark", "lakesink-delta",
             "lakesink-delta-spark", "lakesink-parquet-tasks", "lakesink-delta-tasks", "spark-handwritten", "spark-kafka-floor", "quix", "kdi",
             "pyarrow"]
STREAMING = ["lakesink-parquet", "lakesink-parquet-spark", "lakesink-delta",
             "lakesink-delta-spark", "spark-handwritten", "quix", "kdi"]
#: the engine of each lakesink case (lakesink-parquet: the default, the Arrow path)
ENGINES = {"lakesink-parquet": "arrow", "lakesink-parquet-spark": "spark",
           "lakesink-delta": "arrow", "lakesink-delta-spark": "spark",
           "lakesink-parquet-tasks": "arrow", "lakesink-delta-tasks": "arrow"}
LAKESINK_LINE = re.compile(r"batch \d+: committed in [\d.]+s \((\d+) written")
PROGRESS_LINE = re.compile(r"^PROGRESS (\d+)")


# -- the cases -----------------------------------------------------------------------------

class Case:
    """How to run one system: its command, its output folder and format, its progress."""

    def __init__(self, name: str, work: Path, broker: KafkaBroker, args: argparse.Namespace):
        self.name, self.work, self.broker, self.args = name, work, broker, args
        self.fmt = "delta" if name.startswith("lakesink-delta") or name == "kdi" else "parquet"

    @property
    def table(self) -> Path:
        if self.name.startswith("lakesink"):
            return self.work / "lake" / "sensors"
        if self.name == "quix":
            return self.work / "quix" / "lake" / "sensors"
        if self.name == "kdi":
            return self.work / "kdi" / "sensors"
        return self.work / "out"

    def rows_in(self, line: str) -> int:
        m = (LAKESINK_LINE.search(line) if self.name.startswith("lakesink")
             else PROGRESS_LINE.match(line))
        return int(m.group(1)) if m else 0

    def ready(self, line: str) -> bool:
        return ("query started" in line) if self.name.startswith("lakesink") else \
            line.startswith("READY")

    def command(self, topic: str, *, stream: bool, count: int, ndjson: Path | None) -> list[str]:
        py = sys.executable
        if self.name.startswith("lakesink"):
            cfg = {
                "source": {"kafka": {"bootstrap_servers": self.broker.bootstrap_servers,
                                     "topics": [topic],
                                     "max_offsets_per_trigger": self.args.max_offsets}},
                "decode": {"schema": LAKESINK_SCHEMA},
                "table": {"name": "sensors", "base_path": str(self.work / "lake"),
                          "format": self.fmt, "partition_by": PARTITION_BY,
                          "timestamp_column": "ts_ms", "engine": ENGINES[self.name],
                          # -tasks: the tasks' files as they wrote them (no merge)
                          "files_per_partition": 0 if self.name.endswith("-tasks") else 1},
                "trigger": {"interval": "1 second"},
            }
            path = self.work / "lakesink.yaml"
            path.write_text(yaml.safe_dump(cfg))
            cmd = [py, "-m", "lakesink.cli", "run", "-c", str(path)]
            for setting in self.args.lakesink_set:
                cmd += ["--set", setting]
            return cmd if stream else [*cmd, "--until-caught-up"]
        if self.name in ("spark-handwritten", "spark-kafka-floor"):
            cmd = [py, str(BENCH / "cases/handwritten_spark.py"),
                   "--bootstrap", self.broker.bootstrap_servers, "--topic", topic,
                   "--out", str(self.table), "--checkpoint", str(self.work / "chk"),
                   "--jars", ",".join(str(j) for j in connector_jars()), "--schema", SPARK_DDL,
                   "--max-offsets", str(self.args.max_offsets)]
            if self.name == "spark-kafka-floor":
                cmd.append("--floor")
            return [*cmd, "--stream"] if stream else cmd
        if self.name == "quix":
            cmd = [str(QUIX_VENV / "bin/python"), str(BENCH / "cases/quix_sink.py"),
                   "--bootstrap", self.broker.bootstrap_servers, "--topic", topic,
                   "--root", str(self.work / "quix")]
            return [*cmd, "--commit-interval", "1"] if stream else [*cmd, "--count", str(count)]
        if self.name == "kdi":
            cmd = [py, str(BENCH / "cases/kdi_sink.py"), "--bin", self.args.kdi_bin,
                   "--bootstrap", self.broker.bootstrap_servers, "--topic", topic,
                   "--table", str(self.table), "--max-messages", str(self.args.max_offsets)]
            return [*cmd, "--stream"] if stream else [*cmd, "--count", str(count)]
        assert ndjson is not None
        return [py, str(BENCH / "cases/pyarrow_bound.py"), "--input", str(ndjson),
                "--out", str(self.table)]


#: ``--logs DIR``: every case's whole output, one file per run (start-up profiles)
LOGS: Path | None = None


class Running:
    """A case's process: drains its output, stamps progress, samples its RSS."""

    def __init__(self, case: Case, cmd: list[str]) -> None:
        self.case = case
        self.started = time.monotonic()
        self.log = None
        if LOGS is not None:
            LOGS.mkdir(parents=True, exist_ok=True)
            stamp = dt.datetime.now(dt.UTC).strftime("%H%M%S")
            self.log = (LOGS / f"{case.name}-{stamp}.log").open("w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, cwd=ROOT)
        self.rss = TreeRSS(self.proc.pid)
        self.progress: list[tuple[float, int]] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=400)
        self.is_ready = threading.Event()
        self.ready_at: float | None = None
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        done = 0
        for line in self.proc.stdout:
            self.tail.append(line.rstrip())
            if self.log is not None:
                self.log.write(f"{time.monotonic() - self.started:8.3f} {line}")
            if self.case.ready(line) and not self.is_ready.is_set():
                self.ready_at = time.monotonic() - self.started
                self.is_ready.set()
            n = self.case.rows_in(line)
            if n:
                done += n
                self.progress.append((time.monotonic() - self.started, done))
        if self.log is not None:
            self.log.close()

    def wait(self, timeout: float) -> tuple[int, float, int]:
        """(return code, seconds, peak RSS bytes)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = -1
        seconds = time.monotonic() - self.started
        self._reader.join(timeout=5)
        return rc, seconds, self.rss.stop()

    def stop(self, grace: float = 60) -> tuple[int, int]:
        """SIGTERM to the case's main process (lakesink and quix stop after the
        in-flight batch; a signal to the whole group would kill Spark's JVM first),
        then SIGKILL to the group."""
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            rc = self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = -9
        return rc, self.rss.stop()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def steady_rate(run: Running, n: int) -> float | None:
    """Rows per second once the case was up: from its ready line (query started,
    consumer running) to its last progress report; start-up is excluded."""
    if not run.progress:
        return None
    start = run.ready_at or 0.0
    end = run.progress[-1][0]
    return n / (end - start) if end > start else None


# -- throughput ----------------------------------------------------------------------------

def seconds_cell(row: dict[str, object]) -> str:
    """``41.2`` or, over repeated runs, ``41.2 (39.8–44.0)``: the median run and the range."""
    runs = row.get("runs_seconds")
    if not runs:
        return str(row["seconds"])
    return f"{row['seconds']} ({min(runs)}–{max(runs)})"  # type: ignore[type-var]


def median_run(rows: list[dict[str, object]]) -> dict[str, object]:
    """The run with the median time (the lower of the two middle ones for an even
    count), with every run's seconds; invalid when any run was."""
    ordered = sorted(rows, key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
    row = dict(ordered[(len(ordered) - 1) // 2])
    if len(rows) > 1:
        row["runs_seconds"] = [r["seconds"] for r in rows]
        row["runs_peak_rss_mib"] = [r["peak_rss_mib"] for r in rows]
        row["runs_cpu_s_per_million"] = [r.get("cpu_s_per_million") for r in rows]
        row["runs_peak_rss_by_process_mib"] = [r.get("peak_rss_by_process_mib") for r in rows]
        row["valid"] = all(r.get("valid") for r in rows)
    return row


def throughput(case: Case, topic: str, n: int, ndjson: Path, value_bytes: float,
               timeout: float, bad: int = 0) -> dict[str, object]:
    """One run of ``case`` over the ``n`` records of ``topic`` (``bad`` of them
    malformed: the table must hold the other ``n - bad``, the dead-letter table
    those ``bad``)."""
    shutil.rmtree(case.work, ignore_errors=True)
    case.work.mkdir(parents=True)
    broker_cpu = process_cpu(case.broker.process.pid) if case.broker.process else 0.0
    run = Running(case, case.command(topic, stream=False, count=n, ndjson=ndjson))
    rc, seconds, peak = run.wait(timeout)
    broker_cpu = (process_cpu(case.broker.process.pid) if case.broker.process else 0.0) \
        - broker_cpu
    cpu = run.rss.cpu_seconds
    row: dict[str, object] = {"case": case.name, "rc": rc, "seconds": round(seconds, 1),
                              "cpu_s": round(cpu, 1),
                              "cpu_s_per_million": round(cpu / n * 1e6, 1) if n else None,
                              "broker_cpu_s": round(broker_cpu, 1),
                              "peak_rss_mib": round(peak / 2**20),
                              "peak_rss_by_process_mib": {
                                  k: round(v / 2**20) for k, v in run.rss.breakdown.items()}}
    if rc != 0:
        row.update(valid=False, error="\n".join(run.tail))
        return row
    if case.name == "spark-kafka-floor":  # nothing written: its own count is the check
        rows = distinct = run.progress[-1][1] if run.progress else 0
    else:
        rows, distinct = read_back(case.table, case.fmt)
    files = parquet_files(case.table) if case.table.exists() else []
    sizes = [p.stat().st_size for p in files]
    steady = steady_rate(run, n)
    row.update(
        rows=rows, distinct_ids=distinct, valid=rows == distinct == n - bad,
        events_per_s=round(n / seconds), mb_per_s=round(n * value_bytes / seconds / 1e6, 2),
        steady_events_per_s=round(steady) if steady else None,
        steady_mb_per_s=round(steady * value_bytes / 1e6, 2) if steady else None,
        files=len(files), mean_file_kib=round(statistics.mean(sizes) / 1024, 1) if sizes else 0,
        progress_reports=len(run.progress),
        ready_after_s=round(run.ready_at, 1) if run.ready_at is not None else None,
    )
    if bad:
        rejected = rejected_rows(case.work / "lake" / "_rejected" / "sensors")
        row.update(rejected=rejected, valid=row["valid"] and rejected == bad)
    return row


def rejected_rows(folder: Path) -> int:
    """Rows of a Parquet dead-letter table, as DuckDB reads them."""
    import duckdb

    files = [str(p) for p in parquet_files(folder)] if folder.exists() else []
    if not files:
        return 0
    row = duckdb.sql(f"SELECT count(*) FROM read_parquet({files!r}, union_by_name=true)"
                     ).fetchone()
    return int(row[0]) if row else 0


def malformed(records: Iterator[tuple[bytes, bytes]], every: int
              ) -> Iterator[tuple[bytes, bytes]]:
    """The same records with one in ``every`` cut short (not JSON: a dead letter)."""
    for i, (key, value) in enumerate(records):
        yield key, (value[: len(value) // 2] if i % every == every // 2 else value)


# -- latency -------------------------------------------------------------------------------

class VisibleRows:
    """Polls a table for files a reader can see and when each event became visible."""

    def __init__(self, table: Path, fmt: str) -> None:
        self.table, self.fmt = table, fmt
        self.read: set[str] = set()
        self.latency_ms: dict[int, float] = {}
        self._log_seen: set[str] = set()
        self._added: list[Path] = []  # Delta: files added by a commit seen so far

    def _candidates(self) -> list[Path]:
        if self.fmt != "delta":
            return parquet_files(self.table) if self.table.exists() else []
        from urllib.parse import unquote

        out = self._added
        log = self.table / "_delta_log"
        for entry in sorted(log.glob("*.json")) if log.exists() else []:
            if entry.name in self._log_seen:
                continue
            self._log_seen.add(entry.name)
            for line in entry.read_text().splitlines():
                action = json.loads(line)
                if "add" in action:
                    out.append(self.table / unquote(action["add"]["path"]))
        return out

    def poll(self) -> None:
        import pyarrow.parquet as pq

        now_ms = time.time() * 1000
        for path in self._candidates():
            key = str(path)
            if key in self.read:
                continue
            try:
                t = pq.read_table(path, columns=["event_id", "ts_ms"])
            except Exception:  # noqa: BLE001 - still being written: next poll
                continue
            self.read.add(key)
            for eid, ts in zip(t.column("event_id").to_pylist(), t.column("ts_ms").to_pylist(),
                               strict=True):
                self.latency_ms.setdefault(eid, now_ms - ts)


def paced_produce(broker: KafkaBroker, topic: str, rate: int, seconds: int) -> int:
    """Produce ``rate`` events/s for ``seconds``, each stamped with its produce time."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5,
                         "log_level": 3})
    total = rate * seconds
    tick = 0.05
    per_tick = max(1, int(rate * tick))
    sent = 0
    start = time.monotonic()
    while sent < total:
        for key, value in events(min(per_tick, total - sent), start_id=sent, now_ms=True):
            producer.produce(topic, key=key, value=value)
        sent += min(per_tick, total - sent)
        producer.poll(0)
        delay = start + (sent / rate) - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    producer.flush(30)
    return sent


def latency(case: Case, args: argparse.Namespace) -> dict[str, object]:
    topic = f"latency-{case.name}"
    case.broker.create_topic(topic, partitions=args.partitions)
    shutil.rmtree(case.work, ignore_errors=True)
    case.work.mkdir(parents=True)
    run = Running(case, case.command(topic, stream=True, count=0, ndjson=None))
    if not run.is_ready.wait(180):
        run.kill()
        return {"case": case.name, "error": "not ready in 180 s:\n" + "\n".join(run.tail)}
    time.sleep(3)  # let the first (empty) batches pass
    visible = VisibleRows(case.table, case.fmt)
    produced: list[int] = []
    feeder = threading.Thread(target=lambda: produced.append(
        paced_produce(case.broker, topic, args.latency_rate, args.latency_seconds)))
    feeder.start()
    total = args.latency_rate * args.latency_seconds
    deadline = time.monotonic() + args.latency_seconds + 90
    while time.monotonic() < deadline:
        visible.poll()
        if not feeder.is_alive() and len(visible.latency_ms) >= total:
            break
        time.sleep(0.1)
    feeder.join()
    rc, _ = run.stop()
    lat = sorted(visible.latency_ms.values())
    seen = len(lat)

    def pct(q: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else None

    # p99 per 10 s of produce time (event ids are produced in order, ``rate`` a second):
    # tells the start-up transient (the first window) from the steady state
    window = args.latency_rate * 10
    windows: dict[int, list[float]] = collections.defaultdict(list)
    for eid, ms in visible.latency_ms.items():
        windows[int(eid) // window].append(ms)
    p99_windows = [round(sorted(v)[min(len(v) - 1, int(0.99 * len(v)))])
                   for _, v in sorted(windows.items())]
    return {"case": case.name, "rate": args.latency_rate, "seconds": args.latency_seconds,
            "produced": produced[0] if produced else 0, "seen": seen,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": round(lat[-1]) if lat else None,
            "p99_per_10s_ms": p99_windows,
            "rc": rc, **({"log_tail": "\n".join(run.tail)} if seen < total or rc else {})}


# -- set-up, report ------------------------------------------------------------------------

def ensure_quix_venv() -> str | None:
    """Create bench/.venv-quix if needed; return why it cannot be, or None."""
    if (QUIX_VENV / "bin/python").exists():
        return None
    pyenv = Path.home() / ".pyenv/versions"
    pythons = [str(p / "bin/python") for p in sorted(pyenv.glob("3.1[2-9]*"), reverse=True)] \
        if pyenv.exists() else []
    pythons += [shutil.which(f"python3.{m}") or "" for m in (13, 12)]

    def works(python: str) -> bool:
        return bool(python) and subprocess.run(
            [python, "-c", "import sys; assert sys.version_info >= (3, 12)"],
            capture_output=True).returncode == 0

    found = next((p for p in pythons if works(p)), None)
    if found is None:
        return "needs Python >= 3.12 (quixportal); none found on PATH or under pyenv"
    subprocess.run([found, "-m", "venv", str(QUIX_VENV)], check=True)
    subprocess.run([str(QUIX_VENV / "bin/pip"), "install", "-q", QUIX_REQ], check=True)
    return None


def kdi_problem(path: str | None) -> str | None:
    """Why the kdi case cannot run (None: it can)."""
    if not path:
        return "no kafka-delta-ingest binary (--kdi-bin or KDI_BIN; docs/benchmark.md)"
    if not os.access(path, os.X_OK):
        return f"{path} is not an executable"
    return None


def _ratio(a: dict, b: dict, key: str = "events_per_s") -> str:
    if a.get(key) and b.get(key) and a.get("valid") and b.get("valid"):
        return f"{a[key] / b[key]:.2f}×"
    return "—"


def render(info: dict[str, object]) -> str:
    """The results table: every case with its ratios to the hand-written job, to Quix
    and to the Kafka floor (whole run / steady), then its resources and latency."""
    rows = {r["case"]: r for r in info["throughput"]}  # type: ignore[index]
    lat = {r["case"]: r for r in info["latency"]}  # type: ignore[index]
    bases = [(rows.get(b, {}), label) for b, label in (
        ("spark-handwritten", "hand-written"), ("quix", "Quix"), ("kdi", "kdi"),
        ("spark-kafka-floor", "floor"))]
    bases = [(b, label) for b, label in bases if b]

    lines = ["| case | valid | rows | seconds | events/s | steady events/s "
             + "".join(f"| vs {label} (whole / steady) " for _, label in bases)
             + "| CPU-s per M events | broker CPU-s | peak RSS MiB | files | mean file KiB "
             "| latency p50 ms | p99 ms |",
             "|" + "---|" * (13 + len(bases))]
    for name in info["cases"]:  # type: ignore[union-attr]
        r, lr = rows.get(name, {}), lat.get(name, {})
        if "events_per_s" not in r:
            lines.append(f"| {name} | {r.get('valid', False)} | — | {r.get('seconds', '—')} | "
                         f"not measured: {r.get('note') or (r.get('error') or '')[-200:]!r} "
                         + "| " * (8 + len(bases)))
            continue
        ratios = "".join(f"| {_ratio(r, b)} / {_ratio(r, b, 'steady_events_per_s')} "
                         for b, _ in bases)
        lines.append(
            f"| {name} | {r['valid']} | {r['rows']:,} | {seconds_cell(r)} | {r['events_per_s']:,} "
            f"| {r['steady_events_per_s'] or '—'} {ratios}"
            f"| {r.get('cpu_s_per_million', '—')} | {r.get('broker_cpu_s', '—')} "
            f"| {r['peak_rss_mib']:,} | {r['files']:,} | {r['mean_file_kib']} "
            f"| {lr.get('p50_ms', '—')} | {lr.get('p99_ms', '—')} |")
    extra = []
    for name in ("lakesink-parquet", "lakesink-delta"):
        r = rows.get(name, {})
        if r and rows.get("pyarrow"):
            extra.append(f"- {name} vs pyarrow (one process, no broker): "
                         f"{_ratio(r, rows['pyarrow'])} (whole run)")
    for r in info["latency"]:  # type: ignore[union-attr]
        if r.get("p99_per_10s_ms"):
            extra.append(f"- latency {r['case']}: p99 per 10 s of the run (ms): "
                         + ", ".join(f"{v:,}" for v in r["p99_per_10s_ms"]))
        if "error" in r or r.get("seen") != r.get("produced"):
            extra.append(f"- latency {r['case']}: {r.get('seen')} of {r.get('produced')} events "
                         f"seen {r.get('error', '')[-300:]}")
    for r in info.get("bad_records", []):  # type: ignore[union-attr]
        clean = rows.get(r["case"], {})
        if r.get("valid") and clean.get("valid"):
            extra.append(f"- {r['case']} with {r['bad']:,} malformed records of "
                         f"{clean['rows']:,} ({r['rejected']:,} rejected, {r['rows']:,} "
                         f"written): {r['seconds']} s against {clean['seconds']} s clean, "
                         f"{r['seconds'] / clean['seconds']:.2f}× the clean run's time")
        else:
            extra.append(f"- {r['case']} with malformed records: not valid "
                         f"(rows {r.get('rows')}, rejected {r.get('rejected')}) "
                         f"{(r.get('error') or '')[-200:]}")
    return "\n".join(lines) + ("\n\n" + "\n".join(extra) if extra else "") + "\n"


def chart(info: dict[str, object], path: Path) -> bool:
    """The throughput table as a bar chart (PNG): events/s per case, whole run and
    steady, each bar labelled with its ratio to the hand-written job. False without
    matplotlib (the ``bench`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in info["throughput"] if r.get("events_per_s")]  # type: ignore[union-attr]
    base = next((r for r in rows if r["case"] == "spark-handwritten"), None)
    names = [str(r["case"]) for r in rows]
    whole = [float(r["events_per_s"]) for r in rows]
    steady = [float(r.get("steady_events_per_s") or 0) for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=120)
    xs = range(len(rows))
    bars = ax.bar([x - 0.2 for x in xs], [w / 1000 for w in whole], 0.4, label="whole run")
    ax.bar([x + 0.2 for x in xs], [s / 1000 for s in steady], 0.4, label="steady")
    if base is not None:
        for bar, value in zip(bars, whole, strict=True):
            ax.annotate(f"{value / float(base['events_per_s']):.2f}×",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("thousand events / s")
    ax.set_title(f"{info.get('produced', 0):,} events — ratio to the hand-written Spark job "
                 "above each whole-run bar", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--max-offsets", type=int, default=500_000,
                    help="max offsets per trigger for every Spark case")
    ap.add_argument("--cases", default=",".join(ALL_CASES))
    ap.add_argument("--kdi-bin", default=os.environ.get("KDI_BIN"),
                    help="kafka-delta-ingest's binary for the kdi case (default: $KDI_BIN; "
                    "docs/benchmark.md says how to build it); the case is skipped without")
    ap.add_argument("--latency-rate", type=int, default=2000)
    ap.add_argument("--latency-seconds", type=int, default=40)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--timeout", type=float, default=7200, help="per case, seconds")
    ap.add_argument("--bad-every", type=int, default=0,
                    help="also run each lakesink case on a copy of the topic with one "
                    "malformed record in N, and report its time against the clean run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="throughput rounds (cases interleaved, each round starting with "
                    "the next case); the run with the median time is reported, with every "
                    "run's seconds")
    ap.add_argument("--lakesink-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for every lakesink case (lakesink run --set), e.g. "
                    "spark.driver_memory=768m; repeatable; shown in the results' command")
    ap.add_argument("--logs", default=None,
                    help="keep each case's whole output here, each line with the seconds "
                    "since its process started")
    args = ap.parse_args()
    global LOGS
    LOGS = Path(args.logs) if args.logs else None
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(ALL_CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; known: {ALL_CASES}")

    problems = {"quix": ensure_quix_venv() if "quix" in cases else None,
                "kdi": kdi_problem(args.kdi_bin) if "kdi" in cases else None}
    for name, problem in problems.items():
        if problem:
            print(f"{name}: skipped: {problem}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="lakesink-bench-"))
    info: dict[str, object] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ"), "machine": machine(),
        "command": "python bench/run.py " + " ".join(sys.argv[1:]), "args": vars(args),
        "cases": cases, "throughput": [], "latency": [], "bad_records": [],
    }
    ndjson = work / "values.ndjson"
    with KafkaBroker() as broker:
        broker.create_topic("bench", partitions=args.partitions)
        t0 = time.monotonic()
        size = 0
        with ndjson.open("wb") as f:
            def tee():  # noqa: ANN202
                nonlocal size
                for key, value in events(args.events):
                    f.write(value + b"\n")
                    size += len(value)
                    yield key, value
            produced = produce(broker.bootstrap_servers, "bench", tee())
        value_bytes = size / produced
        info.update(produced=produced, mean_value_bytes=round(value_bytes, 1),
                    produce_seconds=round(time.monotonic() - t0, 1))
        print(f"produced {produced:,} events ({value_bytes:.0f} B each) in "
              f"{info['produce_seconds']} s", flush=True)
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in cases}
        for round_ in range(max(1, args.repeat)):
            # each round starts with the next case, so no case always runs first after
            # the produce (the broker still flushing, a cold page cache)
            shift = round_ % len(cases)
            for name in cases[shift:] + cases[:shift]:
                if problems.get(name):
                    continue
                case = Case(name, work / name, broker, args)
                row = throughput(case, "bench", produced, ndjson, value_bytes, args.timeout)
                print(json.dumps(row), flush=True)
                runs[name].append(row)
                shutil.rmtree(case.work, ignore_errors=True)
        if args.bad_every:
            bad = sum(1 for i in range(produced) if i % args.bad_every == args.bad_every // 2)
            broker.create_topic("bench-bad", partitions=args.partitions)
            produce(broker.bootstrap_servers, "bench-bad",
                    malformed(events(args.events), args.bad_every))
            for round_ in range(max(1, args.repeat)):
                for name in [c for c in cases if c.startswith("lakesink")]:
                    case = Case(name, work / f"bad-{name}", broker, args)
                    row = throughput(case, "bench-bad", produced, ndjson, value_bytes,
                                     args.timeout, bad=bad)
                    row["bad"] = bad
                    print(json.dumps(row), flush=True)
                    runs[f"{name}+bad"] = [*runs.get(f"{name}+bad", []), row]
                    shutil.rmtree(case.work, ignore_errors=True)
            for name in [c for c in cases if c.startswith("lakesink")]:
                info["bad_records"].append(median_run(runs[f"{name}+bad"]))
        for name in cases:
            if problems.get(name):
                info["throughput"].append({"case": name, "valid": False,
                                           "note": problems[name]})
            else:
                info["throughput"].append(median_run(runs[name]))
        if not args.no_latency:
            for name in cases:
                if name not in STREAMING or problems.get(name):
                    continue
                case = Case(name, work / f"lat-{name}", broker, args)
                row = latency(case, args)
                print(json.dumps(row), flush=True)
                info["latency"].append(row)
                shutil.rmtree(case.work, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    table = render(info)
    out = BENCH / "results"
    out.mkdir(exist_ok=True)
    stamp = info["date"]
    write_json(out / f"bench-{stamp}.json", info)
    md = (f"# Benchmark {stamp}\n\n`{info['command']}`\n\nMachine: "
          f"{json.dumps(info['machine'])}\n\n{produced:,} events of {value_bytes:.0f} B, "
          f"{args.partitions} topic partitions, max offsets per trigger "
          f"{args.max_offsets:,} (Spark cases); latency: {args.latency_rate} events/s for "
          f"{args.latency_seconds} s, 1 s trigger (Quix: 1 s commit interval).\n\n{table}")
    if chart(info, out / f"bench-{stamp}.png"):
        md += f"\n![throughput](bench-{stamp}.png)\n"
    (out / f"bench-{stamp}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
