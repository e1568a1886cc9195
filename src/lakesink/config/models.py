"""The configuration model. Every section forbids unknown keys.

See ``docs/configuration.md`` for the reference; this module is its source of truth.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from lakesink.config.secrets import refuse_secrets
from lakesink.errors import ConfigError
from lakesink.config.transform_text import parse_transforms
from lakesink.tables.formats import table_format

Compression = Literal["snappy", "zstd", "gzip", "lz4", "none"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")


def _split_list(value: Any) -> Any:
    """Accept a list, a JSON list, or a comma-separated string (handy in env vars)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


StrList = Annotated[list[str], NoDecode]


def _regex(value: str | None) -> str | None:
    """A regular expression that compiles (Python's dialect is close to Java's for the
    patterns topic and type names use)."""
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
    return value


def _stringify_map(value: Any) -> Any:
    """Map values may be YAML scalars (``8``, ``true``); Spark and Kafka want strings."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if isinstance(item, bool):
            item = str(item).lower()
        elif isinstance(item, (int, float)):
            item = str(item)
        out[str(key)] = item
    return out


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class KafkaSasl(_Section):
    """SASL credentials; the JAAS config for Spark's Kafka client is built from them."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    username: str | None = None
    password: SecretStr | None = None


def bootstrap_hosts(servers: str) -> list[tuple[str, int]]:
    """``"a:1, PLAINTEXT://b:2"`` -> ``[("a", 1), ("b", 2)]``; ValueError when malformed."""
    hosts = []
    for item in servers.split(","):
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{item!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    if not hosts:
        raise ValueError("names no broker")
    return hosts


class KafkaSource(_Section):
    bootstrap_servers: str = Field(description="host:port[,host:port…] of the Kafka brokers")
    topics: StrList = Field(default_factory=list, description="topics to subscribe to")
    topic_pattern: str | None = Field(default=None, description="Java regex of topics")
    group_id: str | None = Field(
        default=None,
        description="consumer group id (offsets live in the checkpoint, not in the group)",
    )
    starting_offsets: str = Field(
        default="earliest",
        description='where a new checkpoint starts: earliest | latest | per-partition '
        'JSON {"topic":{"0":23}} | group (the committed offsets of group_id: take over '
        "from another consumer of the group without reading twice)",
    )
    group_fallback: Literal["earliest", "latest"] = Field(
        default="earliest", description="starting_offsets group: where a partition the "
        "group has no committed offset for starts")
    require_idle_group: bool | None = Field(
        default=None, description="a new checkpoint refuses to start while group_id has "
        "active members (the tool lakesink takes over from still runs: both would write "
        "the same records); default: on with starting_offsets group")
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)
    fail_on_data_loss: bool = True
    connect_timeout_s: float = Field(default=30.0, gt=0)
    check_access: bool = Field(
        default=True, description="at start, connect with the query's options and check "
        "that the topics may be read (authentication, TLS trust, READ ACL); skipped when "
        "Spark's delegation tokens (spark.kafka.clusters.*) authenticate")
    options: dict[str, str] = Field(
        default_factory=dict, description="any Kafka client option (security.protocol, ssl.*)"
    )
    secret_options: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Kafka client options whose values are secret (sasl.jaas.config, "
        "ssl.key.password, …): env or secret file only",
    )
    sasl: KafkaSasl | None = None

    _split = field_validator("topics", mode="before")(_split_list)
    _strings = field_validator("options", "secret_options", mode="before")(_stringify_map)

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap(cls, value: str) -> str:
        bootstrap_hosts(value)
        return value

    @field_validator("options")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        refuse_secrets(value, "source.kafka.options", "source.kafka.secret_options (or "
                       "source.kafka.sasl.password)")
        return value

    @field_validator("starting_offsets", mode="before")
    @classmethod
    def _offsets_map(cls, value: Any) -> Any:
        return json.dumps(value) if isinstance(value, dict) else value

    @field_validator("starting_offsets")
    @classmethod
    def _offsets(cls, value: str) -> str:
        v = value.strip()
        if v in ("earliest", "latest", "group"):
            return v
        try:
            parsed = json.loads(v)
        except json.JSONDecodeError:
            raise ValueError(
                "must be 'earliest', 'latest', 'group' or per-partition JSON like "
                '{"topic": {"0": 42}}'
            ) from None
        if not isinstance(parsed, dict) or not all(isinstance(p, dict) for p in parsed.values()):
            raise ValueError('per-partition JSON must look like {"topic": {"0": 42}}')
        return json.dumps(parsed)

    @property
    def checks_idle_group(self) -> bool:
        """Whether a new checkpoint first checks that ``group_id`` has no active member."""
        if self.require_idle_group is not None:
            return self.require_idle_group
        return self.starting_offsets == "group"

    @model_validator(mode="after")
    def _one_subscription(self) -> KafkaSource:
        # neither is allowed here: with routes, the subscription comes from them
        if self.topics and self.topic_pattern:
            raise ValueError("set exactly one of 'topics' or 'topic_pattern'")
        if self.starting_offsets == "group" and not self.group_id:
            raise ValueError("starting_offsets 'group' needs group_id (the group whose "
                             "committed offsets to start from)")
        if self.require_idle_group and not self.group_id:
            raise ValueError("require_idle_group needs group_id (the group to check)")
        if self.starting_offsets == "group" and self.topic_pattern:
            raise ValueError("starting_offsets 'group' needs topics, not topic_pattern "
                             "(Spark wants every partition's offset named)")
        return self


class RedisSource(_Section):
    """Redis streams and lists (``source.type: redis``), read exactly once: see
    ``docs/sources.md``."""

    host: str = "127.0.0.1"
    port: int = Field(default=6379, gt=0, lt=65536)
    db: int = Field(default=0, ge=0)
    username: str | None = None
    password: SecretStr | None = Field(default=None, description="env or secret file only")
    tls: bool = False
    streams: StrList = Field(default_factory=list, description="stream keys to read")
    lists: StrList = Field(default_factory=list, description="list keys to consume")
    value_field: str | None = Field(
        default="data",
        description="the stream entry field holding the payload; null: every field, "
        "as one JSON object of strings")
    key_field: str | None = Field(default=None, description="the entry field of the key")
    consumer_group: str | None = Field(
        default=None,
        description="streams: move this consumer group to each batch's end (and XACK "
        "what is pending up to it) only after the batch is durable")
    consumer_name: str = Field(
        default="lakesink",
        description="lists: names the processing lists")
    starting_position: Literal["earliest", "latest"] = "earliest"
    trim_on_commit: bool = Field(
        default=False, description="streams: XTRIM MINID after each durable batch")
    max_records_per_trigger: int | None = Field(
        default=None, gt=0, description="records per batch at most (lists: 10000 if unset)")
    fail_on_data_loss: bool = True
    connect_timeout_s: float = Field(default=30.0, gt=0)
    socket_timeout_s: float = Field(default=30.0, gt=0)

    _split = field_validator("streams", "lists", mode="before")(_split_list)

    @model_validator(mode="after")
    def _keys(self) -> RedisSource:
        if not self.streams and not self.lists:
            raise ValueError("set 'streams' or 'lists' (the keys to read)")
        both = set(self.streams) & set(self.lists)
        if both:
            raise ValueError(f"{min(both)!r} is in both 'streams' and 'lists'")
        return self

    @property
    def keys(self) -> list[str]:
        return [*self.streams, *self.lists]


