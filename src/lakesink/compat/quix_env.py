"""The Quix TS Datalake Sink's environment, read as a lakesink configuration.

``lakesink run --compat quix``, or ``lakesink run`` with no config file while ``input``
is set, takes the connector's variables (``../shared/reference/peers.md`` §2.1, both the
seed's form and the later "Lakehouse Sink" form) and writes the table the way the Quix
sink lays it out, so its readers and its start-up partition check keep working:

================================  =====================================================
Quix                              lakesink
================================  =====================================================
``input``                         ``source.kafka.topics``; the table's name by default
``TABLE_NAME``                    ``table.name`` (``^[a-zA-Z0-9][a-zA-Z0-9._-]*$``)
``HIVE_COLUMNS``                  ``table.partition_by`` (``year``/``month``/``day``/
                                  ``hour`` derived from the timestamp)
``TIMESTAMP_COLUMN`` (``ts_ms``)  ``table.timestamp_column``; a record without it takes
                                  its Kafka timestamp, as the sink adds ``ts_ms``
``S3_BUCKET`` / ``S3_PREFIX``     ``table.base_path: s3a://<bucket>/<prefix>`` (prefix
(``data``)                        ``data`` when unset, as in the sink)
``Quix__BlobStorage__Connection   bucket, keys, region and endpoint of ``S3Compatible``;
__Json``                          the prefix ``<workspace>/data-lake/time-series``
``Quix__Workspace__Id``           (with the JSON) the prefix's first folder
``AWS_*``, ``AWS_ENDPOINT_URL``   ``storage.s3.*`` (as without compat)
``CATALOG_*``, ``AUTO_DISCOVER``, the Quix catalog (``catalog.quix``), as without compat
``Quix__Lakehouse__Catalog__*``
``KAFKA_BOOTSTRAP_SERVERS`` /     ``source.kafka.bootstrap_servers``
``Quix__Broker__Address``
``Quix__Sdk__Token``,             (no address given) the workspace's broker settings from
``Quix__Portal__Api``             the Portal API, as quixstreams asks for them: servers,
                                  SASL, the CA (:mod:`lakesink.compat.quix_portal`)
``CONSUMER_GROUP``                ``source.kafka.group_id`` (``s3_direct_sink_v1.0``;
                                  ``<Quix__Workspace__Id>-`` in front on the platform,
                                  as quixstreams does)
(take-over)                       ``starting_offsets: group``: a new checkpoint starts at
                                  ``CONSUMER_GROUP``'s committed offsets (where the Quix
                                  sink stopped), so nothing is read twice
``AUTO_OFFSET_RESET`` (latest)    ``source.kafka.group_fallback``: partitions the group
                                  never committed; given, also a group that committed
                                  nothing (``group_missing: fallback``); unset, such a
                                  group is refused (latest would skip records)
``COMMIT_INTERVAL`` (30)          ``trigger.interval`` in seconds (30 when unset)
``BATCH_SIZE``                    accepted and ignored (a cap per trigger would throttle)
``KAFKA_VALUE_DESERIALIZER``      must be ``json`` (the sink's only working one)
``KAFKA_KEY_DESERIALIZER``,       accepted and ignored, logged once with why
``MAX_WRITE_WORKERS``
``LOGLEVEL``                      the log level (as without compat)
(layout)                          ``null_partition_value: __None__``, the key as
                                  ``__key`` (bytes), schema inferred from the topic
================================  =====================================================
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from lakesink.errors import ConfigError

logger = logging.getLogger(__name__)

#: the Quix sink's table name rule
TABLE_NAME_RULE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$")

#: variables accepted and not used, with why
IGNORED = {
    "BATCH_SIZE": "the Quix sink commits early after this many messages; as a per-trigger "
                  "cap it would throttle the stream (1000 per 30 s)",
    "MAX_WRITE_WORKERS": "Spark's tasks write the files; their number follows "
                         "table.files_per_partition",
    "KAFKA_KEY_DESERIALIZER": "the Quix sink stores the key's bytes whatever it says; "
                              "so does lakesink (__key, bytes)",
}


def applies(env: Mapping[str, str], *, has_file: bool, compat: str | None) -> bool:
    """Whether the Quix environment is the configuration: asked for, or ``input`` set
    and no config file given."""
    if compat == "off":  # another surface (lakesink kdi) is the config
        return False
    if compat is not None:
        if compat != "quix":
            raise ConfigError("--compat", f"unknown surface {compat!r} (quix)")
        return True
    return not has_file and bool(env.get("input"))


def translate(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the config, variables to add to the environment: the blob storage JSON's keys as
    ``AWS_*``, which only the environment may carry)."""
    topic = (env.get("input") or "").strip()
    if not topic:
        raise ConfigError("input", "the Quix sink's input topic is required (set input)")
    name = (env.get("TABLE_NAME") or "").strip() or topic
    if not TABLE_NAME_RULE.match(name):
        raise ConfigError("TABLE_NAME", f"{name!r} does not match the Quix table name rule "
                          f"{TABLE_NAME_RULE.pattern}")
    value_format = (env.get("KAFKA_VALUE_DESERIALIZER") or "json").strip()
    if value_format != "json":
        raise ConfigError("KAFKA_VALUE_DESERIALIZER", f"{value_format!r}: the Quix sink "
                          "writes JSON values only, and so does this surface (json)")
    kafka: dict[str, Any] = {
        "topics": [topic],
        "group_id": _group(env),
        # a new checkpoint starts where the Quix sink's group stopped: nothing twice
        "starting_offsets": "group",
        "group_fallback": _offset_reset(env.get("AUTO_OFFSET_RESET") or "latest"),
        # a group with no committed offset at all (a new deployment, or a misspelt or
        # expired group): AUTO_OFFSET_RESET given says where to start; unset, the
        # sink's default latest would skip what came since a Quix sink stopped
        "group_missing": "fallback" if (env.get("AUTO_OFFSET_RESET") or "").strip()
        else "refuse",
    }
    extra_env: dict[str, str] = {}
    servers = env.get("KAFKA_BOOTSTRAP_SERVERS") or env.get("Quix__Broker__Address")
    if servers:
        kafka["bootstrap_servers"] = servers
    elif (env.get("Quix__Sdk__Token") or "").strip():  # on the platform: ask its Portal
        kafka.update(_portal_broker(env, extra_env))
    table: dict[str, Any] = {
        "name": name,
        "partition_by": [c.strip() for c in (env.get("HIVE_COLUMNS") or "").split(",")
                         if c.strip()],
        "timestamp_column": (env.get("TIMESTAMP_COLUMN") or "ts_ms").strip(),
        "timestamp_fallback": "kafka",
        "null_partition_value": "__None__",
        "key_column": "__key",
        "key_format": "bytes",
    }
    blob = env.get("Quix__BlobStorage__Connection__Json")
    if blob:
        bucket, storage, keys = _blob_storage(blob, env)
        extra_env.update(keys)
        workspace = (env.get("Quix__Workspace__Id") or "").strip("/")
        prefix = "/".join(p for p in (workspace, "data-lake/time-series") if p)
        table["base_path"] = f"s3a://{bucket}/{prefix}"
    elif env.get("S3_BUCKET"):
        prefix = (env.get("S3_PREFIX") or "data").strip("/")
        table["base_path"] = f"s3a://{env['S3_BUCKET']}" + (f"/{prefix}" if prefix else "")
        storage = {}
    else:
        raise ConfigError("S3_BUCKET", "the Quix sink writes to S3: set S3_BUCKET (or "
                          "Quix__BlobStorage__Connection__Json)")
    data: dict[str, Any] = {"source": {"kafka": kafka}, "table": table}
    if storage:
        data["storage"] = {"s3": storage}
    interval = _positive_int(env, "COMMIT_INTERVAL") if env.get("COMMIT_INTERVAL") else 30
    data["trigger"] = {"interval": f"{interval} seconds"}  # the sink's default: 30 s
    return data, extra_env


