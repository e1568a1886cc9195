"""The ``source`` section: Kafka, Redis (streams and lists) or Danube; one of them."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from lakesink.config.base import Section, StrList, split_list, stringify_map
from lakesink.config.secrets import refuse_secrets


class KafkaSasl(Section):
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


class KafkaSource(Section):
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
    group_missing: Literal["refuse", "fallback"] = Field(
        default="refuse", description="starting_offsets group, when the group has no "
        "committed offset at all (a misspelt group_id, offsets the broker expired): "
        "refuse the start (default), or start every partition at group_fallback")
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

    _split = field_validator("topics", mode="before")(split_list)
    _strings = field_validator("options", "secret_options", mode="before")(stringify_map)

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


class RedisSource(Section):
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
    wait_replicas: int = Field(
        default=0, ge=0,
        description="lists: after moving a batch's items, WAIT until this many replicas "
        "have the move (a failover to a replica without it would hand the items out "
        "again: duplicates); fewer within wait_timeout_ms stops the run. 0: no wait")
    wait_timeout_ms: int = Field(default=1000, gt=0,
                                 description="lists: how long WAIT waits for the replicas")
    connect_timeout_s: float = Field(default=30.0, gt=0)
    socket_timeout_s: float = Field(default=30.0, gt=0)

    _split = field_validator("streams", "lists", mode="before")(split_list)

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


class DanubeSource(Section):
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

    _split = field_validator("topics", mode="before")(split_list)


class SourceConfig(Section):
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

    def start_settings(self) -> dict[str, str]:
        """The settings where a new checkpoint starts reading (by their keys): Spark
        keeps a checkpoint's first start in its logs and ignores a change of them."""
        if self.kafka is not None:
            return {"source.kafka.starting_offsets": self.kafka.starting_offsets}
        if self.redis is not None:
            return {"source.redis.starting_position": self.redis.starting_position}
        return {}

    @property
    def names(self) -> list[str]:
        """What the records' ``topic`` can be, when the source names them up front."""
        if self.redis is not None:
            return self.redis.keys
        if self.danube is not None:
            return self.danube.topics
        assert self.kafka is not None
        return self.kafka.topics