#: the FS Data Sink's variables -> lakesink's source keys (they fill what is unset)
FDS_REDIS_ENV = {"REDIS_HOST": "host", "REDIS_PORT": "port", "REDIS_PASSWORD": "password",
                 "REDIS_STREAM_KEYS": "streams", "REDIS_CONSUMER_GROUP": "consumer_group",
                 "REDIS_CONSUMER_NAME": "consumer_name"}
FDS_KAFKA_ENV = {"KAFKA_BOOTSTRAP_SERVERS": "bootstrap_servers", "KAFKA_TOPICS": "topics",
                 "KAFKA_GROUP_ID": "group_id"}


def _fds_environment(data: dict[str, Any]) -> dict[str, Any]:
    """The FS Data Sink's environment: ``SOURCE_TYPE`` (kafka|redis) picks the source
    when the config names none, and its ``REDIS_*`` / ``KAFKA_*`` variables fill the
    keys the config leaves unset (lakesink's own names always win)."""
    from lakesink.config.settings_sources import _env_data

    env = _env_data.get() or {}
    kind = data.get("type") or env.get("SOURCE_TYPE", "").strip().lower() or None
    if kind not in (None, "kafka", "redis", "danube"):
        return data
    out = dict(data)
    if isinstance(out.get("danube"), dict):  # the Danube sink's variables override the
        danube = {"service_url": env.get("DANUBE_SERVICE_URL"),  # file, as they do there
                  "consumer_name": env.get("CONNECTOR_NAME")}
        out["danube"] = {**out["danube"], **{k: v for k, v in danube.items() if v}}
    for section, names in (("redis", FDS_REDIS_ENV), ("kafka", FDS_KAFKA_ENV)):
        given = {key: env[var] for var, key in names.items() if env.get(var)}
        current = out.get(section)
        wanted = section == kind if kind is not None else current is not None
        if given and wanted:
            out[section] = {**given, **(current or {})}
    if "type" not in out and kind is not None:
        out["type"] = kind
    return out


class DanubeSource(_Section):
    """Danube topics (``source.type: danube``): see ``docs/sources.md``."""

    service_url: str = Field(description="the broker, http://host:6650 (DANUBE_SERVICE_URL)")
    topics: StrList = Field(description="topics to read, e.g. /default/events")
    subscription: str | None = Field(
        default=None, description="the subscription (the broker's cursor): one per "
        "deployment; required unless every topic has one in `subscriptions`")
    subscriptions: dict[str, str] = Field(
        default_factory=dict, description="a topic's own subscription, if not `subscription`")
    subscription_type: Literal["exclusive", "shared", "failover"] = "exclusive"
    consumer_name: str | None = Field(
        default=None, description="CONNECTOR_NAME; default lakesink-<host name>")
    max_records_per_trigger: int = Field(default=10_000, gt=0)
    idle_s: float = Field(default=1.0, gt=0,
                          description="a trigger waits this long for a first message")
    max_spool_mb: int = Field(default=1024, gt=0, description="receiving pauses while "
                              "this much is spooled and not yet in a durable batch")
    connect_timeout_s: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _every_topic_subscribed(self) -> DanubeSource:
        if self.subscription is None:
            missing = [t for t in self.topics if t not in self.subscriptions]
            if missing:
                raise ValueError(
                    f"source.danube.subscription: required (no subscription for {missing}); "
                    "name the subscription this deployment owns: another deployment on "
                    "the same subscription would split the messages with it")
        return self

    def subscription_of(self, topic: str) -> str:
        return self.subscriptions.get(topic) or self.subscription or ""

    _split = field_validator("topics", mode="before")(_split_list)


