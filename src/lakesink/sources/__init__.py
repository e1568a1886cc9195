"""Sources: Kafka (Spark's built-in connector), Redis streams and lists, and Danube
(Python data sources). Every source yields the same record shape
(:mod:`lakesink.sources.records`); each kind is a class behind one interface
(:mod:`lakesink.sources.kinds`), and these functions are what the rest of lakesink asks
of the source."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakesink.sources.kinds import SourceKind, source_kind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakesink.config.source import SourceConfig


def describe(cfg: SourceConfig) -> str:
    """What is read, for logs (no secrets)."""
    return source_kind(cfg).describe()


def check_reachable(cfg: SourceConfig, timeout_s: float | None = None) -> None:
    """Fail with a clear error when the source's server does not answer in time (its
    ``connect_timeout_s``, or ``timeout_s``; 0: tried once)."""
    source_kind(cfg).check_reachable(timeout_s)


def check_access(spark: SparkSession, cfg: SourceConfig) -> None:
    """Refuse at start, with one line, a source that answers but will not let us read
    (Kafka: authentication, TLS trust, READ on the topics)."""
    source_kind(cfg).check_access(spark)


def read_stream(spark: SparkSession, cfg: SourceConfig, *, headers: bool = False,
                checkpoint: str | None = None) -> DataFrame:
    """The streaming source; ``headers`` adds the records' headers column. A source
    that keeps state beside Spark's (Danube's spool) keeps it in ``checkpoint``."""
    return source_kind(cfg).read_stream(spark, headers=headers, checkpoint=checkpoint)


def second_reader(cfg: SourceConfig, key: str) -> SourceConfig:
    """The source settings for a second query over the same records (silence
    detection): it must not take records from the ingestion — a Kafka consumer group
    of its own, Redis streams read without a group and never trimmed, a Danube
    subscription of its own. Redis lists are consumed by reading, so they cannot be
    read twice (ConfigError naming ``key``)."""
    return source_kind(cfg).second_reader(key)


def sample_values(spark: SparkSession, cfg: SourceConfig, *, limit: int, wait_s: float
                  ) -> list[str]:
    """Up to ``limit`` record values (as text) from the start of the source, without
    taking any (Redis lists are only looked at); waits up to ``wait_s`` for one."""
    return source_kind(cfg).sample_values(spark, limit=limit, wait_s=wait_s)


def settle(spark: SparkSession, cfg: SourceConfig, checkpoint: str) -> None:
    """Tell the source that every batch Spark recorded done is done, now.

    Spark calls a source's ``commit(end)`` for a batch only when it plans the *next*
    batch, so the last batch of a run (or before an idle period) would stay
    unacknowledged (Redis: pending in the group, its list items in a processing list)
    until the next run has new data. Called when a query has stopped; it commits the
    end of the newest batch in the checkpoint's commit log, which is durable in the
    table. Idempotent; Kafka needs nothing (its offsets live only in the checkpoint).
    """
    source_kind(cfg).settle(spark, checkpoint)


__all__ = [
    "SourceKind",
    "check_access",
    "check_reachable",
    "describe",
    "read_stream",
    "sample_values",
    "second_reader",
    "settle",
    "source_kind",
]
