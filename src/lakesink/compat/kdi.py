"""kafka-delta-ingest's command lines, read as a lakesink configuration.

``lakesink kdi ingest`` takes the flags (and their environment fallbacks) of both the
upstream tool (``ingest <topic> <table_location>``) and the fork (``--topic``,
``--table_base_uri``); ``../shared/reference/peers.md`` §2.5. The table is a Delta
table; each flag maps as below, and the flags with no meaning here are accepted and
reported as ignored.

``lakesink kdi repair`` takes the fork's ``repair`` flags (:func:`parse_repair`): the
table's missing files are dropped from its log (lakesink's ``repair --apply``, delta-rs'
file system check as in the fork), then it is compacted (``OPTIMIZE``, files up to
``--optimize_target_size``, only the partition ``--optimize_partition`` =
``--optimize_partition_predicate`` when both are given).

Taking over (:func:`takeover_offsets`, asked by :mod:`lakesink.kdi`, which reads the
table and the broker): kafka-delta-ingest keeps its position in the
Delta log, as ``txn`` actions keyed ``<app_id>-<partition>`` whose version is the last
offset written. A new lakesink checkpoint starts right after them, so nothing it wrote
is read again; partitions without one start at ``--seek_offsets`` (+1, "seeking rather
than starting") or ``--auto_offset_reset``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lakesink.errors import ConfigError

#: flags parsed and not used: name -> (short flag, environment variable, why)
_UNUSED_FLAGS: dict[str, tuple[str | None, str, str]] = {
    "min_bytes_per_file": ("-b", "MIN_BYTES_PER_FILE",
                           "lakesink writes one file per partition folder per batch, split "
                           "at table.target_file_size; a batch is never held back for size"),
    "dlq_transform": (None, "DLQ_TRANSFORMS",
                      "dead letters keep the raw bytes and the reason, untransformed"),
    "statsd_endpoint": ("-s", "STATSD_ENDPOINT",
                        "lakesink exports Prometheus (--prometheus_port) and OTLP"),
    "housekeeping_loop_iteration": (None, "HOUSEKEEPING_LOOP_ITERATION",
                                    "Spark schedules the work"),
    "deserialization_workers": (None, "DESERIALIZATION_WORKERS", "Spark's tasks decode"),
    "num_arrow_writer_threads": (None, "NUM_ARROW_WRITER_THREADS", "Spark's tasks write"),
    "num_converting_workers": (None, "NUM_CONVERTING_WORKERS", "Spark's tasks convert"),
    "worker_to_messages_multiplier": (None, "WORKER_TO_MESSAGES_MULTIPLIER",
                                      "Spark's tasks decode"),
    "seconds_idle_kafka_read_before_flush": (None, "SECONDS_IDLE_KAFKA_READ_BEFORE_FLUSH",
                                             "a batch is written every allowed_latency"),
    "max_version_lookback": (None, "MAX_VERSION_LOOKBACK",
                             "lakesink reads its offsets from its checkpoint"),
}

#: librdkafka settings with no Java equivalent lakesink maps, with what to do instead
_LIBRDKAFKA_ONLY = {
    "ssl.certificate.location": "give the certificate and key as PEM text in "
                                "KAFKA_DELTA_INGEST_CERT and KAFKA_DELTA_INGEST_KEY",
    "ssl.key.location": "give the certificate and key as PEM text in "
                        "KAFKA_DELTA_INGEST_CERT and KAFKA_DELTA_INGEST_KEY",
    "ssl.certificate.pem": "give it in KAFKA_DELTA_INGEST_CERT (with KAFKA_DELTA_INGEST_KEY)",
    "enable.ssl.certificate.verification": "the Java client always verifies: give the CA "
                                           "(KAFKA_DELTA_INGEST_CA or -K ssl.ca.location)",
}

#: flags accepted and not used, with why
IGNORED = {
    "max_messages_per_batch": "it sizes kafka-delta-ingest's in-memory batches; as a "
                              "per-trigger cap it would throttle the stream",
    **{name: why for name, (_, _, why) in _UNUSED_FLAGS.items()},
}

#: ``lakesink kdi ingest --help``: (flags, environment variable, what lakesink does with
#: it), in kafka-delta-ingest's order; :func:`translate` is the truth this describes
INGEST_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("TOPIC, --topic", "KAFKA_TOPIC", "source.kafka.topics"),
    ("TABLE_LOCATION", "TABLE_LOCATION", "table.base_path and table.name (the folder's "
     "parent and name); the table is Delta"),
    ("--table_base_uri", "TABLE_BASE_URI", "table.base_path: a table per Avro record name "
     "with --avro (routes[].message_type), else the topic's table there"),
    ("-k, --kafka", "KAFKA_BROKERS", "source.kafka.bootstrap_servers"),
    ("-g, --consumer_group", "KAFKA_CONSUMER_GROUP", "source.kafka.group_id: a new "
     "checkpoint refuses while the group has active members"),
    ("-a, --app_id", "APP_ID", "the app id whose Delta txn versions the take-over starts "
     "after"),
    ("--seek_offsets", "KAFKA_SEEK_OFFSETS", "source.kafka.starting_offsets (where the "
     "table's txn is not ahead)"),
    ("-o, --auto_offset_reset", "KAFKA_AUTO_OFFSET_RESET", "source.kafka.starting_offsets "
     "of partitions without a position (earliest, latest)"),
    ("-l, --allowed_latency", "ALLOWED_LATENCY", "trigger.interval (seconds)"),
    ("--partition_columns", "PARTITION_COLUMNS", "table.partition_by"),
    ("-t, --transform", "TRANSFORMS", "table.transforms (the same text)"),
    ("--dlq_table_location", "DLQ_TABLE_LOCATION", "dlq.format: delta (dead letters in "
     "<base>/_rejected/<table>)"),
    ("-c, --checkpoints", "WRITE_CHECKPOINTS", "table.delta_checkpoint_interval: 10"),
    ("-K, --kafka_setting", "", "source.kafka.options (librdkafka names translated; "
     "librdkafka-only settings refused with what to give instead)"),
    ("--prometheus_port", "PROMETHEUS_PORT", "metrics.port"),
    ("--message_type_whitelist", "MESSAGE_TYPE_WHITELIST",
     "routes[].message_type.allow (searched, as the fork does)"),
    ("-e, --ends_at_latest_offsets", "ENDS_AT_LATEST_OFFSETS",
     "trigger.until_caught_up"),
    ("--avro URL, --protobuf URL", "AVRO_REGISTRY, PROTOBUF_REGISTRY",
     "decode.format and its registry"),
    ("--json", "JSON_REGISTRY", "plain JSON (the default); a JSON registry is refused"),
    ("--decompress_gzip", "DECOMPRESS_GZIP", "refused: gzip values are not supported"),
    ("--print-config", "", "lakesink's own: print the lakesink config (with the "
     "take-over's starting offsets) instead of running"),
    ("--no_takeover", "", "lakesink's own: table.other_writers: ignore (start without "
     "the table's txn offsets)"),
)


def help_text(command: str | None) -> str:
    """``--help`` of ``lakesink kdi`` (``command`` None), ``kdi ingest`` or ``kdi repair``."""
    if command == "repair":
        return ("Usage: lakesink kdi repair --table_url URL [--optimize_target_size N]\n"
                "       [--optimize_partition COL --optimize_partition_predicate VALUE]\n\n"
                "The fork's repair: files the Delta log references that are gone leave the\n"
                "table in one commit (lakesink repair --apply), then OPTIMIZE (lakesink\n"
                "compact) with the target size (default 100000000 bytes) and, given both,\n"
                "one partition. Variables: TABLE_URL, OPTIMIZE_TARGET_SIZE,\n"
                "OPTIMIZE_PARTITION, OPTIMIZE_PARTITION_PREDICATE.\n")
    if command != "ingest":
        return ("Usage: lakesink kdi ingest [TOPIC] [TABLE_LOCATION] [flags]\n"
                "       lakesink kdi repair --table_url URL [flags]\n\n"
                "kafka-delta-ingest's command lines (and environment variables), run by\n"
                "lakesink into the same Delta table, taking over from kafka-delta-ingest's\n"
                "offsets (its txn versions). `lakesink kdi ingest --help` lists every flag\n"
                "and what lakesink does with it. See docs/migrating.md.\n")
    width = max(len(f) for f, _, _ in INGEST_FLAGS)
    lines = ["Usage: lakesink kdi ingest [TOPIC] [TABLE_LOCATION] [flags]", "",
             "Each flag falls back to its environment variable, as in kafka-delta-ingest.",
             "", f"{'flag':<{width}}  {'variable':<24}  lakesink"]
    for flags, var, what in INGEST_FLAGS:
        lines.append(f"{flags:<{width}}  {var:<24}  {what}")
    lines += ["", "Accepted and not used (a note is printed when given):"]
    for name, why in IGNORED.items():
        lines.append(f"  --{name}: {why}")
    return "\n".join(lines) + "\n"


@dataclass
class KdiArgs:
    topic: str | None = None
    table_uri: str | None = None
    #: the fork's ``--table_base_uri``: a folder of tables, one per message type (the
    #: topic's name for JSON); upstream's ``table_location`` is the table itself
    table_is_base: bool = False
    kafka: str = "localhost:9092"
    consumer_group: str = "kafka_delta_ingest"
    app_id: str = "kafka_delta_ingest"
    seek_offsets: str | None = None
    auto_offset_reset: str | None = None
    allowed_latency: int = 300
    max_messages_per_batch: int | None = None
    partition_columns: str | None = None
    transforms: list[str] = field(default_factory=list)
    dlq_table_location: str | None = None
    checkpoints: bool = False
    kafka_settings: list[str] = field(default_factory=list)
    prometheus_port: int | None = None
    message_type_whitelist: str | None = None
    ends_at_latest_offsets: bool = False
    json_registry: str | None = None
    avro_registry: str | None = None
    protobuf_registry: str | None = None
    decompress_gzip: bool = False
    #: lakesink's own ``--no_takeover``: ignore the table's ``txn`` offsets
    no_takeover: bool = False
    #: ``KAFKA_DELTA_INGEST_CA`` / ``_CERT`` / ``_KEY`` (PEM text) and
    #: ``KAFKA_DELTA_INGEST_SCRAM_JSON`` (``{"username", "password"}``)
    ca_pem: str | None = None
    cert_pem: str | None = None
    key_pem: str | None = None
    scram: dict[str, str] | None = None
    #: the flags of :data:`IGNORED` that were given
    given_ignored: dict[str, Any] = field(default_factory=dict)


def split_table_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/path/table`` -> (``s3://bucket/path``, ``table``)."""
    trimmed = uri.rstrip("/")
    base, sep, name = trimmed.rpartition("/")
    if not sep or not name or base.endswith(":/") or base.endswith(":"):
        raise ConfigError("table_location", f"{uri!r}: give the table's folder, e.g. "
                          "s3://bucket/path/table or /data/table")
    return base or "/", name