class SourceConfig(_Section):
    type: Literal["kafka", "redis", "danube"] = Field(
        default="kafka", description="kafka (default), redis or danube; set by the section "
        "given")
    kafka: KafkaSource | None = None
    redis: RedisSource | None = None
    danube: DanubeSource | None = None

    @model_validator(mode="before")
    @classmethod
    def _type_from_section(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _fds_environment(data)
        given = [k for k in ("redis", "danube") if data.get(k) is not None]
        if "type" not in data and len(given) == 1 and data.get("kafka") is None:
            data = {**data, "type": given[0]}
        return data

    @model_validator(mode="after")
    def _one_section(self) -> SourceConfig:
        if getattr(self, self.type) is None:
            raise ValueError(f"source.type is {self.type}: the section source.{self.type} "
                             "is missing")
        for other in ("kafka", "redis", "danube"):
            if other != self.type and getattr(self, other) is not None:
                raise ValueError(f"source.{other}: given, but source.type is {self.type}; "
                                 "one source per run")
        return self

    @property
    def names(self) -> list[str]:
        """What the records' ``topic`` can be, when the source names them up front."""
        if self.redis is not None:
            return self.redis.keys
        if self.danube is not None:
            return self.danube.topics
        assert self.kafka is not None
        return self.kafka.topics


class FieldSpec(_Section):
    """One declared field: an Arrow type name (Utf8, Int64, …) or Spark DDL type."""

    name: str
    type: str
    nullable: bool = True


class RegistryConfig(_Section):
    """``decode.avro.registry``: a Confluent-API schema registry (Confluent Schema
    Registry, Apicurio's ``/apis/ccompat/v7``, Karapace, Redpanda) that resolves each
    record's schema id; see ``docs/schema-registry.md``."""

    url: str = Field(description="the registry's base URL (http(s)://host:8081, or "
                     "Apicurio's http://host:8080/apis/ccompat/v7)")
    subjects: StrList = Field(default_factory=list, description="subjects whose latest "
                              "version gives a new table its first schema; default: "
                              "<topic>-value for each topic")
    username: str | None = Field(default=None, description="HTTP basic auth user")
    password: SecretStr | None = Field(default=None, description="env or secret file only")
    timeout_s: float = Field(default=10.0, gt=0, description="the longest wait for one "
                             "answer (then the batch fails and the query restarts with "
                             "backoff)")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        urls = [u.strip() for u in value.split(",")]  # the client takes several
        for url in urls:
            if "@" in url.partition("://")[2].partition("/")[0]:
                raise ValueError("credentials in the URL: set username, and password from "
                                 "the environment or a secret file")
            if not re.match(r"^https?://[^/\s]+", url):
                raise ValueError(f"{url!r} is not an http(s):// URL")
        return ",".join(u.rstrip("/") for u in urls)


def _confluent_with_registry(section: Any) -> Any:  # noqa: ANN401 - Avro/ProtobufConfig
    """A registry reads the schema id of the Confluent framing: ``wire`` defaults to
    ``confluent`` with one, and ``plain`` is refused."""
    if section.registry is not None:
        if "wire" in section.model_fields_set and section.wire != "confluent":
            fmt = "avro" if isinstance(section, AvroConfig) else "protobuf"
            raise ValueError(f"decode.{fmt}.wire: a registry resolves the schema id of the "
                             "Confluent framing; use wire: confluent (the default with a "
                             "registry)")
        section.wire = "confluent"
    return section


class AvroConfig(_Section):
    """``decode.format: avro``: the writer schema and how values are framed."""

    schema_file: str | None = Field(default=None, description="Avro schema (.avsc, JSON); "
                                    "with a registry: optional, the first schema of a "
                                    "new table")
    wire: Literal["plain", "confluent"] = Field(
        default="plain",
        description="'confluent': a magic byte 0 and a 4-byte schema id precede the datum "
        "(the default with a registry)",
    )
    registry: RegistryConfig | None = Field(
        default=None, description="resolve each record's schema id in a schema registry "
        "(the table's schema follows the writers' schemas)")

    _registry_wire = model_validator(mode="after")(_confluent_with_registry)


class ProtobufConfig(_Section):
    """``decode.format: protobuf``: the descriptor set and the message of each value."""

    descriptor_file: str | None = Field(
        default=None, description="descriptor set: protoc --descriptor_set_out=F "
        "--include_imports; with a registry: optional, a new table's first schema")
    message: str | None = Field(default=None, description="full message name (pkg.Msg)")
    wire: Literal["plain", "confluent"] = Field(
        default="plain", description="'confluent': magic byte 0, a 4-byte schema id and "
        "the message-index path precede the message (the default with a registry)")
    registry: RegistryConfig | None = Field(
        default=None, description="resolve each record's schema id in a schema registry "
        "(the .proto text is compiled; the table's schema follows the writers')")

    _registry_wire = model_validator(mode="after")(_confluent_with_registry)


class DecodeConfig(_Section):
    format: Literal["json", "avro", "protobuf", "arrow_ipc", "string", "int64", "bytes"] = Field(
        default="json",
        description="json; avro (schema from decode.avro); protobuf (decode.protobuf); "
        "arrow_ipc (an IPC stream per value, columns from decode.schema); "
        "string -> data, int64 (8 bytes big-endian) -> value, bytes -> data (base64) + size",
    )
    avro: AvroConfig = Field(default_factory=AvroConfig)
    protobuf: ProtobufConfig = Field(default_factory=ProtobufConfig)
    schema_: list[FieldSpec] | str | None = Field(
        default=None,
        alias="schema",
        description="declared fields, or a Spark DDL string; none = infer from the topic",
    )
    infer_sample_size: int = Field(default=1000, gt=0)
    infer_wait_s: float = Field(default=60.0, ge=0)

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True)

    @model_validator(mode="after")
    def _format_settings(self) -> DecodeConfig:
        if self.format not in ("json", "arrow_ipc") and self.schema_ is not None:
            raise ValueError(f"decode.schema: only for formats json and arrow_ipc; the "
                             f"{self.format} format defines the columns itself")
        if self.format == "arrow_ipc" and self.schema_ is None:
            raise ValueError("decode.schema: required for format arrow_ipc (the table's "
                             "columns; each stream's columns are cast to them)")
        if self.format == "avro" and not self.avro.schema_file and self.avro.registry is None:
            raise ValueError("decode.avro.schema_file: required for format avro (or "
                             "decode.avro.registry)")
        if self.format == "protobuf":
            needed = ("message",) if self.protobuf.registry else ("descriptor_file", "message")
            for key in needed:
                if not getattr(self.protobuf, key):
                    raise ValueError(f"decode.protobuf.{key}: required for format protobuf")
        return self

    @property
    def evolves(self) -> bool:
        """Whether records can carry fields the schema lacks (JSON, and Avro whose
        writer schemas come from a registry)."""
        return self.format == "json" or self.registry is not None

    @property
    def registry(self) -> RegistryConfig | None:
        """The schema registry that resolves the records' schema ids, if any."""
        if self.format == "avro":
            return self.avro.registry
        return self.protobuf.registry if self.format == "protobuf" else None


