"""The FS Data Sink's configuration file, read as a lakesink configuration.

``lakesink run --config fds.yaml`` (a YAML file, or an INI file ``.ini``/``.cfg`` with
the same sections, lists comma-separated) whose ``source`` has the FS Data Sink's flat
keys or that has a ``sink`` section is translated (``../shared/reference/peers.md``
§2.3). Its environment variables override the file, as they do there (``SOURCE_TYPE``,
``KAFKA_*``, ``REDIS_HOST`` / ``REDIS_PORT`` / ``REDIS_STREAM_KEYS`` /
``REDIS_CONSUMER_*``, ``S3_BUCKET`` / ``S3_PREFIX``, ``AWS_REGION``, ``HDFS_URL`` /
``HDFS_BASE_PATH``).

=====================================================  ===================================
FS Data Sink                                           lakesink
=====================================================  ===================================
``source.type`` kafka / redis                          ``source.kafka`` / ``source.redis``
``bootstrap_servers`` / ``topics`` / ``group_id``      ``source.kafka.*`` (the same names)
``extra_config.auto_offset_reset``                     ``source.kafka.starting_offsets``
``host`` / ``port`` / ``db``                           ``source.redis.*``
``stream_keys`` / ``list_keys``                        ``source.redis.streams`` / ``lists``
``consumer_group`` / ``consumer_name``                 ``source.redis.*``
(a stream entry's payload in field ``value``)          ``source.redis.value_field: value``
``continuous: false`` (Redis only)                     ``trigger.until_caught_up: true``
``value_format`` json / arrow_ipc                      ``decode.format``
``batch_size``                                         ignored: there only the poll size;
                                                       here it would bound every trigger
``sink.type: s3``, ``bucket`` / ``prefix``             ``table.base_path: s3a://bucket/prefix``
``region_name`` / ``endpoint_url``                     ``storage.s3.region`` / ``endpoint``
``sink.type: hdfs``, ``base_path``                     ``table.base_path`` (give it as
                                                       ``hdfs://namenode:8020/…``: the
                                                       file's ``url`` is WebHDFS, lakesink
                                                       writes over HDFS RPC)
``sink.type: local``, ``base_path``                    ``table.base_path``
``compression`` / ``partition_by``                     ``table.compression`` / ``partition_by``
                                                       (``brotli`` is refused: not offered)
``pipeline.flush_interval_seconds``                    ``trigger.interval``
(one topic or key)                                     ``table.name``: the key, as a folder
(more than one topic or key)                           one route per topic or key, each
                                                       into a table named by it (as the
                                                       FS Data Sink writes each to files
                                                       of its own)
=====================================================  ===================================

Secrets (``source.password``, ``sink.aws_access_key_id`` / ``aws_secret_access_key``,
``source.extra_config`` passwords, keys and tokens) are refused in the file, as lakesink refuses every secret in a config file: set
``REDIS_PASSWORD`` (or ``LAKESINK_SOURCE__REDIS__PASSWORD`` / ``…_FILE``) and the AWS
variables instead. Settings with no meaning here are listed by :func:`ignored`.
lakesink's own sections (``table``, ``decode``, ``routes``, ``storage``, …) may stand
beside the FS Data Sink's in the same file and win over what is translated.
"""

from __future__ import annotations

import configparser
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lakesink.errors import ConfigError

_FLAT = {"bootstrap_servers", "stream_keys", "list_keys", "value_format", "batch_size",
         "extra_config", "continuous"}
_LISTS = {"bootstrap_servers", "topics", "stream_keys", "list_keys", "partition_by"}
_SECRETS = {("source", "password"): "REDIS_PASSWORD",
            ("sink", "aws_access_key_id"): "AWS_ACCESS_KEY_ID",
            ("sink", "aws_secret_access_key"): "AWS_SECRET_ACCESS_KEY"}
# the FS Data Sink's own overrides: variable -> (section, key, is a comma list)
_ENV = {"SOURCE_TYPE": ("source", "type", False),
        "KAFKA_BOOTSTRAP_SERVERS": ("source", "bootstrap_servers", True),
        "KAFKA_TOPICS": ("source", "topics", True), "KAFKA_GROUP_ID": ("source", "group_id", False),
        "REDIS_HOST": ("source", "host", False), "REDIS_PORT": ("source", "port", False),
        "REDIS_STREAM_KEYS": ("source", "stream_keys", True),
        "REDIS_CONSUMER_GROUP": ("source", "consumer_group", False),
        "REDIS_CONSUMER_NAME": ("source", "consumer_name", False),
        "REDIS_CONTINUOUS": ("source", "continuous", False),
        "SINK_TYPE": ("sink", "type", False), "S3_BUCKET": ("sink", "bucket", False),
        "S3_PREFIX": ("sink", "prefix", False), "AWS_REGION": ("sink", "region_name", False),
        "HDFS_URL": ("sink", "url", False), "HDFS_BASE_PATH": ("sink", "base_path", False),
        "PIPELINE_FLUSH_INTERVAL_SECONDS": ("pipeline", "flush_interval_seconds", False)}
