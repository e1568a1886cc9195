"""The ``trigger``, ``spark`` and ``retry`` sections: how the query runs."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    Field,
    field_validator,
)

from lakesink.config.base import Section, spark_duration, stringify_map
from lakesink.config.secrets import refuse_secrets


class TriggerConfig(Section):
    interval: str = Field(default="10 seconds", description="micro-batch interval")
    until_caught_up: bool = Field(
        default=False, description="process what the topic holds now, then exit"
    )

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        return spark_duration(value)


class SparkConfig(Section):
    master: str | None = "local[*]"
    app_name: str = "lakesink"
    driver_memory: str | None = "1g"
    log_level: Literal["ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"] = "WARN"
    conf: dict[str, str] = Field(default_factory=dict)

    _strings = field_validator("conf", mode="before")(stringify_map)

    @field_validator("conf")
    @classmethod
    def _spark_keys(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not k.startswith("spark.")]
        if bad:
            raise ValueError(f"keys must start with 'spark.': {bad}")
        refuse_secrets(value, "spark.conf", "storage.<store>.secret_options or the "
                       "section's credential fields")
        if "spark.redaction.regex" in value:
            _check_redaction(value["spark.redaction.regex"])
        return value


#: settings that hold secrets lakesink passes to Spark (S3 keys, session tokens, Kafka's
#: JAAS line, passwords of stores and registries): a ``spark.redaction.regex`` of the
#: user's must still hide each, or Spark's event log and plans would show them
SECRET_SETTINGS = ("spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key",
                   "spark.hadoop.fs.s3a.session.token", "kafka.sasl.jaas.config",
                   "kafka.ssl.keystore.password", "kafka.ssl.truststore.password",
                   "schema.registry.basic.auth.user.info.password")


def _check_redaction(regex: str) -> None:
    """Refuse a ``spark.redaction.regex`` that no longer covers lakesink's secrets
    (checked with Python's ``re``, which reads Java's common syntax the same way)."""
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        raise ValueError(f"spark.redaction.regex {regex!r} could not be checked ({exc}); "
                         "lakesink keeps secrets out of Spark's logs with it") from None
    bare = [k for k in SECRET_SETTINGS if not pattern.search(k)]
    if bare:
        raise ValueError(f"spark.redaction.regex {regex!r} does not cover "
                         f"{', '.join(bare)}: Spark would write those secrets to its event "
                         "log and plans; extend the default (?i)secret|password|token|"
                         "access[.]?key|jaas instead of replacing it")


class RetryConfig(Section):
    """Riding out a storage or broker that is briefly unavailable: a failed batch is
    tried again, and a failed query (e.g. its checkpoint could not be written) is
    restarted from its checkpoint, each with exponential backoff."""

    batch_attempts: int = Field(default=3, ge=1, description="tries of a failed batch "
                                "inside the running query")
    restarts: int = Field(default=5, ge=0, description="query restarts in a row without "
                          "a committed batch before the run stops (exit 1)")
    initial_backoff_s: float = Field(default=2.0, ge=0, description="first wait; doubles")
    max_backoff_s: float = Field(default=60.0, ge=0, description="longest wait")