class TableConfig(_Section):
    name: str | None = Field(default=None, description="table folder name; default: the topic")
    base_path: str = "./lake"
    format: Literal["parquet", "delta"] = "parquet"
    partition_by: StrList = Field(default_factory=list)
    timestamp_column: str | None = None
    timestamp_fallback: Literal["none", "kafka"] = Field(
        default="none",
        description="when the timestamp is null: 'kafka' uses the record's Kafka timestamp",
    )
    compression: Compression = "snappy"
    engine: Literal["auto", "arrow", "spark"] = Field(
        default="auto",
        description="the per-row work: 'arrow' decodes and writes in pyarrow inside "
        "Spark's tasks (Parquet tables of JSON records on local disk, flat schemas; "
        "refused at start otherwise), 'spark' in Spark's row expressions, 'auto' arrow "
        "where it can (see docs/architecture.md, 'The Arrow data path')",
    )
    null_partition_value: str = "__HIVE_DEFAULT_PARTITION__"
    delta_checkpoint_interval: int | None = Field(
        default=None, gt=0,
        description="Delta: write a log checkpoint every N commits (set when the table is "
        "created; 10, delta-spark's default, otherwise)",
    )
    files_per_partition: int = Field(
        default=1, ge=0,
        description="new files per partition folder per batch (0 = one per Spark task)",
    )
    target_file_size: ByteSize | None = Field(
        default=ByteSize(128 * 1024 * 1024),
        description="split a partition folder's rows of one batch into files of about "
        "this size (e.g. '128MiB'); null = no limit",
    )
    schema_evolution: Literal["add_columns", "strict"] = Field(
        default="add_columns",
        description="add_columns: new top-level fields become new nullable columns; "
        "strict: the schema never changes",
    )
    max_columns: int = Field(
        default=1000, ge=1,
        description="add_columns: the most fields schema evolution may grow the table "
        "to; a record whose new fields would pass it is a dead letter (too_many_fields)",
    )
    unknown_fields: Literal["drop", "reject"] = Field(
        default="drop",
        description="strict only: drop fields outside the schema (counted, logged) or "
        "reject the record (reason unknown_field)",
    )
    type_widening: bool | None = Field(
        default=None,
        description="let a column widen (int -> bigint, float -> double) when a value "
        "needs it; default: on for parquet with add_columns, off for delta (delta-rs "
        "cannot read Delta's typeWidening feature) and for strict",
    )

    key_column: str | None = Field(
        default=None,
        description="add the record's Kafka key as this column (the Quix sink's '__key')",
    )
    key_format: Literal["string", "bytes"] = Field(
        default="string",
        description="key_column type: string (UTF-8; invalid sequences become U+FFFD) or "
        "bytes (binary, exact)",
    )
    metadata_column: str | None = Field(
        default=None,
        description="add a struct column with the record's topic, partition, offset, "
        "timestamp and timestamp_type (like the Danube sink's include_*_metadata)",
    )

    writer_lease_s: float = Field(
        default=60.0, ge=0, description="TTL of the writer lease every table writer holds "
        "(one process per checkpoint; for Delta on S3 with the single-driver log store, "
        "one writer per table): a second writer is refused, a holder gone for this long "
        "is taken over (0: off)")
    other_writers: Literal["refuse", "ignore"] = Field(
        default="refuse", description="a new checkpoint on a Delta table that holds "
        "another writer's txn (kafka-delta-ingest's <app_id>-<partition>, or a lost "
        "checkpoint's): refuse unless source.kafka.starting_offsets says where to start "
        "(JSON offsets after the table's, latest, group); ignore: start anyway (rows "
        "already in the table may come again)")
    transforms: list[str] = Field(
        default_factory=list,
        description="ordered 'name: expression' list; Spark SQL over the record's fields "
        "and kafka.{key,topic,partition,offset,timestamp,timestamp_type,headers}; "
        "kafka-delta-ingest strings are translated",
    )

    _split = field_validator("partition_by", mode="before")(_split_list)

    @field_validator("transforms")
    @classmethod
    def _transforms(cls, value: list[str]) -> list[str]:
        try:
            parse_transforms(value)
        except ConfigError as exc:
            raise ValueError(f"{exc.key}: {exc.message}") from None
        return value

    @field_validator("key_column", "metadata_column")
    @classmethod
    def _column_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"{value!r} is not a plain column name")
        return value

    @property
    def source_columns(self) -> list[str]:
        """Columns filled from the Kafka record rather than the payload."""
        return [c for c in (self.key_column, self.metadata_column) if c]

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError("use letters, digits, '_', '-' and '.', starting with a letter/digit")
        return value

    @field_validator("partition_by")
    @classmethod
    def _partitions(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a column appears twice")
        for col in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", col):
                raise ValueError(f"{col!r} is not a plain column name")
        return value

    @field_validator("null_partition_value")
    @classmethod
    def _null_value(cls, value: str) -> str:
        if not value or "/" in value or "=" in value or value in (".", ".."):
            raise ValueError("must be a non-empty folder-safe value (no '/', '=', '.', '..')")
        return value

    @model_validator(mode="after")
    def _time_partitions(self) -> TableConfig:
        if self.timestamp_column is None and self.timestamp_fallback == "kafka":
            raise ValueError("timestamp_fallback=kafka needs timestamp_column")
        if ("unknown_fields" in self.model_fields_set and self.unknown_fields == "reject"
                and self.schema_evolution != "strict"):
            raise ValueError("table.unknown_fields: 'reject' needs schema_evolution=strict "
                             "(add_columns turns unknown fields into columns)")
        if self.key_column and self.key_column == self.metadata_column:
            raise ValueError("table.metadata_column: the same name as table.key_column")
        if not table_format(self.format).has_log:  # readers list its folders
            for col in self.partition_by:
                if col.startswith("_"):
                    raise ValueError(
                        f"table.partition_by: {col!r} starts with '_': its folders "
                        f"({col}=…) are hidden from Hadoop, Hive, Trino and pyarrow, which "
                        "skip names starting with '_' or '.'; partition by a column without "
                        f"the '_' (e.g. the transform '{col.lstrip('_') or 'part'}: {col}'), "
                        "or use format delta, whose log lists the files")
        for col in self.source_columns:
            if col in self.partition_by:
                raise ValueError(f"table.partition_by: {col!r} is a key/metadata column; "
                                 "partition by payload fields or time parts")
        if self.target_file_size is not None and self.target_file_size < 1024 * 1024:
            raise ValueError("table.target_file_size: must be at least 1MiB")
        return self

    @property
    def widening(self) -> bool:
        """Whether columns may widen (the format-dependent default resolved)."""
        if self.type_widening is None:
            return (table_format(self.format).widens_by_default
                    and self.schema_evolution == "add_columns")
        return self.type_widening


_DURATION_UNITS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), "milliseconds"),
    **dict.fromkeys(("s", "sec", "second", "seconds"), "seconds"),
    **dict.fromkeys(("m", "min", "minute", "minutes"), "minutes"),
    **dict.fromkeys(("h", "hour", "hours"), "hours"),
}