def translate(a: KdiArgs) -> tuple[dict[str, Any], list[str]]:
    """(lakesink config as dotted flags, the ignored flags with why)."""
    if not a.topic:
        raise ConfigError("topic", "the Kafka topic is required (ingest <topic> <table>, "
                          "--topic or KAFKA_TOPIC)")
    if not a.table_uri:
        raise ConfigError("table_location", "the Delta table is required (ingest <topic> "
                          "<table>, --table_base_uri or TABLE_BASE_URI)")
    if a.decompress_gzip:
        raise ConfigError("--decompress_gzip", "gzip-compressed values are not supported")
    by_type = a.table_is_base and bool(a.avro_registry)
    if a.table_is_base:
        if a.protobuf_registry is not None:
            raise ConfigError("--protobuf", "tables by Protobuf message name are not "
                              "supported (by Avro record name they are: --avro <registry>)")
        # <base>/<type>: an Avro record's name through the registry, else the topic
        base, name = a.table_uri.rstrip("/"), (None if by_type else a.topic)
    else:
        base, name = split_table_uri(a.table_uri)
    if a.message_type_whitelist and not by_type:
        _check_whitelist(a.message_type_whitelist, a.topic)
    flags: dict[str, Any] = {
        "source.kafka.bootstrap_servers": a.kafka,
        "source.kafka.topics": [a.topic],
        "source.kafka.group_id": a.consumer_group,
        "source.kafka.starting_offsets": _reset(start_reset(a)),
        # a new checkpoint refuses while kafka-delta-ingest still runs (its group)
        "source.kafka.require_idle_group": True,
        "table.format": "delta",
        "table.base_path": base,
        "trigger.interval": f"{a.allowed_latency} seconds",
    }
    if by_type:  # the fork's message-type routing: a table per Avro record name
        message_type: dict[str, Any] = {"record_name": True, "namespace": False}
        if a.message_type_whitelist:  # its regex searches; allow matches whole names
            message_type["allow"] = search_pattern(a.message_type_whitelist)
        flags["routes"] = [{"topics": [a.topic], "message_type": message_type}]
    else:
        flags["table.name"] = name
    if a.seek_offsets:
        parse_seek_offsets(a.seek_offsets)  # refused here when malformed; applied with the
        # partitions at start (takeover_offsets: Spark wants every partition named)
    if a.partition_columns:
        flags["table.partition_by"] = [c.strip() for c in a.partition_columns.split(",")
                                       if c.strip()]
    if a.transforms:
        flags["table.transforms"] = list(a.transforms)
    if a.checkpoints:
        flags["table.delta_checkpoint_interval"] = 10
    if a.prometheus_port:
        flags["metrics.port"] = a.prometheus_port
    if a.ends_at_latest_offsets:
        flags["trigger.until_caught_up"] = True
    kafka_security(a, flags)
    registry = [(f, u) for f, u in (("avro", a.avro_registry), ("protobuf", a.protobuf_registry))
                if u is not None]
    if a.json_registry:
        raise ConfigError("--json", "a JSON schema registry is not supported: give --json "
                          "with no value (plain JSON) or --avro <registry URL>")
    if len(registry) > 1:
        raise ConfigError("--avro", "give one of --avro and --protobuf")
    if registry:
        fmt, url = registry[0]
        if not url:
            raise ConfigError(f"--{fmt}", "needs the schema registry's URL")
        flags["decode.format"] = fmt
        flags[f"decode.{fmt}.registry.url"] = url
    notes = [f"--{k} ({IGNORED[k]})" for k in a.given_ignored if k in IGNORED]
    if a.max_messages_per_batch:
        notes.append(f"--max_messages_per_batch ({IGNORED['max_messages_per_batch']})")
    if a.dlq_table_location:
        notes.append(f"--dlq_table_location (dead letters go to <base>/_rejected/"
                     f"{name or '<table>'}, a "
                     "Delta table with dlq.format delta)")
        flags["dlq.format"] = "delta"
    return flags, notes


