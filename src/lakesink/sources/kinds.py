"""One class per kind of source — Kafka, Redis (streams and lists), Danube — behind one
interface, :class:`SourceKind`, picked once from the config (:func:`source_kind`).

The contract every kind keeps (``DESIGN.md``, "nothing acknowledged before it is
durable"): the offsets of a batch live in Spark's checkpoint; a source is acknowledged —
Redis entries acked or trimmed, list items dropped from the processing list, Danube
messages acked — only in the reader's ``commit(end)``, which Spark calls after the
batch's table commit, and in :meth:`SourceKind.settle` for the last batch of a run (read
from the checkpoint's commit log, so only batches recorded done). Kafka's position is
the checkpoint alone: nothing to acknowledge.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol

from lakesink.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakesink.config.source import DanubeSource, KafkaSource, RedisSource, SourceConfig

logger = logging.getLogger("lakesink.sources")


class SourceKind(Protocol):
    """What lakesink asks of a source, whatever its kind."""

    def describe(self) -> str:
        """What is read, for logs (no secrets)."""

    def check_reachable(self, timeout_s: float | None = None) -> None:
        """Fail with a clear error when the source's server does not answer within
        ``timeout_s`` (default: the kind's ``connect_timeout_s``, the wait of a start;
        0: tried once, as ``lakesink status`` does)."""

    def check_access(self, spark: SparkSession) -> None:
        """Refuse at start, with one line, a source that answers but will not let us
        read (nothing to check for most kinds)."""

    def read_stream(self, spark: SparkSession, *, headers: bool,
                    checkpoint: str | None) -> DataFrame:
        """The streaming source; ``headers`` adds the records' headers column. A kind
        that keeps state beside Spark's keeps it in ``checkpoint``."""

    def second_reader(self, key: str) -> SourceConfig:
        """The source settings for a second query over the same records (silence
        detection), which must not take records from the ingestion; ConfigError naming
        ``key`` when the kind cannot be read twice."""

    def sample_values(self, spark: SparkSession, *, limit: int, wait_s: float) -> list[str]:
        """Up to ``limit`` record values (as text) from the start, without taking any;
        waits up to ``wait_s`` for one."""

    def settle(self, spark: SparkSession, checkpoint: str) -> None:
        """Acknowledge every batch Spark recorded done in ``checkpoint`` (idempotent)."""

    def latest(self, checkpoint: str, end: dict[str, Any]) -> dict[str, Any]:
        """The source's latest offset for the keys of a batch's ``end`` offsets, as its
        reader reports it to Spark, read without Spark (``lakesink status``'s lag)."""


def source_kind(cfg: SourceConfig) -> SourceKind:
    """The kind of source ``cfg`` configures (the one place that tells them apart)."""
    if cfg.danube is not None:
        return DanubeKind(cfg, cfg.danube)
    if cfg.redis is not None:
        return RedisKind(cfg, cfg.redis)
    assert cfg.kafka is not None
    return KafkaKind(cfg, cfg.kafka)


def _done_ends(spark: SparkSession, checkpoint: str) -> list[dict] | None:
    """Per source, the end offsets of the newest batch in the checkpoint's commit log
    (durable in the table); None (said) when the offset log is not the format lakesink
    reads."""
    from lakesink.sources.offsets import log_sources
    from lakesink.tables.fs import HadoopFS, join

    fs = HadoopFS(spark, checkpoint)
    done = [int(f.relative) for f in fs.list_files(join(checkpoint, "commits"))
            if f.relative.isdigit()]
    text = fs.read_text(join(checkpoint, "offsets", str(max(done)))) if done else None
    per_source = log_sources(text)
    if per_source is None:
        logger.warning("offset log %s is not in the format lakesink reads (%s); the source "
                       "is told about its last batch when the next batch starts",
                       max(done), (text or "")[:20])
    return per_source