def spark_duration(value: str) -> str:
    """Accept ``500ms``, ``10 s``, ``1 minute``…; return the form Spark's interval
    parser takes (it knows ``seconds``, not ``s``)."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$", value)
    unit = _DURATION_UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ValueError("use a duration like '500 ms', '10 seconds' or '1 minute'")
    return f"{m.group(1)} {unit}"


class TriggerConfig(_Section):
    interval: str = Field(default="10 seconds", description="micro-batch interval")
    until_caught_up: bool = Field(
        default=False, description="process what the topic holds now, then exit"
    )

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        return spark_duration(value)


class SparkConfig(_Section):
    master: str | None = "local[*]"
    app_name: str = "lakesink"
    driver_memory: str | None = "1g"
    log_level: Literal["ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"] = "WARN"
    conf: dict[str, str] = Field(default_factory=dict)

    _strings = field_validator("conf", mode="before")(_stringify_map)

    @field_validator("conf")
    @classmethod
    def _spark_keys(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not k.startswith("spark.")]
        if bad:
            raise ValueError(f"keys must start with 'spark.': {bad}")
        refuse_secrets(value, "spark.conf", "storage.<store>.secret_options or the "
                       "section's credential fields")
        return value


class MessageTypeConfig(_Section):
    """Message-type routing: a field of each JSON record, or the record name of each
    Avro record's writer schema (a registry), names its table."""

    field: str | None = Field(default=None,
                              description="top-level JSON field whose value is the type")
    record_name: bool = Field(default=False, description="the type is the full name "
                              "(namespace.Name) of the record's writer schema, looked up "
                              "by its id in decode.avro.registry")
    namespace: bool = Field(default=True, description="record_name: the type includes the "
                            "record's namespace (namespace.Name); false: the Name alone, as "
                            "kafka-delta-ingest's fork names its tables")
    allow: str | None = Field(default=None, description="regex (whole match) of the types "
                              "written; others are unrouted. Default: every type")
    table_prefix: str = Field(default="", description="table name = prefix + type")

    _pattern = field_validator("allow")(_regex)

    @field_validator("field")
    @classmethod
    def _field(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"{value!r} is not a plain field name")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> MessageTypeConfig:
        if (self.field is None) == (not self.record_name):
            raise ValueError("message_type: give either field (JSON) or record_name: true "
                             "(Avro through a registry)")
        return self

    @property
    def what(self) -> str:
        """What names the type, for messages."""
        return "the Avro record name" if self.record_name else f"'{self.field}'"

    @field_validator("table_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if value and not _NAME.match(value):
            raise ValueError("use letters, digits, '_', '-' and '.', starting with a "
                             "letter/digit")
        return value


class RouteConfig(_Section):
    """Records of some topics -> one table. ``table`` and ``decode`` override the
    top-level sections key by key (everything else is inherited)."""

    topics: StrList = Field(default_factory=list, description="topics of this route")
    topic_pattern: str | None = Field(default=None, description="Java regex of topic names "
                                      "(whole name)")
    table: dict[str, Any] = Field(default_factory=dict,
                                  description="table settings that differ from `table`")
    decode: dict[str, Any] = Field(default_factory=dict,
                                   description="decode settings that differ from `decode`")
    message_type: MessageTypeConfig | None = Field(
        default=None, description="one table per message type instead of one table")

    _split = field_validator("topics", mode="before")(_split_list)

    _pattern = field_validator("topic_pattern")(_regex)

    @model_validator(mode="after")
    def _one_subscription(self) -> RouteConfig:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("set exactly one of 'topics' or 'topic_pattern'")
        return self


def _deep_merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides``; sections (dicts) merge key by key, values replace."""
    out = dict(base)
    for name, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(name), dict):
            out[name] = _deep_merged(out[name], value)
        else:
            out[name] = value
    return out


def _secret_in(overrides: dict[str, Any], key: str) -> str | None:
    """The dotted key of a password in a route's override sections (printed by
    ``lakesink validate`` as given), if any."""
    for name, value in overrides.items():
        if name == "password" and value is not None:
            return f"{key}.{name}"
        if isinstance(value, dict):
            found = _secret_in(value, f"{key}.{name}")
            if found:
                return found
    return None


def _merged(base: BaseModel, overrides: dict[str, Any], model: type[BaseModel], key: str
            ) -> Any:
    """``base`` with ``overrides`` applied, validated; errors name ``key.<field>``."""
    from pydantic import ValidationError

    inherited = base.model_dump(exclude_unset=True, by_alias=True)
    if isinstance(base, DecodeConfig) and overrides.get("format", base.format) != base.format:
        # a schema belongs to its format: a route with another format does not inherit it
        inherited = {k: v for k, v in inherited.items()
                     if k not in ("schema", "avro", "protobuf")}
    data = _deep_merged(inherited, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown key"
        head, sep, tail = msg.partition(": ")
        if sep and "." in head and " " not in head:  # a model validator names its key:
            loc, msg = head.split(".", 1)[1], tail  # "table.x: …" -> x
        raise ValueError(f"{key}{'.' + loc if loc else ''}: {msg}") from None


class _StoreSection(_Section):
    """What every storage section has: ``options`` (plain, refused when a key holds a
    secret) and ``secret_options`` (env or secret file only)."""

    store: ClassVar[str] = ""
    secret_options: dict[str, SecretStr] = Field(
        default_factory=dict, description="options whose values are secret (encryption "
        "keys, tokens…): env or secret file only")

    _strings = field_validator("options", "secret_options", mode="before",
                               check_fields=False)(_stringify_map)

    @field_validator("options", check_fields=False)
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        refuse_secrets(value, f"storage.{cls.store}.options",
                       f"storage.{cls.store}.secret_options or the section's credential "
                       "fields")
        return value


class S3Storage(_StoreSection):
    """S3 and S3-compatible stores (Hadoop S3A) for ``s3a://`` and ``s3://`` paths.

    Unset values fall back to the standard AWS variables (``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``).
    Without keys, S3A's default chain finds credentials (``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, then the instance role)."""

    endpoint: str | None = Field(default=None, description="e.g. http://127.0.0.1:8333; "
                                 "unset: AWS")
    region: str | None = Field(default=None, description="signing region")
    path_style_access: bool | None = Field(
        default=None, description="bucket in the path, not the host name; default: on when "
        "an endpoint is set (S3-compatible stores)")
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    profile: str | None = Field(default=None, description="an AWS profile "
                                "(~/.aws/credentials) to take credentials from")
    delta_log_store: Literal["single_driver", "dynamodb"] = Field(
        default="single_driver", description="Delta's log store for S3: single_driver (one "
        "writer per table, enforced by a writer lease) or dynamodb (several writers; needs "
        "the delta-storage-s3-dynamodb jar and a DynamoDB table)")
    dynamodb_table: str = Field(default="delta_log", description="delta_log_store: dynamodb "
                                "— the DynamoDB table (created if missing)")
    dynamodb_region: str | None = Field(default=None, description="its region; default: "
                                        "storage.s3.region")
    store: ClassVar[str] = "s3"
    options: dict[str, str] = Field(default_factory=dict,
                                    description="any other S3A option, fs.s3a.<name> -> value")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+/?$", value):
            raise ValueError("use http(s)://host[:port]")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _keys(self) -> S3Storage:
        if bool(self.access_key_id) != bool(self.secret_access_key):
            raise ValueError("storage.s3: set both access_key_id and secret_access_key, or "
                             "neither (then the default credential chain is used)")
        return self


class GcsStorage(_StoreSection):
    """Google Cloud Storage (``gs://``, the GCS connector). Unset: Application Default
    Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server)."""

    project_id: str | None = None
    service_account_keyfile: str | None = Field(
        default=None, description="path of a service account JSON key file")
    endpoint: str | None = Field(default=None, description="root URL of the JSON API "
                                 "(an emulator such as fake-gcs-server)")
    store: ClassVar[str] = "gcs"
    options: dict[str, str] = Field(default_factory=dict,
                                    description="any other connector option, fs.gs.<name>")


class AzureStorage(_StoreSection):
    """Azure Data Lake Storage Gen2 (``abfss://container@account.dfs.core.windows.net``,
    hadoop-azure ABFS). Credentials: an account key, a SAS token, or a service principal
    (client id/secret/tenant); unset values fall back to the ``AZURE_*`` variables."""

    account: str | None = Field(default=None, description="storage account name")
    account_key: SecretStr | None = None
    sas_token: SecretStr | None = None
    client_id: str | None = None
    client_secret: SecretStr | None = None
    tenant_id: str | None = None
    store: ClassVar[str] = "azure"
    options: dict[str, str] = Field(default_factory=dict,
                                    description="any other ABFS option, fs.azure.<name>")


