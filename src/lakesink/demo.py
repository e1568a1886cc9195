"""``lakesink demo``: a local broker (Kafka, or Redis with ``--source redis``), sample
sensor events, one ingest, a DuckDB summary.

Everything it starts it stops. It owns the table ``sensors`` under the lake folder and
clears it first, so every demo run starts from an empty table — but only what an
earlier demo wrote there (:func:`claim_lake`): a folder it did not make, or one that
holds a file it did not write, stops the demo with one line naming it. With ``storage="s3"``
the lake is in a local S3 server (SeaweedFS) started for the run, configured through
the standard AWS variables as a user would; with ``storage="azure"``, in a local Azure
Blob emulator (Azurite), configured by ``storage.azure`` with the key in the environment.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from lakesink.config import load_config
from lakesink.errors import ConfigError
from lakesink.local.services import KafkaBroker, produce
from lakesink.tables.formats import FORMATS

TOPIC = "sensors"
LOCATIONS = ["berlin", "lisbon", "oslo", "madrid", "warsaw", "dublin"]
SENSOR_TYPES = {"temperature": ("C", 21.0, 6.0), "humidity": ("%", 55.0, 15.0),
                "pressure": ("hPa", 1013.0, 8.0), "co2": ("ppm", 600.0, 150.0)}
#: Events spread over three UTC days starting here.
START_MS = 1_795_000_000_000

DEMO_SCHEMA = [
    {"name": "event_id", "type": "Int64", "nullable": False},
    {"name": "sensor_id", "type": "Utf8"},
    {"name": "location", "type": "Utf8"},
    {"name": "sensor_type", "type": "Utf8"},
    {"name": "ts_ms", "type": "Int64"},
    {"name": "value", "type": "Float64"},
    {"name": "unit", "type": "Utf8"},
    {"name": "battery", "type": "Float32"},
    {"name": "firmware", "type": "Utf8"},
]


def sensor_events(n: int, *, seed: int = 7, bad_every: int = 0) -> Iterator[tuple[bytes, bytes]]:
    """``n`` JSON sensor events (about 200 bytes each) with unique ``event_id`` 0..n-1,
    spread over three UTC days from :data:`START_MS`.

    With ``bad_every`` > 0, every ``bad_every``-th record is replaced by a malformed
    one (they are extra: the n good events are all still produced).
    """
    rng = random.Random(seed)
    span_ms = 3 * 24 * 3600 * 1000
    for i in range(n):
        sensor, event = _event(rng, i, START_MS + (i * span_ms) // max(n, 1))
        yield sensor, event
        if bad_every and i % bad_every == bad_every - 1:
            yield sensor, b'{"event_id": "oops", "sensor_id": ' + str(i).encode()


def _event(rng: random.Random, i: int, ts_ms: int) -> tuple[bytes, bytes]:
    """One sensor event ``i`` at ``ts_ms``: (key, JSON value)."""
    kind = rng.choice(list(SENSOR_TYPES))
    unit, mean, sd = SENSOR_TYPES[kind]
    sensor = f"{kind[:3]}-{rng.randrange(200):04d}"
    event = {
        "event_id": i,
        "sensor_id": sensor,
        "location": LOCATIONS[zlib.crc32(sensor.encode()) % len(LOCATIONS)],
        "sensor_type": kind,
        "ts_ms": ts_ms,
        "value": round(rng.gauss(mean, sd), 3),
        "unit": unit,
        "battery": round(rng.uniform(0.05, 1.0), 2),
        "firmware": f"v{rng.randrange(1, 4)}.{rng.randrange(10)}",
    }
    return sensor.encode(), json.dumps(event, separators=(",", ":")).encode()


class Trickle(threading.Thread):
    """``--keep-running``: ``rate`` live events a second (ids from ``first``, stamped
    now) through ``feed`` until :meth:`stop`, so the status page and ``/metrics`` move."""

    def __init__(self, feed: Callable[[Iterator[tuple[bytes, bytes]]], int], first: int,
                 rate: int) -> None:
        super().__init__(name="lakesink-demo-trickle", daemon=True)
        self.feed, self.next_id, self.rate = feed, first, rate
        self._stop_event = threading.Event()
        self.rng = random.Random(first)

    def run(self) -> None:
        while not self._stop_event.wait(1.0):
            now = int(time.time() * 1000)
            batch = [_event(self.rng, self.next_id + i, now) for i in range(self.rate)]
            self.feed(iter(batch))
            self.next_id += self.rate

    def stop(self) -> int:
        """Stop producing; returns the events produced."""
        self._stop_event.set()
        self.join()
        return self.next_id


def run_demo(*, events: int, lake: Path, partitions: int, console: Console,
             table_format: str = "parquet", storage: str = "local",
             source: str = "kafka", overrides: list[str] | None = None,
             keep_running: bool = False, rate: int = 20) -> None:
    """``overrides`` (``--set``) and the ``LAKESINK_*`` variables apply over the demo's
    own settings, as for ``lakesink run``. ``keep_running``: after the sample events,
    ``rate`` live events a second, the stream and its broker kept until SIGINT/SIGTERM,
    with the status page and ``/metrics`` on ``metrics.port`` (default 9108)."""
    import os

    from lakesink.app import Pipeline
    from lakesink.cli_common import session_of

    lake = lake.resolve()
    remote = _remote_lake(storage)
    if remote is None:  # else the lake is in a server started (and emptied) for the run
        claim_lake(lake)
    started = time.monotonic()
    where = remote.where if remote is not None else str(lake)
    console.print(f"[bold]lakesink demo[/]: {events:,} sensor events -> {where}/{TOPIC}")
    try:
        with (remote.server if remote else contextlib.nullcontext()), \
                _source(source, events, partitions, console, started) as (source_flags, feed):
            if remote is not None:
                console.print(remote.describe())
            flags = {
                **source_flags,
                "decode.schema": DEMO_SCHEMA,
                "table.base_path": str(lake),
                "table.format": table_format,
                "table.partition_by": ["location", "year", "month", "day"],
                "table.timestamp_column": "ts_ms",
                "trigger.until_caught_up": not keep_running,
            }
            if keep_running and not _given(overrides or [], "metrics.port"):
                flags["metrics.port"] = DEMO_PORT
            if keep_running and not _given(overrides or [], "trigger.interval"):
                flags["trigger.interval"] = "2 seconds"  # a lively page to watch
            # the sample in a few batches: the progress bar moves, the commits show
            limit = {"kafka": "source.kafka.max_offsets_per_trigger",
                     "redis": "source.redis.max_records_per_trigger"}[source]
            if not _given(overrides or [], limit):
                flags[limit] = max(1, -(-events // DEMO_BATCHES))
            env: dict[str, str] = {}
            if remote is not None:  # the lake's place and its client's settings
                env = remote.settings(flags)
            cfg = load_config(overrides=overrides or [], flags=flags,
                              env={**{k: v for k, v in os.environ.items()
                                      if k.startswith("LAKESINK_")}, **env},
                              compat="off")
            if remote is None:  # the config it ran, for the commands it suggests at the end
                from lakesink.config.loader import config_file_text

                lake.mkdir(parents=True, exist_ok=True)
                written = lake / DEMO_CONFIG
                header = "# what `lakesink demo` ran"
                if not written.exists() or written.read_text().startswith(header):
                    written.write_text(  # never a file of the user's
                        f"{header} (its broker is gone: `status` says so as the\n"
                        "# lag; every other command works on the lake as it is)\n"
                        + config_file_text(cfg))
            t = time.monotonic()
            spark = session_of(cfg)  # as `lakesink run` makes it: spark.* settings apply
            pipeline = Pipeline.build(cfg, spark)
            if keep_running:
                stats = _keep_running(pipeline, feed, events, rate, cfg.metrics, console)
            else:
                stats = pipeline.run()
            console.print(f"  ingested    {stats.written:,} rows, {stats.rejected:,} rejected, "
                          f"{stats.files} files in {stats.batches} batch(es) "
                          f"({time.monotonic() - t:.1f}s incl. Spark start)")
            spark.stop()
            if remote is not None:
                remote.summarize(console, table_format)
    finally:  # a run that fails records what it wrote too: the next demo clears
        if remote is None:  # only that
            record_lake(lake)
    if remote is None:
        summarize(lake, console, table_format)
    server = "redis-server" if source == "redis" else "broker"
    console.print(f"[green]done[/] in {time.monotonic() - started:.1f}s; {server} stopped.")
    if remote is None:
        next_steps(lake, console, table_format)


#: the config the demo ran, in its lake folder
DEMO_CONFIG = "demo.yaml"
#: ``--keep-running``'s status page and /metrics, unless metrics.port is set
DEMO_PORT = 9108


DEMO_BATCHES = 4  # the sample's batches (a limit per batch, unless --set gives one)


def _given(overrides: list[str], key: str) -> bool:
    """Whether the user set ``key`` (``--set`` or the environment): the demo's own
    choice for it gives way."""
    import os

    return (any(o.split("=", 1)[0].strip() == key for o in overrides)
            or f"LAKESINK_{key.upper().replace('.', '__')}" in os.environ)


def _keep_running(pipeline: Any, feed: Callable[[Iterator[tuple[bytes, bytes]]], int],
                  events: int, rate: int, metrics: Any, console: Console) -> Any:  # noqa: ANN401
    """The stream until SIGINT/SIGTERM, with ``rate`` live events a second."""
    from lakesink.runtime.shutdown import StopRequest

    stop = StopRequest()
    stop.install()
    trickle = Trickle(feed, events, rate)
    trickle.start()
    if metrics.port is not None:
        host = "127.0.0.1" if metrics.host in ("0.0.0.0", "") else metrics.host
        console.print(f"  watching    status page http://{host}:{metrics.port}/ and "
                      f"/metrics; {rate} live events a second; Ctrl-C stops", highlight=False)
    try:
        stats = pipeline.run(until_caught_up=False, stop=stop)
    finally:
        produced = trickle.stop()
    console.print(f"  produced    {produced - events:,} live events while running",
                  highlight=False)
    return stats


def next_steps(lake: Path, console: Console, table_format: str) -> None:
    """What to try next on the lake the demo wrote (its config is ``<lake>/demo.yaml``)."""
    config = lake / DEMO_CONFIG
    first, scan = FORMATS[table_format].duckdb_scan(f"{lake}/{TOPIC}")
    read = (f"{sys.executable} -c \"import duckdb; {first}duckdb.sql(\\\"SELECT location, "
            f"count(*) FROM {scan} GROUP BY 1\\\").show()\"")
    console.print("next:", highlight=False)
    for command, what in (
            (f"lakesink status -c {config}", "the table: batches, rows, files, dead letters"),
            (f"lakesink dlq show -c {config}", "the rejected record and why"),
            (f"lakesink compact -c {config}", "merge the small files"),
            (read, "read it with DuckDB (its Python package)"),
            ("lakesink run -c lakesink.yaml", "your own topic: README \"Configuration\"")):
        console.print(f"  {command}\n      {what}", highlight=False, markup=False,
                      soft_wrap=True)


#: what the demo wrote under a lake folder (written after each run): only that is cleared
DEMO_RECORD = ".lakesink-demo.json"


def _demo_folders(lake: Path) -> tuple[Path, ...]:
    return (lake / TOPIC, lake / ".lakesink" / TOPIC, lake / "_rejected" / TOPIC)


def _files(folders: tuple[Path, ...], lake: Path) -> set[str]:
    return {p.relative_to(lake).as_posix() for f in folders if f.exists()
            for p in f.rglob("*") if not p.is_dir()}


def claim_lake(lake: Path) -> None:
    """Clear the demo's folders under ``lake`` for a new run, if an earlier demo run
    wrote everything in them (its :data:`DEMO_RECORD` lists each file); else refuse with
    a :class:`ConfigError` naming the folder. The demo never deletes what it did not
    create: the README's own config example writes ``./lake`` + ``sensors`` too."""
    folders = _demo_folders(lake)
    try:
        record = json.loads((lake / DEMO_RECORD).read_text())
        recorded = set(record["files"])
        if record.get("incomplete"):  # a run that ended early: its folders are its own
            recorded |= _files(folders, lake)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        record, recorded = None, set()
    for folder in folders:
        if not folder.exists():
            continue
        foreign = sorted(_files((folder,), lake) - recorded)
        if foreign or record is None:
            what = f"holds {foreign[0]}, which the demo did not write" if foreign else \
                "was not written by the demo"
            raise ConfigError("--lake", f"{folder} {what}; the demo never deletes data it "
                              "did not create", fix="give another --lake folder")
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    lake.mkdir(parents=True, exist_ok=True)  # the folders made from here on are the demo's
    (lake / DEMO_RECORD).write_text(json.dumps({"table": TOPIC, "files": [],
                                                "incomplete": True}))