class KafkaKind:
    """Kafka through Spark's own connector (:mod:`lakesink.sources.kafka`)."""

    def __init__(self, cfg: SourceConfig, kafka: KafkaSource) -> None:
        self.cfg, self.kafka = cfg, kafka

    def describe(self) -> str:
        return f"kafka {self.kafka.bootstrap_servers} {self.kafka.topics or self.kafka.topic_pattern}"

    def check_reachable(self, timeout_s: float | None = None) -> None:
        from lakesink.sources import kafka

        kafka.check_reachable(self.kafka, timeout_s)

    def check_access(self, spark: SparkSession) -> None:
        """Authentication, TLS trust, READ on the topics
        (:func:`lakesink.sources.kafka_admin.check_access`)."""
        from lakesink.sources import kafka_admin

        kafka_admin.check_access(spark, self.kafka)

    def read_stream(self, spark: SparkSession, *, headers: bool,
                    checkpoint: str | None) -> DataFrame:
        from lakesink.sources import kafka

        return kafka.read_stream(spark, self.kafka, headers=headers, checkpoint=checkpoint)

    def second_reader(self, key: str) -> SourceConfig:
        """A consumer group of its own (when one is set)."""
        if self.kafka.group_id:
            kafka = self.kafka.model_copy(update={"group_id": f"{self.kafka.group_id}-silence"})
            return self.cfg.model_copy(update={"kafka": kafka})
        return self.cfg

    def sample_values(self, spark: SparkSession, *, limit: int, wait_s: float) -> list[str]:
        from lakesink.sources import kafka

        return kafka.sample_values(spark, self.kafka, limit=limit, wait_s=wait_s)

    def settle(self, spark: SparkSession, checkpoint: str) -> None:
        """Nothing: Kafka's offsets live only in the checkpoint."""

    def latest(self, checkpoint: str, end: dict[str, Any]) -> dict[str, Any]:
        """The broker's end offsets (librdkafka)."""
        from confluent_kafka import Consumer, TopicPartition

        from lakesink.sources.kafka_client import librdkafka_conf

        consumer = Consumer(librdkafka_conf(self.kafka))
        try:
            out: dict[str, dict[str, int]] = {}
            for topic, parts in sorted(end.items()):
                for partition in sorted((p for p in (parts if isinstance(parts, dict)
                                                     else {}) if str(p).isdigit()), key=int):
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, int(partition)),
                        timeout=self.kafka.connect_timeout_s)
                    out.setdefault(topic, {})[str(partition)] = high
            return out
        finally:
            consumer.close()


class RedisKind:
    """Redis streams and lists, as Python data sources
    (:mod:`lakesink.sources.redis_streams`, :mod:`lakesink.sources.redis_lists`)."""

    def __init__(self, cfg: SourceConfig, redis: RedisSource) -> None:
        self.cfg, self.redis = cfg, redis

    def describe(self) -> str:
        r = self.redis
        parts = [f"streams {r.streams}" if r.streams else "", f"lists {r.lists}" if r.lists
                 else ""]
        return f"redis {r.host}:{r.port}/{r.db} " + " ".join(p for p in parts if p)

    def check_reachable(self, timeout_s: float | None = None) -> None:
        from lakesink.sources import redis_conn

        redis_conn.check_reachable(self.redis, timeout_s)

    def check_access(self, spark: SparkSession) -> None:
        pass

    def read_stream(self, spark: SparkSession, *, headers: bool,
                    checkpoint: str | None) -> DataFrame:
        return _redis_stream(spark, self.redis, headers=headers, checkpoint=checkpoint)

    def second_reader(self, key: str) -> SourceConfig:
        """Streams read without a group and never trimmed; lists are consumed by
        reading, so they cannot be read twice."""
        if self.redis.lists:
            raise ConfigError(key, "needs a source that can be read twice (Kafka topics or "
                              "Redis streams); Redis lists are consumed by the ingestion")
        if self.redis.trim_on_commit:
            raise ConfigError(key, "reads the streams a second time, and "
                              "source.redis.trim_on_commit would trim entries it has not "
                              "read yet; turn one of them off")
        redis = self.redis.model_copy(update={"consumer_group": None, "trim_on_commit": False})
        return self.cfg.model_copy(update={"redis": redis})

    def sample_values(self, spark: SparkSession, *, limit: int, wait_s: float) -> list[str]:
        """Streams read with ``XRANGE``, lists only looked at (``LRANGE``)."""
        deadline = time.monotonic() + wait_s
        while True:
            values = _redis_samples(self.redis, limit)
            if values or time.monotonic() >= deadline:
                return values
            logger.info("waiting for records to infer a schema from…")
            time.sleep(2.0)

    def settle(self, spark: SparkSession, checkpoint: str) -> None:
        """The streams' entries acked (trimmed) and the lists' processing lists dropped,
        up to the newest batch recorded done."""
        from lakesink.sources import redis_lists, redis_streams

        r = self.redis
        for end in _done_ends(spark, checkpoint) or []:
            streams = {k: v for k, v in end.items() if k in r.streams and isinstance(v, dict)}
            lists = {k: v for k, v in end.items() if k in r.lists and isinstance(v, int)}
            for ends, reader in ((streams, redis_streams.RedisStreamsReader),
                                 (lists, redis_lists.RedisListsReader)):
                if ends:
                    source = reader(_redis_options(r, "streams" if ends is streams
                                                   else "lists", checkpoint=checkpoint))
                    try:
                        source.commit(ends)
                    finally:
                        source.stop()

    def latest(self, checkpoint: str, end: dict[str, Any]) -> dict[str, Any]:
        """The streams' ends and the lists' waiting items, as the readers report them."""
        from lakesink.sources.redis_lists import RedisListsReader
        from lakesink.sources.redis_streams import RedisStreamsReader

        latest: dict[str, Any] = {}
        for kind, reader, keys in (("streams", RedisStreamsReader, self.redis.streams),
                                   ("lists", RedisListsReader, self.redis.lists)):
            if any(k in end for k in keys):
                r = reader(_redis_options(self.redis, kind, checkpoint=checkpoint))
                try:
                    latest.update(r.reportLatestOffset() or {})
                finally:
                    r.stop()
        return latest


