"""Wires one ``lakesink run``: Spark session, source, decoder, partitions, table writer.

Start-up order (everything that can refuse runs before any data moves):
config -> Spark -> broker reachable -> table layout check -> schema (declared, stored,
or inferred from a topic sample and stored) -> partition columns checked against it
-> checkpoint app id -> streaming query.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import types as T

from lakesink import sources
from lakesink.config.models import LakesinkConfig
from lakesink.config.plan import RunPlan, TableSpec, TypeRouteSpec, plan
from lakesink.decode import fixed_decoder
from lakesink.decode.registry import SchemaRegistry
from lakesink.decode.schema import declared_schema
from lakesink.errors import ConfigError, one_line
from lakesink.observe import METRICS, Health, Observer
from lakesink.observe.progress import CatchUpProgress, backlog
from lakesink.pipeline.arrow_path import WARM_UP_TAG, pinned_threads, warm_workers
from lakesink.pipeline.arrow_task import TaskSpec
from lakesink.pipeline.batch import BatchFunction, RunStats
from lakesink.pipeline.columns import PartitionSpec
from lakesink.pipeline.retry import RetryingBatch
from lakesink.pipeline.routing import (
    JsonFieldType,
    RecordNameType,
    Route,
    RoutePlans,
    Router,
    TypeTables,
)
from lakesink.config.transform_text import parse_transforms
from lakesink.pipeline.transforms import Transforms
from lakesink.runtime import storage
from lakesink.runtime.query_runner import RestartPolicy, run_with_restarts
from lakesink.runtime.shutdown import StopGate, StopRequest
from lakesink.silence.query import SilenceQuery, SilenceRunner
from lakesink.tables.formats import WriterOptions, table_format
from lakesink.tables.fs import HadoopFS, to_uri
from lakesink.tables.identity import MarkStarted, checkpoint_app_id, record_start
from lakesink.tables.layout import TableLayout
from lakesink.tables.lease import WriterLease
from lakesink.tables.rejected import RejectedWriter
from lakesink.tables.takeover import start_refusal
from lakesink.table_parts import TableParts, writer_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lakesink.config.silence import SilenceConfig
    from lakesink.config.table import TableConfig
    from lakesink.runtime.arrow_fs import ArrowFS

logger = logging.getLogger(__name__)

#: the folder (under ``_rejected/``) of records no route takes
UNROUTED_TABLE = "_unrouted"
#: how long the end of a run waits for the workers' warm-up to end: cancelled (PySpark's
#: pinned-thread mode, the default) or, when its job cannot be told apart, left to finish
WARM_UP_JOIN_S = 15.0
#: how long a start waits for a format's classes loaded ahead (3 s in a fresh JVM here)
CLASS_LOADING_JOIN_S = 60.0


def _refuse_other_writers(processor: BatchFunction, spec: TableSpec) -> None:
    """A new checkpoint on a table with other writers' positions starts only where it
    writes nothing again (:func:`lakesink.tables.takeover.start_refusal`). Asked of the
    query's tables at start (not of a dead-letter replay, whose app id is its own, nor
    of a message-type table made mid-run); a refusal releases the writer."""
    writer = processor.writer
    kafka = spec.source.kafka
    if kafka is None or spec.table.other_writers == "ignore":
        return
    why = start_refusal(writer.other_writers(), kafka.starting_offsets)
    if why is not None:
        processor.close()
        raise ConfigError(
            "source.kafka.starting_offsets", f"{writer.layout.table}: {why}",
            fix="give the offsets to start at (JSON, after the table's: lakesink kdi "
            "ingest computes them from kafka-delta-ingest's), or table.other_writers: "
            "ignore to start anyway")


@dataclass
class Pipeline:
    cfg: LakesinkConfig
    spark: SparkSession
    name: str
    target: str
    checkpoint: str
    processor: BatchFunction | Router
    headers: bool = False
    silence: SilenceQuery | None = None
    #: the Python workers' warm-up, started beside the first start only (a restart's
    #: workers are warm); cancelled and joined before the run closes its tables
    warm_up: threading.Thread | None = field(default=None, repr=False)
    _warm_up_cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def stats(self) -> RunStats:
        return self.processor.stats

    @classmethod
    def build(cls, cfg: LakesinkConfig, spark: SparkSession) -> Pipeline:
        run_plan = plan(cfg)
        writers: dict[str, list[WriterOptions]] = {}
        for spec in run_plan.tables:
            writers.setdefault(spec.format, []).append(writer_options(spec))
        # the dead-letter tables: Spark's writer (a Delta one reads its log at start)
        writers.setdefault(cfg.dlq.format, []).append(WriterOptions(app_id=""))
        loading = [table_format(name).load_classes(spark, options)  # beside the
                   for name, options in writers.items()]  # source's checks
        sources.check_reachable(cfg.source)
        sources.check_access(spark, cfg.source)
        storage.apply(spark, cfg.storage, run_plan.paths())
        for thread in loading:  # done before a table is opened (no two threads
            if thread is not None:  # initialising the same classes)
                thread.join(CLASS_LOADING_JOIN_S)
        if cfg.routes:
            pipeline = cls._routed(run_plan, spark)
        else:
            (spec,) = run_plan.tables
            parts = TableParts.resolve(spec, spark)
            checkpoint = run_plan.checkpoint_uri()
            app_id = checkpoint_app_id(parts.fs, checkpoint, cfg.source.start_settings())
            processor = _watched(parts.processor(app_id), spec, spark)
            _refuse_other_writers(processor, spec)
            try:  # the writer lease is held: no other process records a start now
                record_start(parts.fs, checkpoint, cfg.source.start_settings())
            except BaseException:
                processor.close()
                raise
            pipeline = cls(cfg, spark, parts.layout.name, parts.layout.table, checkpoint,
                           processor, headers=parts.transforms.uses_headers)
        if cfg.silence.enabled:
            try:
                pipeline.silence = SilenceQuery.build(
                    run_plan, spark, default_checkpoint=pipeline.checkpoint.rstrip("/") + "_silence")
            except BaseException:
                pipeline.processor.close()  # a refused start holds no writer lease
                raise
        return pipeline

    @classmethod
    def _routed(cls, run: RunPlan, spark: SparkSession) -> Pipeline:
        """One query for every route: each route's table resolved as a single table's
        is (a message-type route's tables on first sight), one checkpoint (so one app id
        keys every table's commits)."""
        cfg = run.cfg
        checkpoint = run.checkpoint_uri()
        fs = HadoopFS(spark, to_uri(cfg.table.base_path))
        app_id = checkpoint_app_id(fs, checkpoint, cfg.source.start_settings())
        lease = None
        if cfg.table.writer_lease_s > 0:
            lease = WriterLease(fs, f"{checkpoint.rstrip('/')}/writer", app_id=app_id,
                                ttl_s=cfg.table.writer_lease_s, table=checkpoint)
            lease.acquire()
        static = run.static_names()
        routes: list[Route] = []
        targets = []
        try:
            record_start(fs, checkpoint, cfg.source.start_settings())
            for i, (r, spec) in enumerate(zip(cfg.routes, run.routes, strict=True)):
                route = Route(list(r.topics), r.topic_pattern)
                if isinstance(spec, TypeRouteSpec):
                    mt = spec.message_type
                    registry = spec.template.decode.registry
                    typer = (RecordNameType(SchemaRegistry(registry), fs,
                                            f"{checkpoint.rstrip('/')}/routes/"
                                            f"record_names_{i}",
                                            short=not mt.namespace)
                             if mt.record_name and registry is not None
                             else JsonFieldType(mt.field or ""))
                    route.types = TypeTables(
                        typer=typer, allow=mt.allow, prefix=mt.table_prefix,
                        factory=_type_tables(spec, spark, app_id),
                        reserved=static | {UNROUTED_TABLE}, key=f"routes.{i}.message_type",
                        sample_size=spec.template.decode.infer_sample_size,
                        max_tables=mt.max_tables, made=type_table_names(
                            run, HadoopFS(spark, to_uri(spec.template.table.base_path)), i))
                    targets.append(f"{mt.table_prefix}<{mt.field or 'record name'}>")
                else:
                    with route_keys(i):
                        parts = TableParts.resolve(spec, spark)
                    route.processor = _watched(parts.processor(app_id), spec, spark)
                    _refuse_other_writers(route.processor, spec)
                    targets.append(parts.layout.table)
                routes.append(route)
            unrouted = (None if cfg.unrouted == "drop" else RejectedWriter(
                fs, TableLayout.of(cfg.table.base_path, UNROUTED_TABLE), app_id=app_id,
                fmt=cfg.dlq.format, spark=spark,
                lease=storage.lease_options(cfg.storage, cfg.table, cfg.dlq.format)))
        except BaseException:
            Router(routes, None, app_id=app_id, lease=lease).close()  # a refused start
            raise  # holds no lease
        subscribed = cfg.source.names
        exhaustive = bool(subscribed) and all(
            any(t in r.topics for r in cfg.routes) for t in subscribed)
        plans = RoutePlans(fs, f"{checkpoint.rstrip('/')}/routes", routes_fingerprint(run))
        router = Router(routes, unrouted, app_id=app_id, exhaustive=exhaustive, plans=plans,
                        lease=lease)
        headers = any(Transforms(parse_transforms(
            spec.config.table.transforms
        )).uses_headers for spec in run.routes)
        return cls(cfg, spark, "routes", ", ".join(targets), checkpoint, router,
                   headers=headers)

    def _arrow_spec(self) -> TaskSpec | None:
        """A table's Arrow-path task spec, if any table of this query takes that path
        (the warm-up needs one; which one does not matter)."""
        processor = self.processor
        if isinstance(processor, BatchFunction):
            return processor.arrow
        routes = getattr(processor, "routes", [])
        return next((r.processor.arrow for r in routes
                     if r.processor is not None and r.processor.arrow is not None), None)

    def _warm(self, spec: TaskSpec) -> None:
        """Start the Python workers (on the warm-up thread; never raises)."""
        took = warm_workers(self.spark, spec, self._warm_up_cancelled)
        if took is None:
            logger.info("the Python workers' warm-up was cancelled: the run ended first")
        else:
            logger.info("Python workers warmed up in %.1fs", took)

    def _caught_up(self, until_caught_up: bool | None) -> bool:
        """The flag if given, else the configuration's ``trigger.until_caught_up``."""
        return self.cfg.trigger.until_caught_up if until_caught_up is None else until_caught_up

    def start(self, *, until_caught_up: bool | None = None,
              stop: StopRequest | None = None) -> StreamingQuery:
        """Start the query; batches starting after ``stop`` is requested are refused
        (see :mod:`lakesink.runtime.shutdown`)."""
        caught_up = self._caught_up(until_caught_up)
        spec = self._arrow_spec()
        stream = sources.read_stream(self.spark, self.cfg.source, headers=self.headers,
                                     checkpoint=self.checkpoint)
        if isinstance(self.processor, BatchFunction):
            # a new Delta table is made now, from the driver: the first batch then does
            # not make it with a Spark job queued behind the warm-up's tasks
            self.processor.make_table(stream)
        if spec is not None and self.warm_up is None:  # beside the first start, after
            # the table is made (the two at once compete for the cores:
            # bench/results/startup-2026-12-06.md)
            self.warm_up = threading.Thread(target=self._warm, args=(spec,),
                                            name="lakesink-warm-up", daemon=True)
            self.warm_up.start()
        retry = self.cfg.retry
        stop = stop or StopRequest()
        batch = RetryingBatch(self.processor, attempts=retry.batch_attempts,
                              initial_backoff_s=retry.initial_backoff_s,
                              max_backoff_s=retry.max_backoff_s, stop=stop.event)
        marked = MarkStarted(batch, HadoopFS(self.spark, self.checkpoint), self.checkpoint)
        writer = (stream.writeStream.foreachBatch(StopGate(marked, stop))
                  .option("checkpointLocation", self.checkpoint)
                  .queryName(f"lakesink_{self.name}"))
        if caught_up:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.cfg.trigger.interval)
        query = writer.start()
        logger.info("query started: %s -> %s (checkpoint %s)",
                    sources.describe(self.cfg.source), self.target, self.checkpoint)
        return query

    def run(self, *, until_caught_up: bool | None = None, stop: StopRequest | None = None,
            observer: Observer | None = None) -> RunStats:
        """Run until stopped (or caught up). A query that fails is restarted from its
        checkpoint after a backoff — every batch is idempotent, so a restart replays
        nothing twice — up to ``retry.restarts`` times in a row without progress.
        ``observer``: the endpoints served since the process started
        (:meth:`~lakesink.observe.Observer.early`), stopped with the run."""
        stop = stop or StopRequest()
        caught_up = self._caught_up(until_caught_up)
        progress = beside = None
        try:
            observer = Observer.start(plan(self.cfg), self.spark, f"lakesink_{self.name}",
                                      observer)
        except BaseException:
            if observer is not None:  # the endpoints served since the start end here too
                observer.stop()
            if self.silence is not None:
                self.silence.close()
            self.processor.close()
            raise
        METRICS.describe(sources.describe(self.cfg.source), self.target)
        try:
            progress = (CatchUpProgress(backlog(self.cfg.source.kafka, self.cfg.storage,
                                                self.checkpoint),
                                        lambda: self.stats.records).start()
                        if caught_up else None)
            beside = self._silence_beside(caught_up, stop)
            self._run(caught_up, stop, observer.health)
        finally:
            if progress is not None:
                progress.finish()
            self._join_warm_up()
            observer.stop()
            self._settle_source()
            if beside is not None:
                beside.finish(wait=caught_up and not stop.requested)
            if self.silence is not None:
                self.silence.close()
            self.processor.close()
        return self.stats  # after close: the catalog's last registrations counted

    def _join_warm_up(self) -> None:
        """End a warm-up still running (a short caught-up run, a restart with nothing to
        do, can end before it). In PySpark's pinned-thread mode (the default) its job is
        cancelled by its tag, not waited for (3-4 s on 2 cores), until its thread ends:
        a job not yet submitted at the first cancel is caught by the next. Otherwise its
        job cannot be told apart from others and is waited for, at most WARM_UP_JOIN_S.
        A warm-up left running is said in one line, not as a failure."""
        if self.warm_up is None or not self.warm_up.is_alive():
            return
        self._warm_up_cancelled.set()
        if pinned_threads():
            _cancel_warm_up(self.spark, self.warm_up)
        else:  # its job carries no tag (see warm_workers): wait for it, bounded
            self.warm_up.join(WARM_UP_JOIN_S)
        if self.warm_up.is_alive():
            logger.info("the Python workers' warm-up is still running after %.0fs; "
                        "the run ends without it", WARM_UP_JOIN_S)

    def _settle_source(self) -> None:
        """Acknowledge the source up to the last batch Spark recorded done (see
        :func:`lakesink.sources.settle`); a failure only delays that to the next run."""
        try:
            sources.settle(self.spark, self.cfg.source, self.checkpoint)
        except Exception as exc:  # noqa: BLE001 - the next run settles it
            logger.warning("could not acknowledge the source's last batch (%s); the next "
                           "run does", one_line(exc))

    def _silence_beside(self, caught_up: bool, stop: StopRequest) -> SilenceRunner | None:
        """The silence query on its own thread (event time only, when catching up:
        wall-clock silence has no meaning for a run that ends when the topic does).
        It shares the run's ``stop``: a stop request ends both queries at once."""
        if self.silence is None:
            return None
        if caught_up and not self.silence.event_time:
            logger.warning("silence detection (time: processing) runs only while streaming; "
                           "not in this caught-up run")
            return None
        return self.silence.background(stop, until_caught_up=caught_up)

    def _run(self, until_caught_up: bool, stop: StopRequest, health: Health) -> None:
        retry = self.cfg.retry
        run_with_restarts(
            lambda: self.start(until_caught_up=until_caught_up, stop=stop), stop,
            RestartPolicy(retry.initial_backoff_s, retry.max_backoff_s, retry.restarts),
            progress=lambda: self.stats.batches, on_failure=health.failed,
            on_restart=METRICS.query_restarts.inc)