def kafka_security(a: KdiArgs, flags: dict[str, Any]) -> None:
    """``-K`` settings and the ``KAFKA_DELTA_INGEST_*`` TLS/SCRAM variables into
    ``flags``: librdkafka's names as the Java client's, librdkafka-only settings
    refused with what to give instead."""
    options: dict[str, str] = {}
    mechanism = None
    for setting in a.kafka_settings:
        key, sep, value = setting.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ConfigError("-K", f"{setting!r} is not key=value")
        if key == "auto.offset.reset":
            continue  # librdkafka's reset: start_reset() uses it when -o is not given
        if key in ("sasl.mechanisms", "sasl.mechanism"):  # librdkafka's name, Java's
            mechanism = value.upper()
        elif key == "ssl.ca.location":  # a PEM file, in the Java client's words
            options.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": value})
        elif key == "ssl.ca.pem":
            options.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": value})
        elif key == "sasl.username":
            flags["source.kafka.sasl.username"] = value
        elif key == "enable.auto.commit":
            continue  # lakesink's position is its checkpoint; the group is not committed
        elif key in _LIBRDKAFKA_ONLY:
            raise ConfigError("-K", f"{key} is librdkafka's; {_LIBRDKAFKA_ONLY[key]}")
        elif key == "ssl.endpoint.identification.algorithm" and value.lower() == "none":
            options[key] = ""
        else:
            options[key] = value
    if a.ca_pem:  # KAFKA_DELTA_INGEST_CA
        options.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": a.ca_pem})
    if a.cert_pem and a.key_pem:  # KAFKA_DELTA_INGEST_CERT / _KEY (the key: secret_env)
        options.update({"ssl.keystore.type": "PEM",
                        "ssl.keystore.certificate.chain": a.cert_pem})
    elif a.cert_pem or a.key_pem:
        raise ConfigError("KAFKA_DELTA_INGEST_CERT", "give the certificate and its key "
                          "(KAFKA_DELTA_INGEST_KEY) together")
    if a.scram is not None:  # KAFKA_DELTA_INGEST_SCRAM_JSON (the password: secret_env)
        flags["source.kafka.sasl.username"] = a.scram["username"]
    if "source.kafka.sasl.username" in flags:
        flags["source.kafka.sasl.mechanism"] = mechanism or "SCRAM-SHA-512"
    elif mechanism:
        options["sasl.mechanism"] = mechanism
    if options:
        flags["source.kafka.options"] = options


