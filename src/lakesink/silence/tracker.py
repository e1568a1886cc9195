"""The per-key silence state machine (the Quix ``StreamTimeoutTracker``, on Spark state).

State per key: ``last_ms``, the time its latest record was seen, and one timer at
``last_ms + timeout``. The clock is the batch's processing time (``time: processing``)
or the watermark (``time: event``). When the timer fires:

- silent for at least ``ttl_factor × timeout``: the state is dropped without an event
  (a ``swept`` row, logged as a warning) — e.g. after a downtime far longer than the
  timeout, or a watermark that jumped;
- silent for at least ``timeout``: one ``stream_timeout`` event, and the state is
  dropped: a silence fires once; the key's next record starts tracking again (re-armed);
- else (the key was seen again meanwhile): the timer is set again.

A record that arrives after its key's timer was due but before it fired (both in one
batch, or after a restart) still ends a silence: the event is emitted then. A key's
records of one batch are taken in time order, so a silence that starts and ends within
one batch fires too: the events do not depend on how the records were cut into batches
(``max_offsets_per_trigger``).

The state lives in the checkpoint (RocksDB), so it survives restarts; a heartbeat row
per batch (``kind`` 0, see :mod:`.query`) keeps batches — and so timers — running while
the input is idle. Rows of ``kind`` 2 are records without a key: only counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

#: grouping ``kind`` of the rows fed to the tracker
HEARTBEAT, RECORD, NULL_KEY = 0, 1, 2

#: what the tracker emits; only ``stream_timeout`` rows reach the outputs
OUTPUT_SCHEMA = ("key binary, stream string, event string, ts_ms long, last_seen_ms long, "
                 "silent_ms long, records long")

Verdict = Literal["fire", "sweep", "wait"]


def verdict(now_ms: int, last_ms: int, timeout_ms: int, ttl_factor: float) -> Verdict:
    """What a key silent since ``last_ms`` gets at ``now_ms``."""
    silent = now_ms - last_ms
    if silent >= ttl_factor * timeout_ms:
        return "sweep"
    if silent >= timeout_ms:
        return "fire"
    return "wait"


def stream_text(key: bytes) -> str:
    """The key as text for the event's ``stream`` field (invalid UTF-8 replaced)."""
    return bytes(key).decode("utf-8", "replace")


class SilenceTracker(StatefulProcessor):
    """``transformWithStateInPandas`` processor; grouping key ``(kind, key)``."""

    def __init__(self, timeout_ms: int, ttl_factor: float, event_time: bool) -> None:
        self.timeout_ms = timeout_ms
        self.ttl_factor = ttl_factor
        self.event_time = event_time

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.last = handle.getValueState("last_seen", "last_ms long")

    def _now(self, timer_values: TimerValues) -> int:
        if self.event_time:
            return int(timer_values.getCurrentWatermarkInMs())
        return int(timer_values.getCurrentProcessingTimeInMs())

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues
                        ) -> Iterator[Any]:
        import pandas as pd

        kind, raw = key
        if kind == HEARTBEAT:
            return
        frames = list(rows)
        if kind == NULL_KEY:
            yield pd.DataFrame([_row(b"", "null_key", 0, None, None,
                                     sum(len(f) for f in frames))])
            return
        now = self._now(timerValues)
        times = np.sort(np.concatenate([f["ts_ms"].to_numpy(dtype=np.int64)
                                        for f in frames]))
        if not self.event_time:  # a producer's clock ahead of ours does not count
            times = np.minimum(times, now)
        previous = self.last.get()[0] if self.last.exists() else None
        # each record against the newest time seen before it (the state, then the
        # batch's earlier records): a gap of a timeout or more is a silence that ended
        before = np.concatenate([[times[0] if previous is None else previous], times[:-1]])
        if previous is not None:
            before = np.maximum(before, previous)
        events = []
        for i in np.nonzero(times - before >= self.timeout_ms)[0]:
            ended = verdict(int(times[i]), int(before[i]), self.timeout_ms, self.ttl_factor)
            events.append(self._event(raw, ended, now, int(before[i]), int(times[i])))
        if events:
            yield pd.DataFrame(events)
        newest = int(times[-1])
        last = newest if previous is None else max(previous, newest)
        self.last.update((last,))
        for timer in self.handle.listTimers():
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(last + self.timeout_ms)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[Any]:
        import pandas as pd

        _, raw = key
        if not self.last.exists():
            return
        last = self.last.get()[0]
        now = self._now(timerValues)
        outcome = verdict(now, last, self.timeout_ms, self.ttl_factor)
        if outcome == "wait":
            self.handle.registerTimer(last + self.timeout_ms)
            return
        self.last.clear()
        yield pd.DataFrame([self._event(raw, outcome, now, last, now)])

    def _event(self, raw: bytes, outcome: Verdict, now: int, last: int, until: int
               ) -> dict[str, Any]:
        event = "stream_timeout" if outcome == "fire" else "swept"
        return _row(bytes(raw), event, now, last, until - last, 1)

    def close(self) -> None:
        pass


def _row(key: bytes, event: str, ts_ms: int, last: int | None, silent: int | None,
         records: int) -> dict[str, Any]:
    return {"key": key, "stream": stream_text(key), "event": event, "ts_ms": ts_ms,
            "last_seen_ms": last, "silent_ms": silent, "records": records}
