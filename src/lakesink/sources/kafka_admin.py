"""The Kafka cluster as the query's own Java client sees it, from the driver's JVM: the
access check at start and the consumer group's committed offsets
(``starting_offsets: group``). Both use Kafka's ``AdminClient`` with exactly the options
Spark's Kafka source gets (:func:`lakesink.sources.kafka_client.client_options`)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lakesink.config.source import KafkaSource
from lakesink.errors import ConfigError, SecondWriterError, SourceError, one_line
from lakesink.sources.kafka_client import client_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

#: Kafka's exception classes -> what the user is told (the first found in the cause chain)
_REFUSALS = {
    "SaslAuthenticationException": "authentication failed",
    "SslAuthenticationException": "the TLS handshake failed",
    "TopicAuthorizationException": "not authorized to read the topic",
    "GroupAuthorizationException": "not authorized for the consumer group",
    "ClusterAuthorizationException": "not authorized on the cluster",
    "UnsupportedSaslMechanismException": "the SASL mechanism is not enabled on the broker",
    "IllegalSaslStateException": "the listener does not speak SASL (security.protocol?)",
    "TimeoutException": "no answer from the broker (is security.protocol the listener's?)",
}


def _refusal(exc: BaseException, servers: str) -> str:
    """One line for a failed access check: what failed and Kafka's own words (which
    never hold a secret), with the root cause of a TLS failure."""
    java = getattr(exc, "java_exception", None)
    chain = []
    while java is not None and len(chain) < 10:
        chain.append((java.getClass().getSimpleName(), str(java.getMessage() or "")))
        java = java.getCause()
    what, words = "the broker refused the connection", one_line(exc, name=False)
    if chain and chain[0][1].startswith("Failed to create"):  # the client's own setup
        what, words = "the Kafka client could not start", chain[-1][1] or chain[0][1]
    for i, (name, message) in enumerate(chain):
        if name in _REFUSALS:
            what, words = _REFUSALS[name], message
            if name == "SslAuthenticationException" and i + 1 < len(chain):
                words += f" ({chain[-1][1]})"  # why: the certificate check's own words
            break
    return f"Kafka at {servers}: {what}: {words.strip()}"


@contextlib.contextmanager
def admin_client(spark: SparkSession, cfg: KafkaSource) -> Iterator[tuple[Any, Any, int]]:
    """(Kafka's AdminClient, the JVM, the timeout in ms); a failure of any call inside is
    a :class:`SourceError` of one line (:func:`_refusal`), unknown topics aside."""
    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm  # type: ignore[attr-defined]
    assert jvm is not None
    timeout_ms = max(1, int(cfg.connect_timeout_s * 1000))
    props = jvm.java.util.Properties()
    for key, value in client_options(cfg).items():
        if key != "group.id":  # a consumer's option, unknown to the admin client
            props.setProperty(key, value)
    props.setProperty("default.api.timeout.ms", str(timeout_ms))
    props.setProperty("request.timeout.ms", str(min(timeout_ms, 30_000)))
    admin = None
    try:
        admin = jvm.org.apache.kafka.clients.admin.AdminClient.create(props)
        yield admin, jvm, timeout_ms
    except Py4JJavaError as exc:
        if "UnknownTopicOrPartitionException" in str(exc.java_exception.toString()):
            raise _UnknownTopic from None
        raise SourceError(f"source.kafka: {_refusal(exc, cfg.bootstrap_servers)}") from None
    finally:
        if admin is not None:
            admin.close(jvm.java.time.Duration.ofSeconds(5))


class _UnknownTopic(Exception):
    """A topic still to be created (Spark waits for it)."""


def _describe(admin: Any, jvm: Any, topics: list[str], *,  # noqa: ANN401
              operations: bool = False) -> Any:  # noqa: ANN401
    """``describeTopics`` of ``topics``: a map of topic -> future of its description
    (with the principal's authorized operations when ``operations``)."""
    names = jvm.java.util.ArrayList()
    for topic in topics:
        names.add(topic)
    options = jvm.org.apache.kafka.clients.admin.DescribeTopicsOptions()
    if operations:
        options = options.includeAuthorizedOperations(True)
    return admin.describeTopics(names, options).topicNameValues()


def _granted(admin: Any, jvm: Any, timeout_ms: int, topics: list[str]  # noqa: ANN401
             ) -> dict[str, set[str] | None]:
    """What the principal may do on each topic that exists (None: the broker did not
    say). Each topic is asked on its own: one still to be created (Spark waits for it)
    does not hide the others' answers."""
    from py4j.protocol import Py4JJavaError

    ms = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
    futures = _describe(admin, jvm, topics, operations=True)
    out: dict[str, set[str] | None] = {}
    for topic in topics:
        try:
            ops = futures.get(topic).get(timeout_ms, ms).authorizedOperations()
        except Py4JJavaError as exc:
            if "UnknownTopicOrPartitionException" in str(exc.java_exception.toString()):
                continue
            raise
        out[topic] = {op.name() for op in ops} if ops is not None else None
    if not out and topics:
        raise _UnknownTopic
    return out


def check_access(spark: SparkSession, cfg: KafkaSource) -> None:
    """Connect as the query will (the same Java client and options, in the driver's JVM)
    and describe the topics: a wrong password, an untrusted certificate or a missing READ
    ACL is refused here, at start, with one line naming the cause
    (:class:`~lakesink.errors.SourceError`) instead of a failed query later.

    A topic pattern is checked by listing topics (authentication only).
    """
    if not cfg.check_access:
        return
    conf = spark.sparkContext.getConf()
    if any(k.startswith("spark.kafka.clusters.") for k, _ in conf.getAll()):
        logger.info("Kafka access not checked at start: Spark's delegation tokens "
                    "(spark.kafka.clusters.*) authenticate the query")
        return
    try:
        with admin_client(spark, cfg) as (admin, jvm, timeout_ms):
            if not cfg.topics:
                ms = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
                admin.listTopics().names().get(timeout_ms, ms)
                return
            granted_by_topic = _granted(admin, jvm, timeout_ms, cfg.topics)
    except _UnknownTopic:  # every topic is still to come
        return
    for topic, granted in granted_by_topic.items():
        if granted is not None and not granted & {"READ", "ALL"}:
            raise SourceError(
                f"source.kafka: Kafka at {cfg.bootstrap_servers}: not authorized to read "
                f"topic {topic!r} (the principal may {', '.join(sorted(granted)) or 'nothing'}"
                "; grant it READ)")
    logger.info("Kafka access checked: %s%s", ", ".join(granted_by_topic) or "no topic",
                "" if len(granted_by_topic) == len(cfg.topics) else
                f" ({len(cfg.topics) - len(granted_by_topic)} still to be created)")


def busy_members(group: str, topics: list[str], members: list[tuple[str, str, set[str]]],
                 *, stable: bool) -> None:
    """Refuse (:class:`SecondWriterError`) while a member of ``group`` reads ``topics``:
    the consumer lakesink takes over from (the Quix sink, kafka-delta-ingest) still runs,
    and both would write the same records. ``members``: (client id, host, topics
    assigned). A member with other topics only (one group shared by deployments of
    other topics) does not count; one with nothing assigned counts while the group is
    rebalancing (``stable`` false), when it may be about to get them."""
    wanted = set(topics)
    busy = sorted({f"{client} on {host.lstrip('/')}" for client, host, assigned in members
                   if assigned & wanted or (not assigned and not stable)})
    if busy:
        raise SecondWriterError(
            f"source.kafka: consumer group {group!r} has {len(busy)} active member(s) "
            f"reading {', '.join(topics)} ({'; '.join(busy[:5])}): the consumer lakesink "
            "takes over from still runs, and both would write the same records. Stop it "
            "first (a killed consumer leaves the group after its session timeout)")


def _require_idle(admin: Any, jvm: Any, timeout_ms: int, cfg: KafkaSource) -> None:  # noqa: ANN401
    """:func:`busy_members` of ``cfg.group_id``, described by the Java AdminClient.
    Spark's own consumers assign partitions and never join the group (unless
    ``spark.sql.streaming.kafka.useDeprecatedOffsetFetching`` is on: then its driver
    subscribes with ``kafka.group.id``)."""
    from py4j.protocol import Py4JError, Py4JJavaError

    ms = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
    names = jvm.java.util.ArrayList()
    names.add(cfg.group_id)
    try:
        described = (admin.describeConsumerGroups(names).describedGroups()
                     .get(cfg.group_id).get(timeout_ms, ms))
    except Py4JJavaError as exc:
        if "GroupIdNotFoundException" in str(exc.java_exception.toString()):
            return  # no such group: nobody in it
        raise
    try:
        state = str(described.groupState().toString())
    except Py4JError:  # kafka-clients before 3.9
        state = str(described.state().toString())
    members = [(str(m.clientId()), str(m.host()),
                {str(tp.topic()) for tp in m.assignment().topicPartitions()})
               for m in described.members()]
    busy_members(str(cfg.group_id), list(cfg.topics), members,
                 stable=state.upper() == "STABLE")


def check_idle_group(spark: SparkSession, cfg: KafkaSource) -> None:
    """``require_idle_group`` without ``starting_offsets: group`` (kafka-delta-ingest's
    take-over): the check alone."""
    assert cfg.group_id
    with admin_client(spark, cfg) as (admin, jvm, timeout_ms):
        _require_idle(admin, jvm, timeout_ms, cfg)


def group_offsets(spark: SparkSession, cfg: KafkaSource) -> str:
    """``starting_offsets: group``: Spark's per-partition ``startingOffsets`` JSON from
    the consumer group's committed offsets (what another consumer of the group, e.g. the
    tool lakesink replaces, has finished); a partition without one starts at
    ``group_fallback`` (``-2`` earliest, ``-1`` latest). Used only by a new checkpoint:
    Spark ignores ``startingOffsets`` once the checkpoint has offsets."""
    assert cfg.group_id and cfg.topics
    fallback = -2 if cfg.group_fallback == "earliest" else -1
    try:
        with admin_client(spark, cfg) as (admin, jvm, timeout_ms):
            if cfg.checks_idle_group:
                _require_idle(admin, jvm, timeout_ms, cfg)
            ms = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
            committed = (admin.listConsumerGroupOffsets(cfg.group_id)
                         .partitionsToOffsetAndMetadata().get(timeout_ms, ms))
            found = _describe(admin, jvm, cfg.topics)
            out: dict[str, dict[str, int]] = {}
            for topic in cfg.topics:
                for info in found.get(topic).get(timeout_ms, ms).partitions():
                    p = info.partition()
                    mark = committed.get(jvm.org.apache.kafka.common.TopicPartition(topic, p))
                    out.setdefault(topic, {})[str(p)] = (int(mark.offset()) if mark is not None
                                                         else fallback)
    except _UnknownTopic:
        raise SourceError(f"source.kafka: starting_offsets group: topic(s) "
                          f"{', '.join(cfg.topics)} not found, so no group position to "
                          "start from") from None
    if all(o < 0 for parts in out.values() for o in parts.values()):
        if cfg.group_missing == "refuse":
            raise ConfigError(
                "source.kafka.group_id",
                f"consumer group {cfg.group_id!r} has no committed offset for "
                f"{', '.join(cfg.topics)}: a misspelt name, or offsets the broker expired "
                "(offsets.retention.minutes). Starting every partition at group_fallback "
                f"({cfg.group_fallback}) would read records twice or skip them",
                fix="check the name; to start anyway, set source.kafka.group_missing: "
                "fallback")
        logger.warning("consumer group %r has no committed offset for %s: every partition "
                       "starts at %s (group_missing: fallback)", cfg.group_id,
                       ", ".join(cfg.topics), cfg.group_fallback)
    logger.info("starting at consumer group %r's committed offsets: %s", cfg.group_id,
                json.dumps(out, sort_keys=True))
    return json.dumps(out)