_IGNORED = {
    "sink.url": "WebHDFS; lakesink writes over HDFS RPC (table.base_path)",
    "sink.user": "set HADOOP_USER_NAME in the environment",
    "sink.merge_enabled": "lakesink writes each batch's files once; compaction is its own "
                          "command",
    "sink.merge_period": "see sink.merge_enabled", "sink.merge_min_files": "see "
    "sink.merge_enabled", "sink.merge_on_flush": "see sink.merge_enabled",
    "sink.extra_config": "use storage.* options",
    "telemetry": "lakesink logs to stderr; its own metrics are configured separately",
    "pipeline.max_batches": "use --until-caught-up for a run that ends",
    "pipeline.batch_timeout_seconds": "unused in the FS Data Sink too",
    "pipeline.error_handling": "bad records go to the dead-letter table, never dropped",
    "pipeline.flush_interval_batches": "every batch is written when it ends",
    "source.batch_size": "there only the poll size; lakesink sizes a batch by its trigger "
                         "(source.*.max_offsets_per_trigger / max_records_per_trigger)",
}
# extra_config keys that hold a secret (kafka-python / redis-py argument names)
_SECRET_WORDS = ("password", "secret", "token", "sasl_plain", "credential", "oauth")


def is_fds_file(data: Mapping[str, Any]) -> bool:
    source = data.get("source")
    return isinstance(data.get("sink"), dict) or (
        isinstance(source, dict) and bool(_FLAT & set(source)))


def read_ini(path: Path) -> dict[str, Any]:
    """An INI file with the YAML file's sections (list values comma-separated)."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text())
    except configparser.Error as exc:
        raise ConfigError("--config", f"{path} is not a valid INI file: {exc}") from None
    return {name: dict(parser[name]) for name in parser.sections()}


def ignored(data: Mapping[str, Any]) -> list[str]:
    """The FS Data Sink settings in ``data`` that lakesink accepts and does not use,
    each with why."""
    out = []
    for name, why in _IGNORED.items():
        section, _, key = name.partition(".")
        given = data.get(section)
        if isinstance(given, dict) and (not key and given or key in given):
            out.append(f"{name} ({why})")
    return out


def translate(data: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The lakesink configuration (a nested dict) of an FS Data Sink file, with its
    environment variables applied over the file as the FS Data Sink does."""
    fds: dict[str, dict[str, Any]] = {s: dict(data.get(s) or {}) for s in
                                      ("source", "sink", "pipeline")}
    for (section, key), var in _SECRETS.items():
        if fds[section].get(key) not in (None, ""):
            raise ConfigError(f"{section}.{key}", f"a secret in the config file; set {var} in "
                              "the environment (or the LAKESINK_* variable or its _FILE) "
                              "instead")
    for key in (fds["source"].get("extra_config") or {}):
        if any(word in str(key).lower() for word in _SECRET_WORDS):
            raise ConfigError(f"source.extra_config.{key}", "a secret in the config file; "
                              "set it in the environment (lakesink's LAKESINK_SOURCE__* "
                              "variable or its _FILE) instead")
    for var, (section, key, is_list) in _ENV.items():
        if env.get(var):
            fds[section][key] = env[var].split(",") if is_list else env[var]
    if env.get("REDIS_CONTINUOUS"):  # read there as lower() in ("true", "1", "yes")
        fds["source"]["continuous"] = env["REDIS_CONTINUOUS"].strip().lower() in (
            "true", "1", "yes")
    source, sink, pipeline = fds["source"], fds["sink"], fds["pipeline"]
    for section in (source, sink):
        for key in _LISTS & set(section):
            section[key] = _as_list(section[key])
    out: dict[str, Any] = {"source": _source(source), "table": _table(sink)}
    keys = (source.get("topics") or []) if out["source"]["type"] == "kafka" else [
        *source.get("stream_keys", []), *source.get("list_keys", [])]
    if len(keys) > 1:  # the FS Data Sink writes each topic or key to files of its own
        out["routes"] = [{"topics": [k], "table": {"name": table_name(k)}} for k in keys]
    elif keys:  # ... in a folder named by it
        out["table"]["name"] = table_name(keys[0])
    if source.get("value_format"):
        out["decode"] = {"format": source["value_format"]}
    storage = {k: sink[f] for f, k in (("region_name", "region"), ("endpoint_url", "endpoint"))
               if sink.get(f)}
    if storage:
        out["storage"] = {"s3": storage}
    trigger = {}
    if out["source"]["type"] == "redis" and _boolean("source.continuous",
                                                     source.get("continuous", True)) is False:
        trigger["until_caught_up"] = True  # one pass; Kafka there reads on regardless
    interval = pipeline.get("flush_interval_seconds")
    if interval is not None and str(interval).strip().lower() not in ("", "none", "null"):
        trigger["interval"] = f"{interval} seconds"
    if trigger:
        out["trigger"] = trigger
    own = {k: v for k, v in data.items() if k not in ("source", "sink", "telemetry",
                                                      "pipeline")}
    out = _merge(out, own)
    if str(sink.get("type") or "").lower() == "hdfs" and "base_path" not in out["table"]:
        raise ConfigError("sink.url", "the FS Data Sink writes HDFS over WebHDFS "
                          f"({sink.get('url')}); lakesink writes over HDFS RPC: add "
                          "`table: {base_path: hdfs://<namenode>:8020/"
                          f"{str(sink.get('base_path') or '').strip('/')}}}` to this file")
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (_merge(out[key], value) if isinstance(value, Mapping)
                    and isinstance(out.get(key), dict) else value)
    return out


