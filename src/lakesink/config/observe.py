"""The ``logging``, ``telemetry`` and ``metrics`` sections."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    Field,
    field_validator,
)

from lakesink.config.base import Section


class LoggingConfig(Section):
    """``logging``: lakesink's own log lines on stderr (Spark's log4j has
    ``spark.log_level``)."""

    format: Literal["text", "json"] = Field(
        default="text", description="text, or json: one object per line with time, level, "
        "logger, message, and table and batch_id during a batch")
    level: Literal["DEBUG", "INFO", "WARNING", "WARN", "ERROR"] | None = Field(
        default=None, description="default: --log-level, else LOG_LEVEL or LOGLEVEL, "
        "else INFO")


class TelemetryConfig(Section):
    """``telemetry``: OpenTelemetry export over OTLP/HTTP (``docs/observability.md``);
    off unless an endpoint is set here or in ``OTEL_EXPORTER_OTLP_ENDPOINT``."""

    otlp_endpoint: str | None = Field(default=None, description="the collector's base URL "
                                      "(http://collector:4318); /v1/metrics and /v1/traces "
                                      "are added")
    service_name: str = Field(default="lakesink", description="service.name, unless "
                              "OTEL_SERVICE_NAME is set")
    export_interval_s: float = Field(default=30.0, gt=0, description="metrics export period")

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "@" in value.partition("://")[2].partition("/")[0]:
            raise ValueError("credentials in the URL: use OTEL_EXPORTER_OTLP_HEADERS")
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"{value!r} is not an http(s):// URL")
        return value


class MetricsConfig(Section):
    """``metrics``: Prometheus ``/metrics`` and the ``/healthz`` and ``/readyz`` probes
    on one HTTP port (``docs/observability.md``); off unless ``port`` is set."""

    port: int | None = Field(default=None, ge=0, le=65535,
                             description="serve /metrics, /healthz, /readyz here; none = off")
    host: str = Field(default="0.0.0.0", description="the address to bind (0.0.0.0: every "
                      "interface, as a Kubernetes probe needs; 127.0.0.1: this host only)")
    ready_batch_age_s: float | None = Field(
        default=None, gt=0, description="/readyz fails when the query reported no batch "
        "(nor Spark's idle report) for this long; default 3 × trigger.interval + 60 s")
    ready_restarts: int = Field(default=2, ge=1, description="/readyz fails after this "
                                "many query restarts in a row without a committed batch")
