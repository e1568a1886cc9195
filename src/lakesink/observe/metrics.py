"""lakesink's Prometheus metrics: one registry per process, fed by the batch functions
(after each commit), the retry loops and Spark's streaming progress.

Names follow Prometheus conventions (``_total`` counters, ``_seconds``, ``_bytes``;
labels ``table``, ``reason``, ``topic``, ``partition``). Labels carry table and topic
names only — never a configuration value, so never a secret. The catalogue, with what
each one means, is in ``docs/observability.md``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from lakesink.sources.offsets import lag

RECENT_BATCHES = 20
_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class Metrics:
    """The metrics of one process (``METRICS``; tests may make their own)."""

    def __init__(self) -> None:
        #: count rejected records per reason (a small Spark job per batch with dead
        #: letters): on while the metrics are served
        self.by_reason = False
        #: for the status page: each table's last batches, and rows written per minute
        #: over the last hour
        self._lock = threading.Lock()
        self.recent: dict[str, collections.deque[dict[str, Any]]] = {}
        self.per_minute: dict[str, dict[int, int]] = {}
        self.started = time.time()
        #: what the run reads and writes, as its start line logs it (no secrets)
        self.source = self.target = ""
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.records_read = Counter(
            "lakesink_records_read", "Records a committed batch read from the source",
            ["table"], registry=r)
        self.records_written = Counter(
            "lakesink_records_written", "Rows committed to the table", ["table"], registry=r)
        self.records_rejected = Counter(
            "lakesink_records_rejected", "Records sent to the dead-letter table",
            ["table", "reason"], registry=r)
        self.records_unrouted = Counter(
            "lakesink_records_unrouted", "Records no route took (routed runs)", registry=r)
        self.unknown_dropped = Counter(
            "lakesink_unknown_fields_dropped", "Records whose fields outside the schema "
            "were dropped (schema_evolution: strict, unknown_fields: drop)", ["table"],
            registry=r)
        self.batches = Counter(
            "lakesink_batches", "Batches committed", ["table"], registry=r)
        self.batches_skipped = Counter(
            "lakesink_batches_skipped", "Replayed batches the table already held",
            ["table"], registry=r)
        self.batch_seconds = Histogram(
            "lakesink_batch_duration_seconds", "Time from a batch's start to its commit "
            "(and dead letters, and catalog step)", ["table"], buckets=_BUCKETS,
            registry=r)
        self.batch_phase_seconds = Histogram(
            "lakesink_batch_phase_seconds", "Time of a batch's phases: write (read, decode, "
            "write and commit: Spark runs them as one job), dead_letters, catalog",
            ["table", "phase"], buckets=_BUCKETS, registry=r)
        self.files = Counter(
            "lakesink_files_written", "Data files committed", ["table"], registry=r)
        self.bytes = Counter(
            "lakesink_bytes_written", "Bytes of the data files committed", ["table"],
            registry=r)
        self.schema_changes = Counter(
            "lakesink_schema_changes", "Columns added or widened", ["table"], registry=r)
        self.last_commit = Gauge(
            "lakesink_last_commit_timestamp_seconds", "Unix time of the table's last "
            "commit (time since: time() - this)", ["table"], registry=r)
        self.catalog_pending = Gauge(
            "lakesink_catalog_pending_batches", "Committed batches not yet registered in "
            "the catalog (it is down or slow)", ["table"], registry=r)
        self.batch_retries = Counter(
            "lakesink_batch_retries", "Batch attempts that failed and were tried again",
            registry=r)
        self.query_restarts = Counter(
            "lakesink_query_restarts", "Query restarts from the checkpoint after a failure",
            registry=r)
        self.lag = Gauge(
            "lakesink_consumer_lag_records", "Records behind the source's end, per topic "
            "partition: Kafka's end offset or a Redis stream's entries added, minus the "
            "last batch's end; the items left in a Redis list; the records in a Danube "
            "spool after the last batch (partition is empty for Redis and Danube)",
            ["topic", "partition"], registry=r)
        self.progress_timestamp = Gauge(
            "lakesink_last_progress_timestamp_seconds", "Unix time of the query's last "
            "progress report (a batch, or Spark's idle report)", registry=r)
        self.query_active = Gauge(
            "lakesink_query_active", "1 while the ingestion query runs", registry=r)
        self.silence_tracked = Gauge(
            "lakesink_silence_keys_tracked", "Keys the silence detector holds in its state",
            registry=r)
        self.silence_fired = Counter(
            "lakesink_silence_fired", "stream_timeout events fired (a key went silent)",
            registry=r)
        self.silence_swept = Counter(
            "lakesink_silence_swept", "Keys dropped from the state without an event (silent "
            "for the sweep limit)", registry=r)
        self.silence_callback_failures = Counter(
            "lakesink_silence_callback_failures", "silence.callback calls that raised or "
            "timed out", registry=r)
        self._callback_failures_seen = 0

    def describe(self, source: str, target: str) -> None:
        """The run's source and tables, for the status page: the start line's texts,
        which carry names and addresses only (passwords in URLs redacted)."""
        from lakesink.observe.logs import redact

        self.source, self.target = redact(source), redact(target)

    def committed(self, table: str, *, records: int, written: int, rejected: Mapping[str, int],
                  unknown_dropped: int, files: int, size: int, seconds: float,
                  schema_changes: int, pending: int | None, batch_id: int | None = None
                  ) -> None:
        """One committed batch of ``table`` (counted once per process: a replay the
        table already held is :meth:`skipped`)."""
        now = time.time()
        with self._lock:
            recent = self.recent.setdefault(table, collections.deque(maxlen=RECENT_BATCHES))
            recent.appendleft({"batch_id": batch_id, "at": now, "records": records,
                               "written": written, "rejected": sum(rejected.values()),
                               "files": files, "bytes": size, "seconds": seconds})
            minutes = self.per_minute.setdefault(table, {})
            minute = int(now // 60)
            minutes[minute] = minutes.get(minute, 0) + written
            for old in [m for m in minutes if m <= minute - 60]:
                del minutes[old]
        self.records_read.labels(table).inc(records)
        self.records_written.labels(table).inc(written)
        for reason, count in rejected.items():
            self.records_rejected.labels(table, reason).inc(count)
        self.unknown_dropped.labels(table).inc(unknown_dropped)
        self.batches.labels(table).inc()
        self.batch_seconds.labels(table).observe(seconds)
        self.files.labels(table).inc(files)
        self.bytes.labels(table).inc(size)
        self.schema_changes.labels(table).inc(schema_changes)
        self.last_commit.labels(table).set(time.time())
        if pending is not None:
            self.catalog_pending.labels(table).set(pending)

    def silence_batch(self, *, fired: int, swept: int, tracked: int,
                      callback_failures: int) -> None:
        """One silence-detection batch; ``callback_failures`` is the run's running total."""
        self.silence_fired.inc(fired)
        self.silence_swept.inc(swept)
        self.silence_tracked.set(tracked)
        with self._lock:
            grew = max(0, callback_failures - self._callback_failures_seen)
            self._callback_failures_seen = max(self._callback_failures_seen, callback_failures)
        self.silence_callback_failures.inc(grew)

    def skipped(self, table: str) -> None:
        self.batches_skipped.labels(table).inc()

    def progress(self, sources: list[tuple[str | None, str | None]]) -> None:
        """A progress report: per source, its (end offset, latest offset) JSON texts."""
        self.progress_timestamp.set(time.time())
        for end, latest in sources:
            for (topic, partition), behind in lag(end, latest).items():
                self.lag.labels(topic, partition).set(behind)


METRICS = Metrics()