def _type_tables(spec: TypeRouteSpec, spark: SparkSession, app_id: str
                 ) -> Callable[[str, Callable[[], list[str]]], BatchFunction]:
    """The factory of a message-type route's tables (one per type, on first sight)."""
    def make(table: str, samples: Callable[[], list[str]]) -> BatchFunction:
        with route_keys(spec.route):
            parts = TableParts.resolve(spec.table(table), spark, samples)
        return _watched(parts.processor(app_id), parts.spec, spark)
    return make


def _watched(processor: BatchFunction, spec: TableSpec, spark: SparkSession
             ) -> BatchFunction:
    """``processor`` with its table's watch: a compaction a killed compactor left is
    finished by the run too, not only by the next ``compact`` (audit-2 #20a)."""
    from lakesink import maintenance

    processor.watch = maintenance.watcher(spec, spark)
    return processor


def routes_fingerprint(run: RunPlan) -> str:
    """What decides where a routed record goes: the routes (topics, patterns, table
    names, message-type settings) and the unrouted setting."""
    import hashlib

    cfg = run.cfg
    decisive = {"routes": [{"topics": r.topics, "topic_pattern": r.topic_pattern,
                            "table": r.table.get("name"),
                            "message_type": _message_type_print(r.message_type)
                            if r.message_type else None} for r in cfg.routes],
                "unrouted": cfg.unrouted,
                "subscription": ([cfg.source.kafka.topics, cfg.source.kafka.topic_pattern]
                                 if cfg.source.kafka is not None else cfg.source.names)}
    return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()[:16]