class StorageConfig(_Section):
    s3: S3Storage = Field(default_factory=S3Storage)
    gcs: GcsStorage = Field(default_factory=GcsStorage)
    azure: AzureStorage = Field(default_factory=AzureStorage)


class RetryConfig(_Section):
    """Riding out a storage or broker that is briefly unavailable: a failed batch is
    tried again, and a failed query (e.g. its checkpoint could not be written) is
    restarted from its checkpoint, each with exponential backoff."""

    batch_attempts: int = Field(default=3, ge=1, description="tries of a failed batch "
                                "inside the running query")
    restarts: int = Field(default=5, ge=0, description="query restarts in a row without "
                          "a committed batch before the run stops (exit 1)")
    initial_backoff_s: float = Field(default=2.0, ge=0, description="first wait; doubles")
    max_backoff_s: float = Field(default=60.0, ge=0, description="longest wait")


class SilenceConfig(_Section):
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
        if value is not None and not _NAME.match(value):
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


class DlqConfig(_Section):
    format: Literal["parquet", "delta"] = Field(
        default="parquet",
        description="dead-letter tables (<base>/_rejected/<table>): parquet (a file per "
        "batch) or delta (a Delta table, committed once per batch)")
    retention_days: float | None = Field(
        default=None, gt=0, description="`lakesink vacuum` deletes dead letters older than "
        "this (none: keep them); those an unfinished `dlq replay` holds stay")


class MaintenanceConfig(_Section):
    """``maintenance``: ``lakesink compact``, ``vacuum`` and ``repair``
    (``docs/maintenance.md``)."""

    min_age_s: float = Field(
        default=3600, ge=0, description="compact a Parquet partition folder only when its "
        "newest file is at least this old (so compaction does not fight the live stream)")
    small_file_size: ByteSize | None = Field(
        default=None, description="Parquet files below this size are merged; default half "
        "of table.target_file_size (64MiB without one)")
    replaced_grace_s: float = Field(
        default=86400, ge=0, description="Parquet: files a compaction replaced are kept "
        "(outside the table) this long before `lakesink vacuum` deletes them")
    vacuum_retention_hours: float = Field(
        default=168, ge=0, description="Delta VACUUM retention; less than 168 hours is "
        "refused unless `lakesink vacuum --force`")
    zorder_by: list[str] = Field(
        default_factory=list, description="Delta OPTIMIZE: Z-order by these columns")


class QuixCatalogConfig(_Section):
    """The Quix lakehouse catalog (``catalog.type: quix``): see ``docs/catalogs.md``."""

    url: str | None = Field(default=None, description="the catalog's base URL "
                            "(Quix__Lakehouse__Catalog__Url, CATALOG_URL)")
    auth_token: SecretStr | None = Field(
        default=None, description="Bearer token; env or secret file only "
        "(Quix__Lakehouse__Catalog__AuthToken, CATALOG_AUTH_TOKEN)")
    namespace: str = Field(default="default", description="CATALOG_NAMESPACE")
    auto_discover: bool = Field(
        default=True, description="create the table in the catalog when it is not there "
        "(AUTO_DISCOVER); off: files are registered once someone else created it")
    timeout_s: float = Field(default=10.0, gt=0, description="per request")


def masked_uri(uri: str) -> str:
    """``uri`` with the password of its user info and any secret-looking query value
    shown as ``**********`` (a SQLAlchemy URL may hold a password)."""
    scheme, sep, rest = uri.partition("://")
    if sep and "@" in rest:
        userinfo, _, host = rest.rpartition("@")  # the host never holds an @
        user, colon, _ = userinfo.partition(":")
        if colon:
            uri = f"{scheme}://{user}:**********@{host}"
    return re.sub(r"(?i)([?&][^=&]*(?:password|pwd|secret|token|credential)[^=&]*=)[^&]*",
                  r"\1**********", uri)


class IcebergCatalogConfig(_Section):
    """An Iceberg catalog through pyiceberg (``catalog.type: iceberg``): see
    ``docs/catalogs.md``."""

    kind: Literal["rest", "sql"] = Field(
        default="rest", description="rest (an Iceberg REST catalog) or sql (pyiceberg's "
        "SQL catalog, e.g. sqlite:///lake/catalog.db for local disk)")
    uri: str = Field(description="http://host:8181 (rest) or a SQLAlchemy URL (sql)")
    warehouse: str | None = None
    name: str = Field(default="default", description="the catalog's name (the SQL "
                      "catalog keeps tables per catalog name: readers use the same)")
    namespace: str = "default"
    table: str | None = Field(default=None, description="default: the table's name")
    timeout_s: float = Field(default=30.0, gt=0, description="rest: the longest wait for "
                             "one HTTP answer (then the batch's registration waits)")
    properties: dict[str, str] = Field(
        default_factory=dict, description="more pyiceberg catalog / FileIO properties "
        "(s3.endpoint, …); secret-bearing ones are refused here: use secret_properties")
    secret_properties: dict[str, SecretStr] = Field(
        default_factory=dict, description="credential, token, s3.secret-access-key, …: "
        "env or secret file only")

    @field_serializer("uri", when_used="json")
    def _masked(self, value: str) -> str:
        """``lakesink validate`` shows a database URL's password as ``**********``."""
        return masked_uri(value)

    @field_validator("properties")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if any(w in key.lower() for w in ("credential", "token", "secret", "password",
                                               "access-key")):
                raise ValueError(f"catalog.iceberg.properties.{key}: a secret; set it in "
                                 f"catalog.iceberg.secret_properties (env or secret file)")
        return value


class HiveCatalogConfig(_Section):
    """A Hive metastore through Spark's own Hive support (``catalog.type: hive``): see
    ``docs/catalogs.md``."""

    uri: str | None = Field(
        default=None, description="thrift://host:9083; unset: the metastore the Spark "
        "session is configured with (spark.hadoop.hive.metastore.uris, hive-site.xml), "
        "else an embedded Derby one in the working folder")
    database: str = Field(default="default", description="created when missing")
    table: str | None = Field(default=None, description="default: the table's name")

    @field_validator("uri")
    @classmethod
    def _thrift(cls, value: str | None) -> str | None:
        if value is not None and not all(u.strip().startswith("thrift://")
                                         for u in value.split(",")):
            raise ValueError("catalog.hive.uri: thrift://host:port (comma-separated for "
                             f"several metastores), got {value!r}")
        return value

    @field_validator("database", "table")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_]+", value):
            raise ValueError(f"{value!r}: a Hive name holds letters, digits and _ only")
        return value


