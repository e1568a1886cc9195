"""Sources: Kafka (Spark's built-in connector), Redis streams and lists (Python data
sources). Every source yields the same record shape (:mod:`lakesink.sources.records`);
this module is the one place the rest of lakesink asks about the source."""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import TYPE_CHECKING

from lakesink.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakesink.config.models import DanubeSource, RedisSource, SourceConfig

logger = logging.getLogger(__name__)


def describe(cfg: SourceConfig) -> str:
    """What is read, for logs (no secrets)."""
    if cfg.danube is not None:
        return f"danube {cfg.danube.service_url} {cfg.danube.topics}"
    if cfg.redis is not None:
        r = cfg.redis
        parts = [f"streams {r.streams}" if r.streams else "", f"lists {r.lists}" if r.lists
                 else ""]
        return f"redis {r.host}:{r.port}/{r.db} " + " ".join(p for p in parts if p)
    assert cfg.kafka is not None
    return str(cfg.kafka.topics or cfg.kafka.topic_pattern)


def check_reachable(cfg: SourceConfig) -> None:
    """Fail with a clear error when the source's server does not answer in time."""
    if cfg.danube is not None:
        _check_tcp(cfg.danube.service_url, cfg.danube.connect_timeout_s,
                   "source.danube.service_url")
    elif cfg.redis is not None:
        from lakesink.sources import redis_conn

        redis_conn.check_reachable(cfg.redis)
    else:
        from lakesink.sources import kafka

        assert cfg.kafka is not None
        kafka.check_reachable(cfg.kafka)


def check_access(spark: SparkSession, cfg: SourceConfig) -> None:
    """Refuse at start, with one line, a source that answers but will not let us read
    (Kafka: authentication, TLS trust, READ on the topics; see
    :func:`lakesink.sources.kafka_admin.check_access`)."""
    if cfg.kafka is not None:
        from lakesink.sources import kafka_admin

        kafka_admin.check_access(spark, cfg.kafka)


def read_stream(spark: SparkSession, cfg: SourceConfig, *, headers: bool = False,
                checkpoint: str | None = None) -> DataFrame:
    """The streaming source; ``headers`` adds the records' headers column. A source
    that keeps state beside Spark's (Danube's spool) keeps it in ``checkpoint``."""
    if cfg.danube is not None:
        return _danube_stream(spark, cfg, headers=headers, checkpoint=checkpoint)
    if cfg.redis is not None:
        return _redis_stream(spark, cfg.redis, headers=headers, checkpoint=checkpoint)
    from lakesink.sources import kafka

    assert cfg.kafka is not None
    return kafka.read_stream(spark, cfg.kafka, headers=headers, checkpoint=checkpoint)


def second_reader(cfg: SourceConfig, key: str) -> SourceConfig:
    """The source settings for a second query over the same records (silence
    detection): it must not take records from the ingestion — a Kafka consumer group
    of its own, Redis streams read without a group and never trimmed. Redis lists are
    consumed by reading, so they cannot be read twice (ConfigError naming ``key``)."""
    if cfg.danube is not None:  # a subscription of its own gets every message too
        d = cfg.danube
        danube = d.model_copy(update={
            "subscription": None,
            "subscriptions": {t: f"{d.subscription_of(t)}-{key}" for t in d.topics}})
        return cfg.model_copy(update={"danube": danube})
    if cfg.redis is not None:
        if cfg.redis.lists:
            raise ConfigError(key, "needs a source that can be read twice (Kafka topics or "
                              "Redis streams); Redis lists are consumed by the ingestion")
        if cfg.redis.trim_on_commit:
            raise ConfigError(key, "reads the streams a second time, and "
                              "source.redis.trim_on_commit would trim entries it has not "
                              "read yet; turn one of them off")
        redis = cfg.redis.model_copy(update={"consumer_group": None, "trim_on_commit": False})
        return cfg.model_copy(update={"redis": redis})
    assert cfg.kafka is not None
    if cfg.kafka.group_id:
        kafka = cfg.kafka.model_copy(update={"group_id": f"{cfg.kafka.group_id}-silence"})
        return cfg.model_copy(update={"kafka": kafka})
    return cfg


def sample_values(spark: SparkSession, cfg: SourceConfig, *, limit: int, wait_s: float
                  ) -> list[str]:
    """Up to ``limit`` record values (as text) from the start of the source, without
    taking any (Redis lists are only looked at); waits up to ``wait_s`` for one."""
    if cfg.danube is not None:
        raise ConfigError("decode.schema", "a Danube source cannot be sampled without "
                          "taking its messages; declare decode.schema")
    if cfg.redis is None:
        from lakesink.sources import kafka

        assert cfg.kafka is not None
        return kafka.sample_values(spark, cfg.kafka, limit=limit, wait_s=wait_s)
    deadline = time.monotonic() + wait_s
    while True:
        values = _redis_samples(cfg.redis, limit)
        if values or time.monotonic() >= deadline:
            return values
        logger.info("waiting for records to infer a schema from…")
        time.sleep(2.0)


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


def settle(spark: SparkSession, cfg: SourceConfig, checkpoint: str) -> None:
    """Tell the source that every batch Spark recorded done is done, now.

    Spark calls a source's ``commit(end)`` for a batch only when it plans the *next*
    batch, so the last batch of a run (or before an idle period) would stay
    unacknowledged (Redis: pending in the group, its list items in a processing list)
    until the next run has new data. Called when a query has stopped; it commits the
    end of the newest batch in the checkpoint's commit log, which is durable in the
    table. Idempotent; Kafka needs nothing (its offsets live only in the checkpoint).
    """
    if cfg.redis is None and cfg.danube is None:
        return
    from lakesink.sources import redis_lists, redis_streams
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
        return
    r = cfg.redis
    for end in per_source:
        if cfg.danube is not None:
            from lakesink.sources.danube import DanubeReader

            reader = DanubeReader(_danube_options(cfg.danube, checkpoint))
            try:
                reader.settle({k: v for k, v in end.items() if k in cfg.danube.topics})
            finally:
                reader.stop()
            continue
        assert r is not None
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


__all__ = [
    "check_access",
    "check_reachable",
    "describe",
    "read_stream",
    "sample_values",
    "second_reader",
    "settle",
]