def _message_type_print(mt: Any) -> dict[str, Any]:  # noqa: ANN401
    """A message-type route's settings for the fingerprint; ``namespace`` only when off
    (added later: a route from before it keeps its fingerprint, so a batch recorded
    before an upgrade still replays)."""
    data = mt.model_dump()
    if data.get("namespace", True):
        data.pop("namespace", None)
    return data


def type_table_names(run: RunPlan, fs: HadoopFS | ArrowFS, index: int) -> list[str]:
    """The tables message-type route ``index`` has made so far: the folders of
    ``<base>/.lakesink/`` with a recorded layout whose names carry the route's prefix
    and that no other route (or the unrouted records) owns. ``fs``: the store of the
    route's base path (its own ``table.base_path``, else the top level's; read only)."""
    route = run.route(index)
    assert isinstance(route, TypeRouteSpec)
    mt = route.message_type
    base = to_uri(route.template.table.base_path)
    static = {name.lower() for name in run.static_names()}
    names = []
    for name in fs.list_dirs(TableLayout.of(base, "x").meta.rpartition("/")[0]):
        if (not name.startswith(mt.table_prefix) or name.startswith("_")
                or name.lower() in static):
            continue
        if fs.exists(TableLayout(base, name).layout_file):
            names.append(name)
    return names


