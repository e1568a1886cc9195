"""The ``silence`` section: per-key silence detection."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from lakesink.config.base import NAME, Section, spark_duration


class SilenceConfig(Section):
    """Per-key silence detection (the Quix ``stream_timeout``), on checkpointed state.

    Off unless both ``timeout_ms`` and at least one output (``topic``, ``table``,
    ``callback``) are given; one without the other is a configuration error."""

    timeout_ms: int | None = Field(default=None, gt=0, description="a key silent this "
                                   "long fires one event")
    key: str | None = Field(default=None, description="SQL over the Kafka columns (key, "
                            "value, topic, partition, offset, timestamp, headers) giving "
                            "the tracked key; default: the record key")
    time: Literal["processing", "event"] = Field(
        default="processing", description="processing: silence on the wall clock; event: "
        "on record times (the watermark), for replays of historical data")
    event_time: str = Field(default="timestamp", description="time: event — SQL over the "
                            "Kafka columns giving the record's time; default: the Kafka "
                            "timestamp")
    watermark_delay: str = Field(default="0 seconds", description="time: event — how late "
                                 "a record may be and still count")
    topic: str | None = Field(default=None, description="Kafka topic (on the source's "
                              "brokers) for the events")
    table: str | None = Field(default=None, description="table (under table.base_path, "
                              "in table.format) for the events")
    callback: str | None = Field(default=None, description="module:function called with "
                                 "the key bytes (and the event, if it takes two arguments)")
    callback_timeout_s: float = Field(default=10.0, gt=0, description="longest wait for a "
                                      "batch's callbacks; a hung call is logged and left")
    ttl_factor: float = Field(default=3.0, gt=1, description="state silent this many "
                              "timeouts is dropped without an event (logged)")
    trigger_interval: str | None = Field(default=None, description="how often silence is "
                                         "checked; default: timeout/5, within 1 s..30 s")
    checkpoint: str | None = Field(default=None, description="default: the ingestion "
                                   "checkpoint's path + '_silence'")

    @field_validator("trigger_interval", "watermark_delay")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        return None if value is None else spark_duration(value)

    @field_validator("timeout_ms", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number of milliseconds, not a boolean")
        return value

    @field_validator("callback")
    @classmethod
    def _callback(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
            raise ValueError("must be module:function, e.g. alerts.hooks:on_silence")
        return value

    @field_validator("table")
    @classmethod
    def _table(cls, value: str | None) -> str | None:
        if value is not None and not NAME.match(value):
            raise ValueError("not a table name (letters, digits, '_', '-', '.')")
        return value

    @model_validator(mode="after")
    def _both_or_neither(self) -> SilenceConfig:
        outputs = [k for k in ("topic", "table", "callback") if getattr(self, k)]
        if self.timeout_ms is not None and not outputs:
            raise ValueError("silence.timeout_ms: is set but no output is; add "
                             "silence.topic, silence.table or silence.callback")
        if outputs and self.timeout_ms is None:
            raise ValueError(f"silence.timeout_ms: required when silence.{outputs[0]} "
                             "is set")
        return self

    @property
    def enabled(self) -> bool:
        return self.timeout_ms is not None

    @property
    def interval(self) -> str:
        if self.trigger_interval:
            return self.trigger_interval
        ms = max(1000, min((self.timeout_ms or 0) // 5, 30000))
        return f"{ms} milliseconds"