def record_lake(lake: Path) -> None:
    """List every file the demo's run wrote (what the next run may clear); called when
    the run ends, however it ends, so only a killed run leaves its record incomplete."""
    files = sorted(_files(_demo_folders(lake), lake))
    (lake / DEMO_RECORD).write_text(json.dumps({"table": TOPIC, "files": files}))


@contextlib.contextmanager
def _source(kind: str, events: int, partitions: int, console: Console, started: float
            ) -> Iterator[tuple[dict[str, Any], Callable[[Iterator[tuple[bytes, bytes]]], int]]]:
    """A local Kafka broker (a topic of ``partitions``) or Redis server (a stream) with
    the sample events in it, for the demo's run; yields the source's config flags and
    a function that sends more records."""
    records = sensor_events(events, bad_every=2000 if events >= 2000 else 0)
    if kind == "redis":
        from lakesink.local.redisserver import RedisServer

        with RedisServer() as server:
            console.print(f"  redis       redis-server on 127.0.0.1:{server.port} "
                          f"({time.monotonic() - started:.1f}s)")
            t = time.monotonic()
            produced = add_to_stream(server.client(), TOPIC, records)
            console.print(f"  produced    {produced:,} entries to stream '{TOPIC}' "
                          f"(field 'data') in {time.monotonic() - t:.1f}s")
            client = server.client()
            yield ({"source.redis.port": server.port, "source.redis.streams": [TOPIC],
                    "source.redis.key_field": "k"},
                   lambda recs: add_to_stream(client, TOPIC, recs))
        return
    with KafkaBroker() as broker:
        console.print(f"  broker      KRaft on {broker.bootstrap_servers} "
                      f"({time.monotonic() - started:.1f}s)")
        broker.create_topic(TOPIC, partitions=partitions)
        t = time.monotonic()
        produced = produce(broker.bootstrap_servers, TOPIC, records)
        console.print(f"  produced    {produced:,} records to '{TOPIC}' "
                      f"({partitions} partitions) in {time.monotonic() - t:.1f}s")
        yield ({"source.kafka.bootstrap_servers": broker.bootstrap_servers,
                "source.kafka.topics": [TOPIC]},
               lambda recs: produce(broker.bootstrap_servers, TOPIC, recs))