@contextlib.contextmanager
def route_keys(index: int) -> Iterator[None]:
    """Re-raise a route's ConfigError with its key under ``routes.<index>``."""
    try:
        yield
    except ConfigError as exc:
        key = exc.key
        for section in ("table", "decode"):
            if key == section or key.startswith(section + "."):
                key = f"routes.{index}.{key}"
        raise type(exc)(key, exc.message, fix=exc.fix) from None


def preflight(cfg: LakesinkConfig) -> list[str]:
    """Start-up checks that need no Spark, JVM or network, in the order ``run`` does them.

    Raises ConfigError (or LayoutError) on the first failure; returns what was checked.
    """
    run = plan(cfg)
    checks = _preflight_routes(run) if cfg.routes else _preflight_table(*run.tables)
    if cfg.silence.enabled:
        checks.append(_preflight_silence(run.silence))
    return checks


def _preflight_silence(s: SilenceConfig) -> str:
    from lakesink.silence.outputs import load_callback

    if s.callback:
        load_callback(s.callback)
    outputs = [f"{k} {getattr(s, k)}" for k in ("topic", "table", "callback")
               if getattr(s, k)]
    return (f"silence: a key silent {s.timeout_ms} ms ({s.time} time) fires to "
            f"{', '.join(outputs)}; checked every {s.interval}")