def _portal_broker(env: Mapping[str, str], extra_env: dict[str, str]) -> dict[str, Any]:
    """``source.kafka`` settings from the Portal API's broker settings; the password
    goes to ``extra_env`` (:mod:`lakesink.compat.quix_portal`)."""
    from lakesink.compat import quix_portal

    kafka, secrets, unused = quix_portal.java_settings(quix_portal.fetch(env))
    for name, value in secrets.items():
        if not env.get(name):
            extra_env[name] = value
    logger.info("Kafka connection from the Quix Portal API (workspace %s): %s%s",
                env.get("Quix__Workspace__Id"), kafka["bootstrap_servers"],
                f"; librdkafka settings not carried over: {', '.join(unused)}"
                if unused else "")
    return kafka


def _group(env: Mapping[str, str]) -> str:
    """The Quix sink's consumer group as the broker knows it: on the Quix platform
    (``Quix__Workspace__Id`` set) quixstreams prefixes it with ``<workspace>-``."""
    group = (env.get("CONSUMER_GROUP") or "s3_direct_sink_v1.0").strip()
    workspace = (env.get("Quix__Workspace__Id") or "").strip()
    if workspace and not group.startswith(f"{workspace}-"):
        group = f"{workspace}-{group}"
    return group


def ignored(env: Mapping[str, str]) -> list[str]:
    """The set variables this surface accepts without using, each with why."""
    return [f"{name} ({why})" for name, why in IGNORED.items() if env.get(name)]


def _offset_reset(value: str) -> str:
    value = value.strip().lower()
    if value not in ("earliest", "latest"):
        raise ConfigError("AUTO_OFFSET_RESET", f"{value!r}: earliest or latest")
    return value


def _positive_int(env: Mapping[str, str], name: str) -> int:
    try:
        number = int(env[name])
    except ValueError:
        number = 0
    if number <= 0:
        raise ConfigError(name, f"{env[name]!r} is not a positive whole number")
    return number


def _blob_storage(text: str, env: Mapping[str, str]
                  ) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The platform's blob storage JSON (an S3-compatible store): (bucket, storage.s3
    settings, the keys as AWS_* variables unless the environment has its own)."""
    key = "Quix__BlobStorage__Connection__Json"
    try:
        blob = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(key, f"not JSON ({exc.msg})") from None
    s3 = blob.get("S3Compatible") if isinstance(blob, dict) else None
    if not isinstance(s3, dict) or not s3.get("BucketName"):
        provider = blob.get("Provider") if isinstance(blob, dict) else None
        raise ConfigError(key, f"provider {provider!r}: only an S3Compatible store with a "
                          "BucketName is supported")
    storage: dict[str, Any] = {}
    if s3.get("ServiceUrl"):
        storage["endpoint"] = s3["ServiceUrl"]
    if s3.get("Region"):
        storage["region"] = s3["Region"]
    extra = {}
    if s3.get("AccessKeyId") and s3.get("SecretAccessKey") and not env.get(
            "AWS_ACCESS_KEY_ID"):
        extra = {"AWS_ACCESS_KEY_ID": str(s3["AccessKeyId"]),
                 "AWS_SECRET_ACCESS_KEY": str(s3["SecretAccessKey"])}
    return str(s3["BucketName"]), storage, extra
