"""The silence query: a second streaming query over the ingestion's source.

    kafka (own checkpoint) ─► (kind, key, ts_ms) ─┐
    heartbeat: one row per batch (processing time)┴─► groupBy(kind, key)
        .transformWithStateInPandas(SilenceTracker, RocksDB state) ─► foreachBatch: outputs

It shares the source settings and the Spark session with the ingestion query but
nothing else: its own checkpoint (the tracker's state and its offsets), its own
trigger, its own restarts. A failure here is logged and the query restarted; it never
stops or slows ingestion beyond the CPU its batches take.

The heartbeat is in the query from its first run (changing sources would invalidate
the checkpoint), so after a restart with idle input the timers still fire.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakesink import sources
from lakesink.config.silence import SilenceConfig
from lakesink.config.source import SourceConfig
from lakesink.errors import ConfigError, one_line
from lakesink.faults import fault_point
from lakesink.observe.metrics import METRICS
from lakesink.runtime.query_runner import RestartPolicy, run_with_restarts
from lakesink.runtime.shutdown import StopGate, StopRequest
from lakesink.silence.outputs import Callback, Outputs, load_callback
from lakesink.silence.tracker import HEARTBEAT, NULL_KEY, OUTPUT_SCHEMA, RECORD, SilenceTracker
from lakesink.sources.kafka_client import client_options
from lakesink.tables.fs import HadoopFS, to_uri
from lakesink.tables.identity import MarkStarted, checkpoint_app_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lakesink.config.plan import RunPlan
    from lakesink.tables.base import TableWriter

logger = logging.getLogger(__name__)

#: Spark settings the tracker needs (transformWithState runs on RocksDB only)
SESSION_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    # event time: the batch after the last data advances the watermark and fires timers
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
}


@dataclass
class SilenceStats:
    """Totals of this process's silence query (``tracked``: keys in state now)."""

    batches: int = 0
    tracked: int = 0
    fired: int = 0
    swept: int = 0
    null_keys: int = 0
    callback_failures: int = 0
    callback_timeouts: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class SilenceQuery:
    def __init__(self, run: RunPlan, spark: SparkSession, checkpoint: str,
                 outputs: Outputs) -> None:
        self.plan = run
        self.settings: SilenceConfig = run.silence
        self.spark = spark
        self.checkpoint = checkpoint
        self.outputs = outputs
        self.stats = SilenceStats()
        self.query: StreamingQuery | None = None

    @classmethod
    def build(cls, run: RunPlan, spark: SparkSession, default_checkpoint: str
              ) -> SilenceQuery:
        """Everything that can refuse (callback import, table layout) runs here."""
        s = run.silence
        source = run.source
        callback = (Callback(load_callback(s.callback), s.callback_timeout_s)
                    if s.callback else None)
        for key, value in SESSION_CONF.items():
            spark.conf.set(key, value)
        checkpoint = to_uri(s.checkpoint or default_checkpoint)
        fs = HadoopFS(spark, to_uri(run.table_defaults.base_path))
        app_id = checkpoint_app_id(fs, checkpoint)
        table = _table_writer(run, spark, app_id) if s.table else None
        if s.topic and source.kafka is None:
            raise ConfigError("silence.topic", "events go to a Kafka topic, which needs a "
                              "Kafka source; use silence.table or silence.callback")
        options = ({k: v for k, v in client_options(source.kafka).items()
                    if k != "group.id"} if source.kafka is not None else {})
        sources.second_reader(source, "silence")  # refuses a source it cannot re-read
        outputs = Outputs(spark, fs, checkpoint, table=table, topic=s.topic,
                          kafka_options=options, callback=callback)
        query = cls(run, spark, checkpoint, outputs)
        try:
            query.check_expressions()
        except BaseException:
            query.close()  # a refused start holds no writer lease
            raise
        return query

    def check_expressions(self) -> None:
        """The key and time expressions resolve over the Kafka columns (else exit 2)."""
        from pyspark.errors import AnalysisException, ParseException
        from pyspark.sql import functions as F

        src = sources.read_stream(self.spark, self.source, headers=True,
                                  checkpoint=self.checkpoint)
        s = self.settings
        checks = [("silence.key", s.key, "binary")]
        if self.event_time:
            checks.append(("silence.event_time", s.event_time, "timestamp"))
        for key, expr, to in checks:
            if expr is None:
                continue
            try:
                src.select(F.expr(expr).cast(to)).schema  # noqa: B018 - analysis only
            except (AnalysisException, ParseException) as exc:
                raise ConfigError(key, f"{expr!r} does not resolve over the Kafka columns "
                                  f"(key, value, topic, partition, offset, timestamp, "
                                  f"headers) as {to}: {one_line(exc, name=False)}"
                                  ) from None

    @property
    def event_time(self) -> bool:
        return self.settings.time == "event"

    @property
    def source(self) -> SourceConfig:
        """The ingestion's source, read a second time without taking its records (see
        :func:`lakesink.sources.second_reader`)."""
        return sources.second_reader(self.plan.source, "silence")

    def frame(self) -> DataFrame:
        """The tracker's output stream (events, sweeps, null-key counts)."""
        from pyspark.sql import functions as F

        s = self.settings
        uses_headers = "headers" in (s.key or "") + (s.event_time or "")
        src = sources.read_stream(self.spark, self.source, headers=uses_headers,
                                  checkpoint=self.checkpoint)
        key = F.expr(s.key).cast("binary") if s.key else F.col("key")
        ts = F.expr(s.event_time).cast("timestamp") if self.event_time else F.col(
            "timestamp")
        rows = src.select(key.alias("key"), ts.alias("event_ts"))
        missing = F.col("key").isNull() | F.col("event_ts").isNull()
        rows = rows.select(
            F.when(missing, F.lit(NULL_KEY)).otherwise(F.lit(RECORD)).alias("kind"),
            F.when(missing, F.lit(b"")).otherwise(F.col("key")).alias("key"),
            F.coalesce(F.unix_millis(F.col("event_ts")), F.lit(0)).alias("ts_ms"),
            F.col("event_ts"))
        if self.event_time:
            rows = rows.withWatermark("event_ts", s.watermark_delay).drop("event_ts")
        else:
            beat = (self.spark.readStream.format("rate-micro-batch")
                    .option("rowsPerBatch", 1).load()
                    .select(F.lit(HEARTBEAT).alias("kind"), F.lit(b"").alias("key"),
                            F.lit(0).cast("long").alias("ts_ms")))
            rows = rows.drop("event_ts").unionByName(beat)
        tracker = SilenceTracker(s.timeout_ms or 0, s.ttl_factor, self.event_time)
        return rows.groupBy("kind", "key").transformWithStateInPandas(
            tracker, OUTPUT_SCHEMA, "Append",
            "EventTime" if self.event_time else "ProcessingTime")

    def start(self, *, until_caught_up: bool, stop: StopRequest | None = None
              ) -> StreamingQuery:
        """Start the query; batches starting after ``stop`` is requested are refused
        (see :mod:`lakesink.runtime.shutdown`)."""
        writer = (self.frame().writeStream
                  .foreachBatch(StopGate(MarkStarted(self._batch, self.outputs.fs, self.checkpoint),
                                         stop or StopRequest()))
                  .option("checkpointLocation", self.checkpoint)
                  .queryName("lakesink_silence"))
        if until_caught_up:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.settings.interval)
        self.query = writer.start()
        logger.info("silence query started: timeout %d ms, %s time, check every %s "
                    "(checkpoint %s)", self.settings.timeout_ms, self.settings.time,
                    self.settings.interval, self.checkpoint)
        return self.query

    def _batch(self, df: DataFrame, batch_id: int) -> None:
        rows = df.collect()  # one row per silent key or sweep: small
        events = [r for r in rows if r.event == "stream_timeout"]
        for r in rows:
            if r.event == "swept":
                logger.warning("stream %r: silent for %d ms (at least %g × the timeout); "
                               "its state is dropped without an event", r.stream,
                               r.silent_ms, self.settings.ttl_factor)
            elif r.event == "stream_timeout":
                logger.info("stream %r timed out (silent for %d ms)", r.stream, r.silent_ms)
        if events:
            fault_point("silence_before_delivery", batch_id)
        self.outputs.deliver(batch_id, events)
        if events:
            fault_point("silence_after_delivery", batch_id)
        st = self.stats
        st.batches += 1
        st.fired += len(events)
        st.swept += sum(r.event == "swept" for r in rows)
        st.null_keys += sum(r.records for r in rows if r.event == "null_key")
        st.tracked = self._tracked()
        if self.outputs.callback is not None:
            st.callback_failures = self.outputs.callback.failures
            st.callback_timeouts = self.outputs.callback.timeouts
        METRICS.silence_batch(fired=len(events), swept=sum(r.event == "swept" for r in rows),
                              tracked=st.tracked,
                              callback_failures=st.callback_failures + st.callback_timeouts)

    def _tracked(self) -> int:
        """Keys in state after the previous batch (the state store's row count)."""
        progress = self.query.lastProgress if self.query is not None else None
        operators = (progress or {}).get("stateOperators") or []
        return int(operators[0].get("numRowsTotal", 0)) if operators else self.stats.tracked

    def run(self, stop: StopRequest, *, until_caught_up: bool) -> None:
        """Run until ``stop`` (or caught up); restart after a failure, with backoff,
        until stopped. Never raises: silence detection must not end ingestion."""
        try:
            self._run(stop, until_caught_up=until_caught_up)
        finally:
            self.close()

    def close(self) -> None:
        """Release the silence table's writer lease (if it holds one)."""
        if self.outputs.table is not None:
            self.outputs.table.close()

    def _run(self, stop: StopRequest, *, until_caught_up: bool) -> None:
        retry = self.plan.retry

        def tracked() -> None:
            self.stats.tracked = self._tracked()  # the last batch's count

        run_with_restarts(
            lambda: self.start(until_caught_up=until_caught_up, stop=stop), stop,
            RestartPolicy(retry.initial_backoff_s, retry.max_backoff_s, restarts=None,
                          ends_run=until_caught_up, name="silence query"),
            after=tracked)

    def background(self, stop: StopRequest, *, until_caught_up: bool) -> SilenceRunner:
        return SilenceRunner(self, stop, until_caught_up)