def add_to_stream(client: Any, key: str, records: Iterator[tuple[bytes, bytes]],
                  *, chunk: int = 5000) -> int:
    """``XADD`` each ``(key, value)`` as an entry ``{data: value, k: key}``, pipelined."""
    n = 0
    pipe = client.pipeline(transaction=False)
    for k, v in records:
        pipe.xadd(key, {"data": v, "k": k})
        n += 1
        if n % chunk == 0:
            pipe.execute()
    pipe.execute()
    return n


def _remote_lake(storage: str) -> Any:  # noqa: ANN401
    """The server a ``--storage`` other than local puts the lake in (None: local)."""
    if storage == "s3":
        from lakesink.local.s3server import SeaweedS3

        return _S3Lake(SeaweedS3(bucket="lake"))
    if storage == "azure":
        from lakesink.local.azurite import Azurite

        return _AzureLake(Azurite(container="lake"))
    return None


class _RemoteLake:
    """The demo's lake in a store started for the run: ``root`` is the demo folder as
    DuckDB addresses it; ``label`` names the store in the summary."""

    root = label = ""

    def __init__(self, server: Any, where: str) -> None:  # noqa: ANN401
        self.server, self.where = server, where

    def summarize(self, console: Console, table_format: str) -> None:
        """DuckDB over the files; Delta read by delta-rs's own query engine (a file glob
        would also match the log's checkpoints)."""
        con = self.server.duckdb()
        table = f"{self.root}/{TOPIC}"
        if FORMATS[table_format].has_log:
            import pyarrow as pa
            from deltalake import DeltaTable, QueryBuilder

            delta = DeltaTable(f"{self.where}/{TOPIC}",
                               storage_options=self.server.delta_rs_options())
            rows = QueryBuilder().register("t", delta).execute("SELECT * FROM t").read_all()
            con.register("events", pa.table(rows))
            source, files = "events", len(delta.file_uris())
        else:
            source = f"read_parquet('{table}/**/*.parquet', hive_partitioning = true)"
            files = con.execute(f"SELECT count(*) FROM glob('{table}/**/*.parquet')"
                                ).fetchone()[0]
        _print_summary(con, source, f"DuckDB over {self.label}: {table}", files, console)
        with contextlib.suppress(Exception):  # no dead letters: no files to read
            _print_rejected(con, f"{self.root}/_rejected/{TOPIC}/*.parquet", console)