def _preflight_routes(run: RunPlan) -> list[str]:
    done = []
    for i, (route, spec) in enumerate(zip(run.cfg.routes, run.routes, strict=True)):
        what = ", ".join(route.topics) or f"/{route.topic_pattern}/"
        if isinstance(spec, TypeRouteSpec):  # tables come with the types
            mt = spec.message_type
            with route_keys(i):
                checks = _preflight_table(spec.table(mt.table_prefix + "TYPE"))[:1]
            checks.append(f"one table per value of {mt.what} "
                          f"({mt.table_prefix}<type>, allowed: {mt.allow or 'any'}), "
                          "created on first sight")
        else:
            with route_keys(i):
                checks = _preflight_table(spec)
        done.extend(f"route {i} ({what}): {c}" for c in checks)
    done.append(f"unrouted records: {run.cfg.unrouted}")
    return done


def _preflight_table(spec: TableSpec) -> list[str]:
    done = []
    table, decode = spec.table, spec.decode
    fixed = fixed_decoder(None, decode)  # reads an Avro schema file; no JVM
    if fixed is not None or decode.schema_ is not None:
        schema = fixed.schema if fixed is not None else declared_schema(decode.schema_)
        # transform outputs are typed by Spark at start; here only their names count
        schema = T.StructType(list(schema.fields))
        taken = {n.lower() for n in schema.fieldNames()}
        for t in parse_transforms(table.transforms):
            if t.target[0].lower() not in taken:
                taken.add(t.target[0].lower())
                schema = schema.add(t.target[0], T.StringType())
        PartitionSpec.build(columns=table.partition_by, schema=schema,
                            timestamp_column=table.timestamp_column,
                            timestamp_fallback=table.timestamp_fallback,
                            null_value=table.null_partition_value,
                            ascii_folders=table_format(table.format).ascii_folders)
        what = (f"format {decode.format}" if fixed is not None
                else f"{len(schema.fields)} declared field(s)")
        done.append(f"schema: {what}; partition columns "
                    f"{table.partition_by or '(none)'} resolve")
    elif decode.registry is not None:
        source = ((decode.avro.schema_file if decode.format == "avro"
                   else decode.protobuf.descriptor_file)
                  or "the latest of registry subject(s) "
                  + ", ".join(decode.registry.subjects
                              or [f"{t}-value" for t in spec.source.names]))
        done.append(f"schema: each record's writer schema from the registry "
                    f"{decode.registry.url}; a new table starts from {source}")
    elif decode.format == "avro":
        done.append(f"schema: Avro record from {decode.avro.schema_file} (columns and "
                    "partitions are checked at start, with Spark)")
    else:
        done.append("schema: none declared; it will be inferred from the topic at first start")
    layout = TableLayout.of(table.base_path, spec.name)
    done.append(f"table: {table.format} at {layout.table}")
    done.append(_check_local_layout(table, layout))
    return done


