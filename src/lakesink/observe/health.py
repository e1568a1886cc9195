"""Liveness and readiness of a run, for ``/healthz`` and ``/readyz`` (Kubernetes probes).

* **live** while the process serves the port at all (a hung JVM still answers: use the
  readiness probe to restart on a stalled stream, or a longer liveness timeout);
* **ready** when the ingestion query is active, it reported a batch — or Spark's idle
  report, sent every 10 s by default when there is no data — within ``max_age_s``, and it
  is not in a restart loop (``restarts`` failures in a row without a committed batch).

Fed by Spark's streaming listener (:mod:`lakesink.observe.listener`) and the query
restart loop (:meth:`lakesink.app.Pipeline._run`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def interval_seconds(interval: str) -> float:
    """``"10 seconds"`` (a validated ``trigger.interval``) -> 10.0."""
    number, _, unit = interval.partition(" ")
    scale = {"milliseconds": 0.001, "seconds": 1.0, "minutes": 60.0, "hours": 3600.0}
    return float(number) * scale.get(unit, 1.0)


class Health:
    def __init__(self, *, max_age_s: float, restarts: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.restarts = restarts
        self.clock = clock
        self._lock = threading.Lock()
        self.active = False
        self.last_progress: float | None = None
        self.failures = 0

    def started(self) -> None:
        with self._lock:
            self.active = True
            self.last_progress = self.clock()

    def progressed(self) -> None:
        with self._lock:
            self.last_progress = self.clock()

    def committed(self) -> None:
        """A batch committed: the run is out of any restart loop."""
        with self._lock:
            self.failures = 0
            self.last_progress = self.clock()

    def stopped(self) -> None:
        with self._lock:
            self.active = False

    def failed(self, failures: int) -> None:
        """The query failed; ``failures`` in a row without a committed batch."""
        with self._lock:
            self.failures = failures
            self.active = False

    def ready(self) -> tuple[bool, str]:
        """(ready, why) for ``/readyz``."""
        with self._lock:
            if self.failures >= self.restarts:
                return False, (f"the query failed {self.failures} time(s) in a row without "
                               "a committed batch")
            if not self.active:
                return False, ("starting: the ingestion query is not running yet"
                               if self.last_progress is None and not self.failures
                               else "the ingestion query is not running")
            age = self.clock() - (self.last_progress or 0.0)
            if age > self.max_age_s:
                return False, (f"no batch or idle report for {age:.0f} s (limit "
                               f"{self.max_age_s:.0f} s)")
            return True, "ready"