class _S3Lake(_RemoteLake):
    """The lake in SeaweedFS, configured through the AWS/Quix variables."""

    root, label = "s3://lake/demo", "S3"

    def __init__(self, server: Any) -> None:  # noqa: ANN401
        super().__init__(server, "s3a://lake/demo")

    def describe(self) -> str:
        return f"  s3          SeaweedFS on {self.server.endpoint}, bucket 'lake'"

    def settings(self, flags: dict[str, Any]) -> dict[str, str]:
        del flags["table.base_path"]
        return {**self.server.env(), "S3_BUCKET": "lake", "S3_PREFIX": "demo"}


class _AzureLake(_RemoteLake):
    """The lake in Azurite: ``storage.azure`` (account, endpoint), the key from the
    environment (delta-rs's pyarrow dataset on Azure can abort the process at exit: the
    summary reads through its query engine)."""

    root, label = "az://lake/demo", "Azure"

    def __init__(self, server: Any) -> None:  # noqa: ANN401
        super().__init__(server, server.base("demo"))

    def describe(self) -> str:
        return f"  azure       Azurite on {self.server.endpoint}, container 'lake'"

    def settings(self, flags: dict[str, Any]) -> dict[str, str]:
        flags["table.base_path"] = self.where
        flags.update({f"storage.azure.{k}": v for k, v in self.server.storage().items()})
        return self.server.env()