def _check_local_layout(table: TableConfig, layout: TableLayout) -> str:
    """Partition check for local tables without Spark (other stores: checked at start)."""
    import pyarrow.fs as pafs

    from lakesink.runtime.arrow_fs import ArrowFS
    from lakesink.tables.base import check_layout

    if not layout.layout_file.startswith("file:"):
        return "table layout: checked at start (remote store)"
    existing = check_layout(ArrowFS(pafs.LocalFileSystem()), layout, table.format,
                            table.partition_by,
                            null_value=table.null_partition_value)
    if existing is None:
        return "table layout: new table"
    return f"table layout: matches the existing table ({existing.get('partition_by')})"


def _cancel_warm_up(spark: SparkSession, warm_up: threading.Thread) -> None:
    """Cancel the warm-up's tagged job until its thread ends, at most WARM_UP_JOIN_S."""
    deadline = time.monotonic() + WARM_UP_JOIN_S
    while warm_up.is_alive() and time.monotonic() < deadline:
        try:  # in run's finally: never in the way of the closing steps after it
            spark.sparkContext.cancelJobsWithTag(WARM_UP_TAG)
        except Exception as exc:  # noqa: BLE001 - Spark stopped: wait out the deadline
            logger.info("could not cancel the Python workers' warm-up (%s)",
                        one_line(exc, name=False) or exc)
            warm_up.join(max(0.0, deadline - time.monotonic()))
            return
        warm_up.join(0.5)