def secret_env(a: KdiArgs, env: Mapping[str, str]) -> dict[str, str]:
    """The secrets of kafka-delta-ingest's variables as the environment variables
    lakesink takes secrets from (never a setting, never printed)."""
    out = {}
    if a.scram is not None:
        out["LAKESINK_SOURCE__KAFKA__SASL__PASSWORD"] = a.scram["password"]
    if a.cert_pem and a.key_pem:  # beside the secret options the environment gives
        given = json.loads(env.get("LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS") or "{}")
        out["LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS"] = json.dumps(
            {**given, "ssl.keystore.key": a.key_pem})
    return out


def _scram(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    try:
        data = json.loads(text)
        return {"username": str(data["username"]), "password": str(data["password"])}
    except (ValueError, TypeError, KeyError):
        raise ConfigError("KAFKA_DELTA_INGEST_SCRAM_JSON", 'JSON like {"username": "…", '
                          '"password": "…"}') from None


def search_pattern(rust: str) -> str:
    """The fork's whitelist (a Rust regex, searched) as a whole-match Java regex:
    leading inline flags stay in front, ``(?P<name>`` becomes Java's ``(?<name>``;
    POSIX classes and Rust's set operators, which Java reads otherwise, are refused."""
    import re

    for bad in ("[[:", "--", "~~", "&&"):
        if bad in rust:
            raise ConfigError("--message_type_whitelist", f"{rust!r}: {bad!r} means another "
                              "thing in Java's regex, which lakesink uses; write it without")
    flags = re.match(r"^\(\?[a-zA-Z]+\)", rust)
    lead = flags.group(0) if flags else ""
    body = rust[len(lead):].replace("(?P<", "(?<")
    return f"{lead}.*(?:{body}).*"


def _check_whitelist(pattern: str, topic: str) -> None:
    """Without a registry every message's type is the topic: the whitelist either keeps
    them all or none (refused: the fork would write nothing, silently)."""
    import re

    try:
        kept = re.search(pattern, topic) is not None
    except re.error as exc:
        raise ConfigError("--message_type_whitelist", f"{pattern!r}: {exc}") from None
    if not kept:
        raise ConfigError("--message_type_whitelist", f"{pattern!r} leaves out the only "
                          f"message type, the topic {topic!r}: nothing would be written")


def parse_seek_offsets(text: str) -> dict[str, int]:
    """``{"0": 123, "1": 321}`` -> partition -> offset."""
    try:
        data = json.loads(text)
        out = {str(int(p)): int(o) for p, o in data.items()}
    except (ValueError, TypeError, AttributeError):
        raise ConfigError("--seek_offsets", f"{text!r}: JSON like {{\"0\": 123}}") from None
    return out


def takeover_offsets(txn_versions: Mapping[int, int | None], *, topic: str,
                     seek: Mapping[str, int], reset: str) -> str | None:
    """Spark's ``startingOffsets`` JSON for a new checkpoint on a table kafka-delta-ingest
    wrote: per partition, after its ``txn`` version (the last offset it wrote), else
    after ``seek``, else ``reset`` (-2 earliest, -1 latest). None when no partition has
    a ``txn`` and no ``seek`` is given (the flags' own starting offsets stand)."""
    if not any(v is not None for v in txn_versions.values()) and not seek:
        return None
    fallback = -2 if _reset(reset) == "earliest" else -1
    offsets = {}
    for partition, version in sorted(txn_versions.items()):
        if version is not None and str(partition) in seek and seek[str(partition)] > version:
            raise ConfigError("--seek_offsets", f"partition {partition}: the table's offset "
                              f"{version} is behind the seek offset {seek[str(partition)]} "
                              "(kafka-delta-ingest refuses this too: InconsistentStoredOffsets)")
        if version is not None:
            offsets[str(partition)] = version + 1
        elif str(partition) in seek:
            offsets[str(partition)] = seek[str(partition)] + 1
        else:
            offsets[str(partition)] = fallback
    return json.dumps({topic: offsets})


def start_reset(a: KdiArgs) -> str:
    """Where a partition without a stored offset starts: ``-o``, else a ``-K
    auto.offset.reset``, else earliest (kafka-delta-ingest's default)."""
    if a.auto_offset_reset:
        return a.auto_offset_reset
    for setting in a.kafka_settings:
        key, _, value = setting.partition("=")
        if key.strip() == "auto.offset.reset":
            return value.strip()
    return "earliest"


def _env_bool(value: str | None) -> bool:
    """clap's reading of a boolean variable: ``true``/``1``/``yes``/``on``."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _env_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(name, f"{raw!r} is not a whole number") from None


def _reset(value: str) -> str:
    v = value.strip().lower()
    if v in ("earliest", "smallest", "beginning"):
        return "earliest"
    if v in ("latest", "largest", "end"):
        return "latest"
    raise ConfigError("--auto_offset_reset", f"{value!r}: earliest or latest")


def _parser(command: str) -> Any:  # noqa: ANN401 - an ArgumentParser
    import argparse

    return argparse.ArgumentParser(prog=f"lakesink kdi {command}", exit_on_error=False,
                                   add_help=False, allow_abbrev=False)


def _parse_args(p: Any, command: str, argv: list[str], *, intermixed: bool) -> Any:  # noqa: ANN401
    """``argv`` (after the command) parsed as clap would refuse it: one ConfigError."""
    import argparse

    try:
        ns, unknown = (p.parse_known_intermixed_args(argv) if intermixed
                       else p.parse_known_args(argv))
    except (argparse.ArgumentError, ValueError) as exc:
        raise ConfigError(f"kdi {command}", str(exc)) from None
    if unknown:
        raise ConfigError(f"kdi {command}", f"unknown argument(s): {' '.join(unknown)}")
    return ns


def parse(argv: list[str], env: Mapping[str, str]) -> tuple[KdiArgs, bool]:
    """``ingest …`` as kafka-delta-ingest parses it (clap: ``-t`` and ``-K`` take several
    values; every flag falls back to its environment variable). Returns the arguments
    and whether ``--print-config`` was given."""
    if not argv or argv[0] != "ingest":
        raise ConfigError("kdi", "usage: lakesink kdi ingest [TOPIC] [TABLE_LOCATION] "
                          "[flags] (the kafka-delta-ingest `ingest` command line)")
    p = _parser("ingest")
    e = env.get
    p.add_argument("positional", nargs="*")
    p.add_argument("--topic", default=e("KAFKA_TOPIC"))
    p.add_argument("--table_base_uri", default=e("TABLE_BASE_URI"))
    p.add_argument("-k", "--kafka", default=e("KAFKA_BROKERS", "localhost:9092"))
    p.add_argument("-g", "--consumer_group",
                   default=e("KAFKA_CONSUMER_GROUP", "kafka_delta_ingest"))
    p.add_argument("-a", "--app_id", default=e("APP_ID", "kafka_delta_ingest"))
    p.add_argument("--seek_offsets", default=e("KAFKA_SEEK_OFFSETS"))
    p.add_argument("-o", "--auto_offset_reset", default=e("KAFKA_AUTO_OFFSET_RESET") or None)
    p.add_argument("-l", "--allowed_latency", type=int,
                   default=_env_int(env, "ALLOWED_LATENCY", 300))
    p.add_argument("-m", "--max_messages_per_batch", type=int,
                   default=_env_int(env, "MAX_MESSAGES_PER_BATCH", None))
    p.add_argument("--partition_columns", default=e("PARTITION_COLUMNS"))
    p.add_argument("-t", "--transform", nargs="+", action="extend", default=[])
    p.add_argument("--dlq_table_location", default=e("DLQ_TABLE_LOCATION"))
    p.add_argument("-c", "--checkpoints", action="store_true",
                   default=_env_bool(e("WRITE_CHECKPOINTS")))
    p.add_argument("-K", "--kafka_setting", nargs="+", action="extend", default=[])
    p.add_argument("--prometheus_port", type=int,
                   default=_env_int(env, "PROMETHEUS_PORT", None))
    p.add_argument("--message_type_whitelist", default=e("MESSAGE_TYPE_WHITELIST"))
    p.add_argument("-e", "--ends_at_latest_offsets", action="store_true",
                   default=_env_bool(e("TURN_OFF_AT_KAFKA_TOPIC_END"))
                   or _env_bool(e("ENDS_AT_LATEST_OFFSETS")))
    p.add_argument("--json", nargs="?", const="", default=e("JSON_REGISTRY"))
    p.add_argument("--avro", nargs="?", const="", default=e("AVRO_REGISTRY"))
    p.add_argument("--protobuf", nargs="?", const="", default=e("PROTOBUF_REGISTRY"))
    p.add_argument("--decompress_gzip", action="store_true",
                   default=_env_bool(e("DECOMPRESS_GZIP")))
    p.add_argument("--print-config", action="store_true")
    p.add_argument("--no_takeover", action="store_true")
    for name, (short, var, _) in _UNUSED_FLAGS.items():
        names = [n for n in (short, f"--{name}") if n]
        p.add_argument(*names, dest=name, nargs="+" if name == "dlq_transform" else None,
                       default=e(var))
    ns = _parse_args(p, "ingest", argv[1:], intermixed=True)
    if len(ns.positional) > 2:
        raise ConfigError("kdi ingest", f"at most TOPIC and TABLE_LOCATION before the flags "
                          f"(got {' '.join(ns.positional)})")
    topic = ns.topic or (ns.positional[0] if ns.positional else None)
    table = ns.table_base_uri or (ns.positional[1] if len(ns.positional) > 1
                                  else e("TABLE_LOCATION"))
    table_is_base = bool(ns.table_base_uri)
    transforms = list(ns.transform) or [t for t in (e("TRANSFORMS") or "").split("\n") if t]
    args = KdiArgs(
        topic=topic, table_uri=table, table_is_base=table_is_base, kafka=ns.kafka,
        consumer_group=ns.consumer_group,
        app_id=ns.app_id, seek_offsets=ns.seek_offsets, auto_offset_reset=ns.auto_offset_reset,
        allowed_latency=ns.allowed_latency, max_messages_per_batch=ns.max_messages_per_batch,
        partition_columns=ns.partition_columns, transforms=transforms,
        dlq_table_location=ns.dlq_table_location, checkpoints=ns.checkpoints,
        kafka_settings=list(ns.kafka_setting), prometheus_port=ns.prometheus_port,
        message_type_whitelist=ns.message_type_whitelist,
        ends_at_latest_offsets=ns.ends_at_latest_offsets, json_registry=ns.json,
        avro_registry=ns.avro, protobuf_registry=ns.protobuf,
        decompress_gzip=ns.decompress_gzip, no_takeover=ns.no_takeover,
        ca_pem=e("KAFKA_DELTA_INGEST_CA") or None, cert_pem=e("KAFKA_DELTA_INGEST_CERT") or None,
        key_pem=e("KAFKA_DELTA_INGEST_KEY") or None,
        scram=_scram(e("KAFKA_DELTA_INGEST_SCRAM_JSON")),
        given_ignored={k: getattr(ns, k) for k in _UNUSED_FLAGS if getattr(ns, k)})
    return args, ns.print_config


def refuse_unknown_app_id(versions: Mapping[int, int | None], table_files: int, *,
                          app_id: str, seek: Mapping[str, int]) -> None:
    """A table with files and no ``txn`` for ``app_id``: most likely the old deployment
    ran with another ``-a``, and starting at ``-o`` would write its records again."""
    if table_files and all(v is None for v in versions.values()) and not all(
            str(p) in seek for p in versions):
        raise ConfigError(
            "-a", f"the table has {table_files} file(s) but no kafka-delta-ingest offsets "
            f"for app id {app_id!r} (txn {app_id}-<partition>): starting at "
            "--auto_offset_reset would write again what is there",
            fix="give the -a (APP_ID) the kafka-delta-ingest deployment ran with; or "
            "--seek_offsets naming every partition; or --no_takeover to start at "
            "--auto_offset_reset anyway")


@dataclass
class RepairArgs:
    table_url: str
    optimize_target_size: int = 100_000_000
    #: (column, value): OPTIMIZE only this partition
    partition: tuple[str, str] | None = None
    #: a partition column without a value (or the reverse): the fork optimizes it all
    partial_filter: str | None = None


def parse_repair(argv: list[str], env: Mapping[str, str]) -> RepairArgs:
    """The fork's ``repair --table_url <url> [--optimize_target_size N]
    [--optimize_partition COL --optimize_partition_predicate VALUE]`` and their
    variables."""
    p = _parser("repair")
    e = env.get
    p.add_argument("--table_url", default=e("TABLE_URL"))
    p.add_argument("--optimize_target_size", type=int,
                   default=_env_int(env, "OPTIMIZE_TARGET_SIZE", 100_000_000))
    p.add_argument("--optimize_partition", default=e("OPTIMIZE_PARTITION") or None)
    p.add_argument("--optimize_partition_predicate",
                   default=e("OPTIMIZE_PARTITION_PREDICATE") or None)
    ns = _parse_args(p, "repair", argv[1:], intermixed=False)
    if not ns.table_url:
        raise ConfigError("--table_url", "the Delta table to repair is required "
                          "(--table_url or TABLE_URL)")
    if ns.optimize_target_size <= 0:
        raise ConfigError("--optimize_target_size", "must be a positive number of bytes")
    column, value = ns.optimize_partition, ns.optimize_partition_predicate
    partial = None
    if (column is None) != (value is None):
        partial = ("--optimize_partition" if column else "--optimize_partition_predicate")
    return RepairArgs(ns.table_url, ns.optimize_target_size,
                      (column, value) if column is not None and value is not None else None,
                      partial)


def repair_flags(a: RepairArgs) -> dict[str, Any]:
    """The configuration of the one Delta table ``--table_url`` names. Maintenance reads
    no topic: the source is a placeholder the command never opens."""
    base, name = split_table_uri(a.table_url)
    return {"source.kafka.bootstrap_servers": "unused:9092",
            "source.kafka.topics": ["kdi-repair"], "table.format": "delta",
            "table.base_path": base, "table.name": name}

