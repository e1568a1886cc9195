"""Where a silence event goes: a Kafka topic, a table, a Python callback.

Contract, per batch of the silence query (``deliver(batch_id, events)``):

- **table** — exactly once: written by lakesink's table writer, keyed by the silence
  query's app id and the batch id, like any lakesink table.
- **topic** — at least once, duplicates practically never: the batch's events are
  produced (Spark's Kafka sink, the source's connection settings), then a marker
  ``delivered/<batch>.topic`` is written in the checkpoint; a batch that is run again
  (after a crash) skips a topic it finds marked. Only a crash between the broker's
  acknowledgement and the marker sends the batch again — byte-identical records, since
  a re-run batch keeps its batch time.
- **callback** — at least once: each call runs in its own daemon thread; the batch
  waits at most ``callback_timeout_s`` for them. Calls that raised or did not return in
  time are made again (up to ``CALLBACK_ATTEMPTS`` rounds, with a short backoff); the
  marker ``delivered/<batch>.callback`` is written only when every event's call has
  returned. If some still fail, the silence batch fails and runs again after the silence
  query's restart — every event of it is called again, so a callback may see an event
  twice (make it idempotent) but never misses one; a kill before the marker does the
  same. The ingestion query never waits for any of this: it is another query.

The Kafka record: key = the original key bytes, value =
``{"ts_ms": …, "stream": "<key as text>", "event": "stream_timeout"}``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError, SinkError

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

    from lakesink.tables.base import TableWriter
    from lakesink.tables.fs import HadoopFS

logger = logging.getLogger(__name__)

#: columns of the silence table
TABLE_SCHEMA = ("stream string, key binary, event string, ts_ms long, last_seen_ms long, "
                "silent_ms long")
#: hung callback threads beyond which new calls are skipped (and logged)
MAX_HUNG_CALLS = 64
#: rounds of calls per silence batch before the batch fails (and runs again)
CALLBACK_ATTEMPTS = 3
CALLBACK_BACKOFF_S = 1.0


def event_value(row: Row) -> str:
    """The Kafka record value of one event (the Quix shape)."""
    return json.dumps({"ts_ms": row.ts_ms, "stream": row.stream, "event": row.event})


def load_callback(spec: str) -> Callable[..., Any]:
    """``module:function`` → the function; a ConfigError (exit 2) when it is not there."""
    module_name, _, name = spec.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError("silence.callback", f"cannot load {spec!r}: {exc}",
                          fix="give module:function of an importable module "
                          "(on PYTHONPATH)") from None
    if not callable(target):
        raise ConfigError("silence.callback", f"{spec!r} is not callable")
    return target


class Callback:
    """Calls ``fn(key)`` — or ``fn(key, event)`` if it takes two arguments — per event,
    in bounded time."""

    def __init__(self, fn: Callable[..., Any], timeout_s: float) -> None:
        self.fn = fn
        self.timeout_s = timeout_s
        self.with_event = _positional_params(fn) >= 2
        self.hung: list[threading.Thread] = []
        self.failures = 0
        self.timeouts = 0

    def __call__(self, events: list[Row]) -> list[Row]:
        """Call for every event; returns the events whose call did not return in time,
        raised, or was not made (too many calls still hung)."""
        self.hung = [t for t in self.hung if t.is_alive()]
        threads: list[tuple[threading.Thread, Row]] = []
        undelivered: list[Row] = []
        returned = [False] * len(events)  # set by each call's thread when fn returned
        for i, row in enumerate(events):
            if len(self.hung) + len(threads) >= MAX_HUNG_CALLS:
                logger.error("silence callback: %d calls still running; not calling it for "
                             "stream %r", MAX_HUNG_CALLS, row.stream)
                self.timeouts += 1
                undelivered.append(row)
                continue
            args: tuple[Any, ...] = (bytes(row.key),)
            if self.with_event:
                args += ({"ts_ms": row.ts_ms, "stream": row.stream, "event": row.event,
                          "silent_ms": row.silent_ms},)
            thread = threading.Thread(target=self._call, args=(row.stream, args, returned, i),
                                      name=f"silence-callback-{row.stream[:40]}", daemon=True)
            thread.start()
            threads.append((thread, i))
        deadline = time.monotonic() + self.timeout_s
        for thread, i in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self.timeouts += 1
                self.hung.append(thread)
                logger.error("silence callback did not return within %.0fs (%s); left "
                             "running, ingestion goes on", self.timeout_s, thread.name)
            if not returned[i]:
                undelivered.append(events[i])
        return undelivered

    def _call(self, stream: str, args: tuple[Any, ...], returned: list[bool], i: int
              ) -> None:
        try:
            self.fn(*args)
        except Exception:
            self.failures += 1
            logger.exception("silence callback raised for stream %r", stream)
            return
        returned[i] = True


def _positional_params(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


class Outputs:
    """The configured outputs of one silence query; see the module docstring."""

    def __init__(self, spark: SparkSession, fs: HadoopFS, checkpoint: str, *,
                 table: TableWriter | None, topic: str | None,
                 kafka_options: dict[str, str], callback: Callback | None) -> None:
        self.spark = spark
        self.fs = fs
        self.checkpoint = checkpoint.rstrip("/")
        self.table = table
        self.topic = topic
        self.kafka_options = kafka_options
        self.callback = callback

    def _marker(self, batch_id: int, output: str) -> str:
        return f"{self.checkpoint}/delivered/{batch_id}.{output}"

    def _once(self, batch_id: int, output: str, send: Callable[[], None]) -> None:
        marker = self._marker(batch_id, output)
        if self.fs.exists(marker):
            logger.info("silence batch %d: %s already delivered", batch_id, output)
            return
        send()
        self.fs.write_text(marker, "")
        self.fs.delete(self._marker(batch_id - 100, output), recursive=False)

    def deliver(self, batch_id: int, events: list[Row]) -> None:
        if not events:
            return
        if self.table is not None:
            self.table.write_batch(batch_id, self.spark.createDataFrame(
                [(e.stream, bytes(e.key), e.event, e.ts_ms, e.last_seen_ms, e.silent_ms)
                 for e in events], TABLE_SCHEMA))
        if self.topic is not None:
            self._once(batch_id, "topic", lambda: self._produce(events))
        if self.callback is not None:
            callback = self.callback
            self._once(batch_id, "callback", lambda: self._call_back(callback, batch_id,
                                                                     events))

    def _call_back(self, callback: Callback, batch_id: int, events: list[Row]) -> None:
        """Every event's call returned, after at most ``CALLBACK_ATTEMPTS`` rounds; or
        SinkError (the batch runs again, its marker unwritten)."""
        pending = events
        for attempt in range(1, CALLBACK_ATTEMPTS + 1):
            pending = callback(pending)
            if not pending:
                return
            if attempt < CALLBACK_ATTEMPTS:
                logger.warning("silence batch %d: %d callback call(s) failed; calling them "
                               "again (round %d of %d)", batch_id, len(pending), attempt + 1,
                               CALLBACK_ATTEMPTS)
                time.sleep(CALLBACK_BACKOFF_S * attempt)
        raise SinkError(
            f"silence batch {batch_id}: {len(pending)} of {len(events)} event(s) not "
            f"delivered to the callback after {CALLBACK_ATTEMPTS} rounds; the batch runs "
            "again after the silence query restarts (callbacks are delivered at least once)")

    def _produce(self, events: list[Row]) -> None:
        df = self.spark.createDataFrame([(bytes(e.key), event_value(e)) for e in events],
                                        "key binary, value string")
        writer = df.write.format("kafka").option("topic", self.topic)
        for key, value in self.kafka_options.items():
            writer = writer.option(f"kafka.{key}", value)
        writer.save()

