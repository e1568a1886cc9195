"""Progress of a run with an end (``run --until-caught-up``, the demo): records done
of the backlog the run started with, rate and ETA — a rich progress bar on a terminal,
a log line every ``every_s`` seconds otherwise, and one closing line either way.

The backlog is counted once at start from the broker (per partition: its end offset
minus where the run starts, the checkpoint's offset or ``starting_offsets``); records
done are those of the committed batches (written and rejected). Other sources show
the count and rate without a total.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakesink.config.source import KafkaSource
    from lakesink.config.storage import StorageConfig

logger = logging.getLogger(__name__)


def backlog(kafka: KafkaSource | None, storage: StorageConfig, checkpoint: str) -> int | None:
    """Records a caught-up run has ahead of it (None: not a Kafka source, or the broker
    could not say)."""
    from confluent_kafka import Consumer, TopicPartition

    from lakesink.sources.kafka_client import librdkafka_conf
    from lakesink.status import checkpoint_offsets

    if kafka is None:
        return None
    try:
        done = checkpoint_offsets(storage, checkpoint)
        consumer = Consumer(librdkafka_conf(kafka))
        try:
            meta = consumer.list_topics(timeout=kafka.connect_timeout_s)
            topics = kafka.topics or [t for t in meta.topics
                                      if re.fullmatch(kafka.topic_pattern or "", t)]
            given = (json.loads(kafka.starting_offsets)
                     if kafka.starting_offsets.startswith("{") else {})
            total = 0
            for topic in topics:
                for partition in (meta.topics[topic].partitions if topic in meta.topics
                                  else {}):
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=kafka.connect_timeout_s)
                    total += max(0, high - _start(done, given, kafka.starting_offsets,
                                                  topic, partition, low, high))
            return total
        finally:
            consumer.close()
    except Exception as exc:  # noqa: BLE001 - progress without a total
        logger.debug("no backlog count: %s", exc)
        return None


def _start(done: dict[str, dict[str, int]] | None, given: dict[str, Any], starting: str,
           topic: str, partition: int, low: int, high: int) -> int:
    if done is not None:  # a checkpoint: where its last committed batch ended
        return done.get(topic, {}).get(str(partition), low)
    value = given.get(topic, {}).get(str(partition))
    if value is not None:
        return high if value == -1 else low if value == -2 else int(value)
    return high if starting == "latest" else low


class CatchUpProgress:
    def __init__(self, total: int | None, done: Callable[[], int], *,
                 interactive: bool | None = None, every_s: float = 10.0,
                 finished: str = "caught up") -> None:
        self.finished = finished
        self.total = total
        self.done = done
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self.every_s = every_s
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="lakesink-progress")
        self._bar: Any = None

    def start(self) -> CatchUpProgress:
        if self.interactive:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("records"), BarColumn(), MofNCompleteColumn(),
                                 TaskProgressColumn(), TextColumn("{task.fields[rate]}"),
                                 TimeRemainingColumn(), console=Console(stderr=True),
                                 transient=True)
            self._task = self._bar.add_task("records", total=self.total, rate="")
            self._bar.start()
            self._logs_above_bar()
        self._thread.start()
        return self

    def _logs_above_bar(self) -> None:
        """While the bar is shown, log lines go through its console (printed above the
        bar, never glued to it): the handlers on stderr write to the bar's redirected
        stderr until :meth:`finish` gives them theirs back."""
        import logging

        bar_stderr = sys.stderr  # rich's proxy while the bar is live
        self._swapped = [
            (h, h.setStream(bar_stderr)) for h in logging.getLogger().handlers
            if type(h) is logging.StreamHandler and h.stream is not bar_stderr
            and h.stream in (sys.__stderr__, self._bar.console.file)]

    def line(self) -> str:
        """``1200 of 5000 records (24%), 310 records/s, ETA 12s``."""
        done, elapsed = self.done(), max(time.monotonic() - self.started, 1e-9)
        rate = done / elapsed
        text = f"{done}" + (f" of {self.total}" if self.total is not None else "") + " records"
        if self.total:
            text += f" ({min(100, 100 * done // self.total)}%)"
        text += f", {rate:.0f} records/s"
        if self.total is not None and rate > 0 and done < self.total:
            text += f", ETA {(self.total - done) / rate:.0f}s"
        return text

    def _loop(self) -> None:
        last_log = time.monotonic()
        while not self._stop.wait(0.5 if self.interactive else 1.0):
            if self._bar is not None:
                done = self.done()
                rate = done / max(time.monotonic() - self.started, 1e-9)
                self._bar.update(self._task, completed=done, rate=f"{rate:.0f} rec/s")
            elif time.monotonic() - last_log >= self.every_s:
                logger.info("progress: %s", self.line())
                last_log = time.monotonic()

    def finish(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self._bar is not None:
            for handler, stream in getattr(self, "_swapped", []):
                handler.setStream(stream)
            self._bar.stop()
        done, elapsed = self.done(), time.monotonic() - self.started
        logger.info("%s: %d%s records in %.1fs (%.0f records/s)", self.finished, done,
                    f" of {self.total}" if self.total is not None else "", elapsed,
                    done / max(elapsed, 1e-9))