class CatalogConfig(_Section):
    """Where committed batches are registered after their commit (off by default)."""

    type: Literal["none", "quix", "iceberg", "hive"] = Field(
        default="none", description="none (default), quix, iceberg or hive; set by the "
        "section given")
    quix: QuixCatalogConfig | None = None
    iceberg: IcebergCatalogConfig | None = None
    hive: HiveCatalogConfig | None = None
    retry_initial_s: float = Field(default=1.0, gt=0, description="the first wait after "
                                   "a failed registration; doubles up to retry_max_s")
    retry_max_s: float = Field(default=60.0, gt=0)
    from_environment: bool = Field(
        default=False, description="set when only Quix__Lakehouse__Catalog__Url turned "
        "the catalog on: a Delta table is then written without registration (a warning) "
        "instead of refused")

    @model_validator(mode="before")
    @classmethod
    def _type_from_section(cls, data: Any) -> Any:
        if isinstance(data, dict) and "type" not in data:
            given = [k for k in ("quix", "iceberg", "hive") if data.get(k) is not None]
            if len(given) > 1:
                raise ValueError(f"catalog: one catalog per run; sections {given} given")
            if given:
                data = {**data, "type": given[0]}
        return data

    @model_validator(mode="after")
    def _section_of_type(self) -> CatalogConfig:
        if self.type == "iceberg" and self.iceberg is None:
            raise ValueError("catalog.iceberg: required for catalog.type iceberg (uri, …)")
        if self.type == "hive" and self.hive is None:
            self.hive = HiveCatalogConfig()
        if self.type == "quix":
            if self.quix is None:
                self.quix = QuixCatalogConfig()
            if not self.quix.url:
                raise ValueError("catalog.quix.url: required for catalog.type quix (or set "
                                 "Quix__Lakehouse__Catalog__Url / CATALOG_URL)")
        return self


class LoggingConfig(_Section):
    """``logging``: lakesink's own log lines on stderr (Spark's log4j has
    ``spark.log_level``)."""

    format: Literal["text", "json"] = Field(
        default="text", description="text, or json: one object per line with time, level, "
        "logger, message, and table and batch_id during a batch")
    level: Literal["DEBUG", "INFO", "WARNING", "WARN", "ERROR"] | None = Field(
        default=None, description="default: --log-level, else LOG_LEVEL or LOGLEVEL, "
        "else INFO")


class TelemetryConfig(_Section):
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


class MetricsConfig(_Section):
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


