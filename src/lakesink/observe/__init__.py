"""Observability of a run: Prometheus metrics, health probes, Spark's progress."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakesink.observe.health import Health, interval_seconds
from lakesink.observe.metrics import METRICS, Metrics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.config.plan import RunPlan
    from lakesink.observe.listener import ProgressListener
    from lakesink.observe.server import ObserveServer
    from lakesink.observe.telemetry import Telemetry


@dataclass
class Observer:
    """A run's endpoints and listener (``metrics.port`` set), or only its health."""

    health: Health
    server: ObserveServer | None = None
    listener: ProgressListener | None = None
    spark: SparkSession | None = None
    telemetry: Telemetry | None = None

    @classmethod
    def early(cls, run: RunPlan) -> Observer:
        """From the process's start, before Spark (``metrics.port`` set): ``/healthz``
        answers and ``/readyz`` says "starting" until the query runs; :meth:`start`
        takes it over. A port that cannot be bound refuses the run here."""
        settings = run.metrics
        max_age = settings.ready_batch_age_s or (
            3 * interval_seconds(run.trigger.interval) + 60)
        health = Health(max_age_s=max_age, restarts=settings.ready_restarts)
        if settings.port is None:
            return cls(health)
        from lakesink.observe.server import ObserveServer

        METRICS.by_reason = True
        return cls(health, ObserveServer(settings.host, settings.port, METRICS,
                                         health).start())

    @classmethod
    def start(cls, run: RunPlan, spark: SparkSession, query_name: str,
              early: Observer | None = None) -> Observer:
        """The run's endpoints (those of ``early`` if given), Spark's progress listener
        and the telemetry export."""
        early = early or cls.early(run)
        health, server = early.health, early.server
        from lakesink.observe.telemetry import Telemetry

        telemetry = Telemetry.start(run.telemetry, METRICS)
        if server is None and telemetry is None:
            return cls(health)
        from lakesink.observe.listener import ProgressListener

        # Spark's progress (lag, idle reports) for the endpoints and the OTLP export
        listener = ProgressListener(query_name, METRICS, health)
        spark.streams.addListener(listener)
        return cls(health, server, listener, spark, telemetry)

    def stop(self) -> None:
        METRICS.by_reason = False  # nobody reads them until the next run serves them
        if self.telemetry is not None:
            self.telemetry.stop()
        if self.listener is not None and self.spark is not None:
            self.spark.streams.removeListener(self.listener)
        if self.server is not None:
            self.server.stop()


__all__ = ["METRICS", "Health", "Metrics", "Observer"]