def summarize(lake: Path, console: Console, table_format: str = "parquet") -> None:
    """Read the table back with DuckDB (Parquet files directly; Delta through delta-rs,
    since a file glob would also match the Delta log's checkpoint files)."""
    import duckdb

    con = duckdb.connect()
    if FORMATS[table_format].has_log:
        from deltalake import DeltaTable

        con.register("events", DeltaTable(str(lake / TOPIC)).to_pyarrow_dataset())
        source, title = "events", f"DuckDB over delta-rs: DeltaTable('{TOPIC}')"
        files = len(DeltaTable(str(lake / TOPIC)).file_uris())
    else:
        glob = f"{lake}/{TOPIC}/**/*.parquet"
        source = f"read_parquet('{glob}', hive_partitioning = true)"
        title = f"DuckDB: read_parquet('{TOPIC}/**/*.parquet', hive_partitioning=true)"
        files = len(list((lake / TOPIC).rglob("*.parquet")))
    _print_summary(con, source, title, files, console)
    if list((lake / "_rejected" / TOPIC).glob("*.parquet")):
        _print_rejected(con, f"{lake}/_rejected/{TOPIC}/*.parquet", console)


def _print_summary(con: Any, source: str, title: str, files: int,
                   console: Console) -> None:
    query = f"""
        SELECT location, year, month, day, count(*) AS events,
               count(DISTINCT sensor_id) AS sensors, round(avg(value), 2) AS avg_value
        FROM {source}
        GROUP BY ALL ORDER BY ALL"""
    rows = con.execute(query).fetchall()
    table = Table(title=title)
    for name in ("location", "year", "month", "day", "events", "sensors", "avg value"):
        table.add_column(name, justify="right" if name in ("events", "sensors", "avg value")
                         else "left")
    for row in rows:
        *keys, n_events, n_sensors, avg = row
        table.add_row(*(str(k) for k in keys), f"{n_events:,}", f"{n_sensors:,}", str(avg))
    console.print(table)
    total, distinct = con.execute(
        f"SELECT count(*), count(DISTINCT event_id) FROM {source}").fetchone()
    console.print(f"  rows {total:,}, distinct event ids {distinct:,}, files {files}")


def _print_rejected(con: Any, glob: str, console: Console) -> None:
    reasons = con.execute(
        f"SELECT reason, count(*), any_value(detail) FROM read_parquet('{glob}') "
        "GROUP BY ALL ORDER BY 2 DESC").fetchall()
    for reason, count, detail in reasons:
        console.print(f"  rejected    {count:,} x {reason}: e.g. {detail}")