class DanubeKind:
    """Danube topics, captured into a spool in the checkpoint by a Python data source
    (:mod:`lakesink.sources.danube`)."""

    def __init__(self, cfg: SourceConfig, danube: DanubeSource) -> None:
        self.cfg, self.danube = cfg, danube

    def describe(self) -> str:
        return f"danube {self.danube.service_url} {self.danube.topics}"

    def check_reachable(self, timeout_s: float | None = None) -> None:
        _check_tcp(self.danube.service_url,
                   self.danube.connect_timeout_s if timeout_s is None else timeout_s,
                   "source.danube.service_url")

    def check_access(self, spark: SparkSession) -> None:
        pass

    def read_stream(self, spark: SparkSession, *, headers: bool,
                    checkpoint: str | None) -> DataFrame:
        return _danube_stream(spark, self.cfg, headers=headers, checkpoint=checkpoint)

    def second_reader(self, key: str) -> SourceConfig:
        """A subscription of its own gets every message too."""
        d = self.danube
        danube = d.model_copy(update={
            "subscription": None,
            "subscriptions": {t: f"{d.subscription_of(t)}-{key}" for t in d.topics}})
        return self.cfg.model_copy(update={"danube": danube})

    def sample_values(self, spark: SparkSession, *, limit: int, wait_s: float) -> list[str]:
        raise ConfigError("decode.schema", "a Danube source cannot be sampled without "
                          "taking its messages; declare decode.schema")

    def settle(self, spark: SparkSession, checkpoint: str) -> None:
        """The spool's messages acked up to the newest batch recorded done."""
        from lakesink.sources.danube import DanubeReader

        for end in _done_ends(spark, checkpoint) or []:
            reader = DanubeReader(_danube_options(self.danube, checkpoint))
            try:
                reader.settle({k: v for k, v in end.items() if k in self.danube.topics})
            finally:
                reader.stop()

    def latest(self, checkpoint: str, end: dict[str, Any]) -> dict[str, Any]:
        """The records received into the spool after the batch's position."""
        from lakesink.sources.danube import topic_dir
        from lakesink.sources.danube_spool import count_records

        spool = _danube_options(self.danube, checkpoint)["spool_dir"]
        return {t: {"waiting": count_records(topic_dir(spool, t), int(pos))[1]}
                for t, pos in end.items() if t in self.danube.topics and isinstance(pos, int)}


