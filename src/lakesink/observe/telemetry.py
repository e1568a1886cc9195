"""OpenTelemetry export (OTLP over HTTP): the same metrics as ``/metrics`` and a span
per batch with its phases, when ``telemetry.otlp_endpoint`` or the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (``OTEL_SERVICE_NAME`` names the service,
default ``lakesink``; ``OTEL_EXPORTER_OTLP_HEADERS`` and the other standard variables
are read by the exporter itself).

The metrics are lakesink's Prometheus registry read by observable instruments at each
export (counters stay cumulative; a histogram goes out as its ``_count`` and ``_sum``).
Spans: ``lakesink.batch`` (attributes ``lakesink.table``, ``lakesink.batch_id``, then
records, written, rejected, files, bytes) with children ``write`` (decode, write and
commit), ``dead_letters`` and ``catalog``. Span and metric attributes carry table names
and numbers only, never a configuration value.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lakesink.observe.metrics import METRICS

if TYPE_CHECKING:
    from lakesink.config.observe import TelemetryConfig
    from lakesink.observe.metrics import Metrics

logger = logging.getLogger(__name__)

#: the tracer of the running process's export (None: no export)
_TRACER: Any = None


@contextlib.contextmanager
def batch_span(table: str, batch_id: int) -> Iterator[Any]:
    """The span of one batch (a no-op without an export)."""
    if _TRACER is None:
        yield None
        return
    with _TRACER.start_as_current_span(
            "lakesink.batch", attributes={"lakesink.table": table,
                                          "lakesink.batch_id": batch_id}) as span:
        yield span


@contextlib.contextmanager
def phase(name: str, table: str) -> Iterator[None]:
    """A phase of a batch: timed into ``lakesink_batch_phase_seconds`` and, with an
    export, a child span of the batch's span."""
    started = time.monotonic()
    try:
        if _TRACER is None:
            yield
        else:
            with _TRACER.start_as_current_span(name):
                yield
    finally:
        METRICS.batch_phase_seconds.labels(table, name).observe(time.monotonic() - started)


def endpoint(telemetry: TelemetryConfig, env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    return telemetry.otlp_endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


class Telemetry:
    """The exporters of one run; :meth:`stop` flushes them."""

    def __init__(self, base: str, service: str, interval_s: float, metrics: Metrics) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        base = base.rstrip("/")
        resource = Resource.create({"service.name": service})
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces")))
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics"),
            export_interval_millis=interval_s * 1000)
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        _mirror(self.meter_provider.get_meter("lakesink"), metrics)
        self.tracer = self.tracer_provider.get_tracer("lakesink")

    @classmethod
    def start(cls, settings: TelemetryConfig, metrics: Metrics,
              env: Mapping[str, str] | None = None) -> Telemetry | None:
        global _TRACER
        env = os.environ if env is None else env
        base = endpoint(settings, env)
        if base is None:
            return None
        service = env.get("OTEL_SERVICE_NAME") or settings.service_name
        telemetry = cls(base, service, settings.export_interval_s, metrics)
        _TRACER = telemetry.tracer
        metrics.by_reason = True
        logger.info("OpenTelemetry: metrics and spans to %s (service %s)", base, service)
        return telemetry

    def stop(self) -> None:
        global _TRACER
        _TRACER = None
        for provider in (self.tracer_provider, self.meter_provider):
            try:
                provider.shutdown()  # exports what is left
            except Exception as exc:  # noqa: BLE001 - telemetry never fails a run
                logger.warning("OpenTelemetry export at stop failed: %s", exc)


def _mirror(meter: Any, metrics: Metrics) -> None:  # noqa: ANN401
    """Observable instruments that read ``metrics``' registry at each export."""
    from opentelemetry.metrics import Observation

    def samples(name: str) -> Any:  # noqa: ANN401
        def callback(options: Any) -> list[Any]:  # noqa: ANN401, ARG001
            return [Observation(s.value, dict(s.labels))
                    for family in metrics.registry.collect() for s in family.samples
                    if s.name == name]
        return callback

    for family in metrics.registry.collect():
        if family.type == "counter":
            meter.create_observable_counter(
                family.name, callbacks=[samples(f"{family.name}_total")],
                description=family.documentation)
        elif family.type == "gauge":
            meter.create_observable_gauge(family.name, callbacks=[samples(family.name)],
                                          description=family.documentation)
        elif family.type == "histogram":
            for suffix in ("_count", "_sum"):
                meter.create_observable_counter(
                    family.name + suffix, callbacks=[samples(family.name + suffix)],
                    description=family.documentation)