class SilenceRunner:
    """The silence query on a thread beside the ingestion query, on the same ``stop``
    (a stop request ends both; the ingestion's end ends it, see :meth:`finish`)."""

    def __init__(self, query: SilenceQuery, stop: StopRequest, until_caught_up: bool
                 ) -> None:
        self.stop = stop
        self.until_caught_up = until_caught_up
        self.thread = threading.Thread(
            target=query.run, args=(self.stop,), kwargs={"until_caught_up": until_caught_up},
            name="lakesink-silence", daemon=True)
        self.thread.start()

    def finish(self, *, wait: bool) -> None:
        """``wait``: let a caught-up run finish its last batches; else stop now."""
        if not wait:
            self.stop.event.set()
        self.thread.join()


def _table_writer(run: RunPlan, spark: SparkSession, app_id: str) -> TableWriter:
    from lakesink.runtime import storage
    from lakesink.tables.formats import WriterOptions, open_writer
    from lakesink.tables.layout import TableLayout

    table = run.table_defaults
    assert run.silence.table is not None
    layout = TableLayout.of(table.base_path, run.silence.table)
    writer = open_writer(table.format, spark, layout, WriterOptions(
        app_id=app_id, compression=table.compression, files_per_partition=1,
        **storage.lease_options(run.storage, table), merge_schema=False,
        config_key="silence.table"))
    writer.prepare()
    return writer
