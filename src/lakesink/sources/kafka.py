"""Kafka through Spark's own connector (``spark-sql-kafka-0-10``).

Offsets live in the Spark checkpoint, not in the consumer group: a batch's offsets
are acknowledged only when Spark marks the batch done, after the table commit.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from lakesink.config.source import KafkaSource, bootstrap_hosts
from lakesink.sources.kafka_client import client_options
from lakesink.sources.net import wait_for_tcp

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

def source_options(cfg: KafkaSource) -> dict[str, str]:
    """Options for ``spark.readStream.format("kafka")``."""
    opts = {f"kafka.{k}": v for k, v in client_options(cfg).items()}
    if cfg.topics:
        opts["subscribe"] = ",".join(cfg.topics)
    else:
        assert cfg.topic_pattern
        opts["subscribePattern"] = cfg.topic_pattern
    opts["startingOffsets"] = cfg.starting_offsets
    opts["failOnDataLoss"] = str(cfg.fail_on_data_loss).lower()
    if cfg.max_offsets_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(cfg.max_offsets_per_trigger)
    return opts


def check_reachable(cfg: KafkaSource, timeout_s: float | None = None) -> None:
    """Fail with a clear error when no bootstrap server accepts a TCP connection within
    ``timeout_s`` (default ``connect_timeout_s``; 0: tried once)."""
    wait_for_tcp(bootstrap_hosts(cfg.bootstrap_servers),
                 cfg.connect_timeout_s if timeout_s is None else timeout_s,
                 what=f"no Kafka broker reachable at {cfg.bootstrap_servers}",
                 key="source.kafka.bootstrap_servers")


def read_stream(spark: SparkSession, cfg: KafkaSource, *, headers: bool = False,
                checkpoint: str | None = None) -> DataFrame:
    """The streaming source; ``headers`` adds the records' headers column.

    A new ``checkpoint`` (no query started there yet: no offset or source log) is where
    a take-over happens: ``starting_offsets: group`` is read from the group, and
    ``require_idle_group`` refuses while the group has active members. Once a query has
    started there, Spark starts from its logs and ignores ``startingOffsets``: the group
    is not asked again."""
    reader = spark.readStream.format("kafka")
    if headers:
        reader = reader.option("includeHeaders", "true")
    opts = source_options(cfg)
    fresh = cfg.starting_offsets == "group" or cfg.checks_idle_group
    if fresh and checkpoint is not None:
        from lakesink.tables.fs import HadoopFS
        from lakesink.tables.identity import has_started

        fresh = not has_started(HadoopFS(spark, checkpoint), checkpoint)
    if cfg.starting_offsets == "group":
        from lakesink.sources.kafka_admin import group_offsets

        # with offsets in the checkpoint, Spark ignores this (it wants a valid value)
        opts["startingOffsets"] = group_offsets(spark, cfg) if fresh else "earliest"
    elif fresh:
        from lakesink.sources.kafka_admin import check_idle_group

        check_idle_group(spark, cfg)
    for key, value in opts.items():
        reader = reader.option(key, value)
    return reader.load()


def sample_values(spark: SparkSession, cfg: KafkaSource, *, limit: int, wait_s: float
                  ) -> list[str]:
    """Up to ``limit`` record values (as text) from the start of the topic(s).

    Polls until at least one record exists or ``wait_s`` passes.
    """
    from pyspark.sql import functions as F

    opts = {k: v for k, v in source_options(cfg).items()
            if k not in ("startingOffsets", "maxOffsetsPerTrigger")}
    opts.update({"startingOffsets": "earliest", "endingOffsets": "latest"})
    deadline = time.monotonic() + wait_s
    while True:
        reader = spark.read.format("kafka")
        for key, value in opts.items():
            reader = reader.option(key, value)
        rows = (reader.load().where(F.col("value").isNotNull())
                .select(F.col("value").cast("string").alias("v")).limit(limit).collect())
        if rows or time.monotonic() >= deadline:
            return [r.v for r in rows]
        logger.info("waiting for records to infer a schema from…")
        time.sleep(2.0)