class LakesinkConfig(BaseSettings):
    """Everything ``lakesink run`` needs. Sections: source, decode, table, trigger, spark."""

    model_config = SettingsConfigDict(
        env_prefix="LAKESINK_",
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        validate_default=True,
    )

    source: SourceConfig
    decode: DecodeConfig = Field(default_factory=DecodeConfig)
    table: TableConfig = Field(default_factory=TableConfig)
    trigger: TriggerConfig = Field(default_factory=TriggerConfig)
    checkpoint: str | None = Field(
        default=None,
        description="checkpoint folder; default <base_path>/.lakesink/<table>/checkpoint",
    )
    spark: SparkConfig = Field(default_factory=SparkConfig)
    dlq: DlqConfig = Field(default_factory=DlqConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    silence: SilenceConfig = Field(default_factory=SilenceConfig)
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    routes: list[RouteConfig] = Field(
        default_factory=list,
        description="topic -> table routes; each inherits `table` and `decode`",
    )
    _route_sections: list[tuple[TableConfig, DecodeConfig]] = PrivateAttr(
        default_factory=list)
    unrouted: Literal["dlq", "drop"] = Field(
        default="dlq",
        description="records no route takes: 'dlq' (rejected, reason unrouted) or 'drop'",
    )

    @model_validator(mode="before")
    @classmethod
    def _source_from_environment(cls, data: Any) -> Any:
        """No ``source`` section: the environment may still name one (the FS Data Sink's
        ``SOURCE_TYPE`` and variables; see ``SourceConfig``)."""
        if isinstance(data, dict) and "source" not in data:
            data = {**data, "source": {}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _catalog_from_environment(cls, data: Any) -> Any:
        """The Quix sink's catalog variables: ``Quix__Lakehouse__Catalog__Url`` turns the
        Quix catalog on when no catalog is configured; with ``catalog.type: quix`` they
        and ``CATALOG_URL`` / ``CATALOG_AUTH_TOKEN`` / ``CATALOG_NAMESPACE`` /
        ``AUTO_DISCOVER`` fill what the config leaves unset."""
        from lakesink.config.settings_sources import _env_data

        env = _env_data.get() or {}
        if not isinstance(data, dict):
            return data
        catalog = data.get("catalog")
        catalog = dict(catalog) if isinstance(catalog, dict) else {}
        if "type" not in catalog and catalog.get("iceberg") is not None:
            return data  # the catalog section decides (and refuses two)
        kind = catalog.get("type") or ("quix" if catalog.get("quix") is not None else None)
        if kind is None and env.get("Quix__Lakehouse__Catalog__Url"):
            kind = "quix"
            catalog["from_environment"] = True
        if kind != "quix":
            return data
        quix = catalog.get("quix")
        quix = dict(quix) if isinstance(quix, dict) else {}
        for key, names in (("url", ("Quix__Lakehouse__Catalog__Url", "CATALOG_URL")),
                           ("auth_token", ("Quix__Lakehouse__Catalog__AuthToken",
                                           "CATALOG_AUTH_TOKEN")),
                           ("namespace", ("CATALOG_NAMESPACE",)),
                           ("auto_discover", ("AUTO_DISCOVER",))):
            value = next((env[n] for n in names if env.get(n)), None)
            if key not in quix and value is not None:  # AUTO_DISCOVER: only "true" is
                quix[key] = (value.strip().lower() == "true"  # on, as in the Quix sink
                             if key == "auto_discover" else value)
        return {**data, "catalog": {**catalog, "type": "quix", "quix": quix}}

    @model_validator(mode="after")
    def _aws_environment(self) -> LakesinkConfig:
        """The AWS variables fill what the config leaves unset — including the Quix
        connector's ``S3_BUCKET`` / ``S3_PREFIX`` for the lake's location."""
        from lakesink.config.settings_sources import _env_data

        env = _env_data.get() or {}
        s3 = self.storage.s3
        if s3.endpoint is None:
            s3.endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
                           or None)
        if s3.region is None:
            s3.region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
        if s3.profile is None:
            s3.profile = env.get("AWS_PROFILE") or None
        if s3.access_key_id is None and env.get("AWS_ACCESS_KEY_ID") and env.get(
                "AWS_SECRET_ACCESS_KEY"):
            s3.access_key_id = SecretStr(env["AWS_ACCESS_KEY_ID"])
            s3.secret_access_key = SecretStr(env["AWS_SECRET_ACCESS_KEY"])
            if env.get("AWS_SESSION_TOKEN"):
                s3.session_token = SecretStr(env["AWS_SESSION_TOKEN"])
        gcs, azure = self.storage.gcs, self.storage.azure
        if gcs.project_id is None:
            gcs.project_id = env.get("GOOGLE_CLOUD_PROJECT") or None
        if azure.account is None:
            azure.account = env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get(
                "AZURE_STORAGE_ACCOUNT") or None
        for key, var in (("account_key", "AZURE_STORAGE_ACCOUNT_KEY"),
                         ("account_key", "AZURE_STORAGE_KEY"),
                         ("sas_token", "AZURE_STORAGE_SAS_TOKEN"),
                         ("client_secret", "AZURE_CLIENT_SECRET")):
            if getattr(azure, key) is None and env.get(var):
                setattr(azure, key, SecretStr(env[var]))
        if azure.client_id is None:
            azure.client_id = env.get("AZURE_CLIENT_ID") or None
        if azure.tenant_id is None:
            azure.tenant_id = env.get("AZURE_TENANT_ID") or None
        if "base_path" not in self.table.model_fields_set and env.get("S3_BUCKET"):
            prefix = env.get("S3_PREFIX", "").strip("/")
            self.table.base_path = f"s3a://{env['S3_BUCKET']}" + (f"/{prefix}" if prefix else "")
        return self

    @model_validator(mode="after")
    def _routes(self) -> LakesinkConfig:
        """Resolve each route's table and decode settings; derive the subscription."""
        kafka = self.source.kafka
        if kafka is None:  # redis: the keys are the subscription; routes pick from them
            self._route_sections = self._resolve_routes() if self.routes else []
            return self
        if not self.routes:
            if not kafka.topics and not kafka.topic_pattern:
                raise ValueError("source.kafka: set exactly one of 'topics' or "
                                 "'topic_pattern'")
            return self
        self._route_sections = self._resolve_routes()
        if not kafka.topics and not kafka.topic_pattern:
            if all(r.topics for r in self.routes):
                kafka.topics = list(dict.fromkeys(t for r in self.routes for t in r.topics))
            else:
                kafka.topic_pattern = "|".join(
                    f"(?:{r.topic_pattern})" if r.topic_pattern
                    else "|".join(re.escape(t) for t in r.topics) for r in self.routes)
        return self

    @model_validator(mode="after")
    def _one_iceberg_table_per_route(self) -> LakesinkConfig:
        for kind in ("iceberg", "hive"):
            section = getattr(self.catalog, kind)
            if self.catalog.type == kind and section is not None and section.table \
                    and self.routes:
                raise ValueError(f"catalog.{kind}.table: with routes each table registers "
                                 "as its own catalog table (named after it); remove this key")
        return self

    def _resolve_routes(self) -> list[tuple[TableConfig, DecodeConfig]]:
        """Each route's table and decode settings (the route's over the top level's)."""
        resolved: list[tuple[TableConfig, DecodeConfig]] = []
        names: dict[str, int] = {}
        prefixes: dict[str, int] = {}  # message-type routes' table prefixes
        for i, route in enumerate(self.routes):
            table = _merged(self.table, route.table, TableConfig, f"routes.{i}.table")
            secret = _secret_in(route.decode, f"routes.{i}.decode")
            if secret:
                raise ValueError(f"{secret}: a secret in a route's overrides is printed as "
                                 "given; set it in the top-level decode section (from the "
                                 "environment or a secret file): routes inherit it")
            decode = _merged(self.decode, route.decode, DecodeConfig, f"routes.{i}.decode")
            if route.message_type is not None:
                if route.message_type.record_name and decode.registry is None:
                    raise ValueError(f"routes.{i}.message_type.record_name: needs "
                                     "decode.format avro with decode.avro.registry")
                if not route.message_type.record_name and decode.format != "json":
                    raise ValueError(f"routes.{i}.message_type: needs decode.format json "
                                     f"(the route's format is {decode.format}), or "
                                     "record_name: true for Avro through a registry")
                if "name" in route.table:
                    raise ValueError(f"routes.{i}.table.name: the message type names the "
                                     "tables; remove it (see message_type.table_prefix)")
                prefix = route.message_type.table_prefix.lower()
                for other, j in prefixes.items():
                    if prefix.startswith(other) or other.startswith(prefix):
                        raise ValueError(
                            f"routes.{i}.message_type.table_prefix: {prefix!r} and the "
                            f"prefix {other!r} of routes.{j} can name the same table (two "
                            "routes would write one table under one commit key); give each "
                            "message-type route a prefix that does not begin with another's")
                prefixes[prefix] = i
                table.name = None
                resolved.append((table, decode))
                continue
            if "name" not in route.table:
                if len(route.topics) == 1 and _NAME.match(route.topics[0]):
                    table.name = route.topics[0]
                else:
                    raise ValueError(f"routes.{i}.table.name: required unless the route "
                                     "has exactly one topic")
            assert table.name is not None
            if table.name.lower() in names:
                raise ValueError(f"routes.{i}.table.name: {table.name!r} is also the table "
                                 f"of routes.{names[table.name.lower()]}; one route per table "
                                 "(list several topics in one route)")
            names[table.name.lower()] = i
            resolved.append((table, decode))
        return resolved

    def route_config(self, index: int, table_name: str | None = None) -> LakesinkConfig:
        """The config of one route as a single-table config (its table, its decode, its
        topics), for the parts of lakesink that serve one table. A message-type route
        needs the ``table_name`` of one type."""
        table, decode = self._route_sections[index]
        route = self.routes[index]
        if table_name is not None:
            table = table.model_copy(update={"name": table_name})
        source = self.source
        if source.kafka is not None:
            kafka = source.kafka.model_copy(update={"topics": list(route.topics),
                                                    "topic_pattern": route.topic_pattern})
            source = source.model_copy(update={"kafka": kafka})
        return self.model_copy(update={"table": table, "decode": decode, "source": source,
                                       "routes": []})

    @property
    def routed_checkpoint(self) -> str:
        """The default checkpoint of a routed config (one query for every route)."""
        return f"{self.table.base_path.rstrip('/')}/.lakesink/_routes/checkpoint"

    @model_validator(mode="after")
    def _default_table_name(self) -> LakesinkConfig:
        if self.table.name is None and not self.routes:
            names = self.source.names
            if len(names) == 1 and _NAME.match(names[0]):
                self.table.name = names[0]
            else:
                raise ValueError(
                    "table.name: required unless exactly one topic (or Redis key) is read"
                )
        return self

    @property
    def table_name(self) -> str:
        assert self.table.name is not None  # filled by the validator above
        return self.table.name

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """CLI (init kwargs) > env > secret files > config file > defaults."""
        from lakesink.config.settings_sources import FileSource, ScopedEnvSource, SecretFileSource

        return (init_settings, ScopedEnvSource(settings_cls), SecretFileSource(settings_cls),
                FileSource(settings_cls))