def _source(source: dict[str, Any]) -> dict[str, Any]:
    kind = str(source.get("type") or "").lower()
    if kind == "kafka":
        kafka = {k: source[k] for k in ("topics", "group_id") if source.get(k)}
        if source.get("bootstrap_servers"):
            kafka["bootstrap_servers"] = ",".join(source["bootstrap_servers"])
        reset = (source.get("extra_config") or {}).get("auto_offset_reset")
        if reset in ("earliest", "latest"):
            kafka["starting_offsets"] = reset
        return {"type": "kafka", "kafka": kafka}
    if kind == "redis":
        redis = {k: source[k] for k in ("host", "port", "db", "consumer_group",
                                        "consumer_name") if source.get(k) not in (None, "")}
        for theirs, ours in (("stream_keys", "streams"), ("list_keys", "lists")):
            if source.get(theirs):
                redis[ours] = source[theirs]
        redis["value_field"] = "value"  # where the FS Data Sink reads an entry's payload
        return {"type": "redis", "redis": redis}
    raise ConfigError("source.type", f"the FS Data Sink file names source type {kind!r}; "
                      "kafka or redis")


def _table(sink: dict[str, Any]) -> dict[str, Any]:
    kind = str(sink.get("type") or "").lower()
    table: dict[str, Any] = {}
    base = str(sink.get("base_path") or "").strip("/")
    if kind == "s3" and sink.get("bucket"):
        prefix = str(sink.get("prefix") or "").strip("/")
        table["base_path"] = f"s3a://{sink['bucket']}" + (f"/{prefix}" if prefix else "")
    elif kind == "local" and base:
        table["base_path"] = str(sink["base_path"])
    elif kind not in ("", "hdfs"):
        raise ConfigError("sink.bucket" if kind == "s3" else "sink.base_path",
                          f"the FS Data Sink file's {kind!r} sink names no location")
    codec = str(sink.get("compression") or "").strip().lower()
    if codec == "brotli":
        raise ConfigError("sink.compression", "brotli is not offered by lakesink's Parquet "
                          "writer; use zstd (smaller files than snappy) or gzip")
    if codec:
        table["compression"] = codec
    if sink.get("partition_by"):
        table["partition_by"] = sink["partition_by"]
    return table


def table_name(key: str) -> str:
    """A table folder name for a topic or Redis key (``sensors:eu`` -> ``sensors_eu``)."""
    name = re.sub(r"[^A-Za-z0-9_\-.]", "_", key)
    return name if name[:1].isalnum() else f"t{name}"


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value or []]


def _boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()  # the FS Data Sink reads its INI with getboolean
    if word not in configparser.ConfigParser.BOOLEAN_STATES:
        raise ConfigError(key, f"{value!r} is not a boolean (true / false)")
    return configparser.ConfigParser.BOOLEAN_STATES[word]