def _redis_samples(cfg: RedisSource, limit: int) -> list[str]:
    from lakesink.sources.redis_conn import Conn, decode_fields, source_options

    client = Conn.of(source_options(cfg, [])).client()
    out: list[str] = []
    try:
        for key in cfg.streams:
            for _, fields in client.xrange(key, "-", "+", count=limit - len(out)):
                value = decode_fields(fields, cfg.value_field, None)[1]
                if value is not None:
                    out.append(value.decode("utf-8", "replace"))
            if len(out) >= limit:
                return out
        for key in cfg.lists:
            out.extend(v.decode("utf-8", "replace")
                       for v in client.lrange(key, 0, limit - len(out) - 1))
            if len(out) >= limit:
                return out
        return out
    finally:
        client.close()


def _redis_options(cfg: RedisSource, kind: str, headers: bool = False, *,
                   checkpoint: str | None) -> dict[str, str]:
    """The data source options of the ``streams`` or ``lists`` reader (secrets included:
    for Spark and the readers only). ``owner``, the checkpoint, owns the lists'
    processing lists: the query and :func:`settle` must name the same one."""
    from lakesink.sources.redis_conn import source_options

    opts = {"headers": str(headers).lower(), "consumer": cfg.consumer_name,
            "owner": (checkpoint or "").rstrip("/")}
    if kind == "streams":
        opts.update(starting_position=cfg.starting_position, group=cfg.consumer_group or "",
                    trim_on_commit=str(cfg.trim_on_commit).lower())
    return source_options(cfg, getattr(cfg, kind), **opts)


def _check_tcp(url: str, timeout_s: float, key: str) -> None:
    from urllib.parse import urlsplit

    from lakesink.sources.net import wait_for_tcp

    parts = urlsplit(url if "://" in url else f"http://{url}")
    wait_for_tcp([(parts.hostname or "", parts.port or 6650)], timeout_s,
                 what=f"nothing answers at {url}", key=key)


def _danube_stream(spark: SparkSession, cfg: SourceConfig, *, headers: bool,
                   checkpoint: str | None) -> DataFrame:
    from lakesink.sources import danube

    d = cfg.danube
    assert d is not None
    if checkpoint is None or not (checkpoint.startswith("file:") or "://" not in checkpoint):
        raise ConfigError("checkpoint", "a Danube source keeps its captured batches in the "
                          "checkpoint, which must be on local disk (or a mounted volume) "
                          f"for now; got {checkpoint}")
    if id(spark) not in _DANUBE:
        spark.dataSource.register(danube.DanubeDataSource)
        _DANUBE.add(id(spark))
    opts = _danube_options(d, checkpoint, headers)
    return spark.readStream.format(danube.FORMAT).options(**opts).load()


def _danube_options(d: DanubeSource, checkpoint: str, headers: bool = False
                    ) -> dict[str, str]:
    from lakesink.tables.fs import local_path

    return {"service_url": d.service_url, "topics": json.dumps(d.topics),
            "subscriptions": json.dumps({t: d.subscription_of(t) for t in d.topics}),
            "subscription_type": d.subscription_type,
            "consumer_name": d.consumer_name or f"lakesink-{socket.gethostname()}",
            "max_spool_bytes": str(d.max_spool_mb << 20), "max_records": str(d.max_records_per_trigger),
            "idle_s": str(d.idle_s), "connect_timeout_s": str(d.connect_timeout_s),
            "headers": str(headers).lower(),
            "spool_dir": str(local_path(checkpoint.rstrip("/") + "/sources/danube"))}


_DANUBE: set[int] = set()
_REGISTERED: set[int] = set()


def _redis_stream(spark: SparkSession, cfg: RedisSource, *, headers: bool,
                  checkpoint: str | None) -> DataFrame:
    from lakesink.sources import redis_lists, redis_streams

    if id(spark) not in _REGISTERED:
        spark.dataSource.register(redis_streams.RedisStreamsDataSource)
        spark.dataSource.register(redis_lists.RedisListsDataSource)
        _REGISTERED.add(id(spark))
    frames = [spark.readStream.format(fmt).options(
                  **_redis_options(cfg, kind, headers, checkpoint=checkpoint)).load()
              for kind, fmt in (("streams", redis_streams.FORMAT),
                                ("lists", redis_lists.FORMAT)) if getattr(cfg, kind)]
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    return frame
