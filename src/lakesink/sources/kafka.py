"""Kafka through Spark's own connector (``spark-sql-kafka-0-10``).

Offsets live in the Spark checkpoint, not in the consumer group: a batch's offsets
are acknowledged only when Spark marks the batch done, after the table commit.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from lakesink.config.models import KafkaSource, bootstrap_hosts
from lakesink.sources.net import wait_for_tcp

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quoted(value: str) -> str:
    """A value for a double-quoted JAAS option: Kafka's JAAS parser (Java's
    StreamTokenizer rules) reads ``\\`` as an escape, so backslashes are doubled first,
    then quotes escaped; a password with either arrives as written."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def client_options(cfg: KafkaSource) -> dict[str, str]:
    """Kafka client options (without the ``kafka.`` prefix), secrets included.

    The result holds secret values: pass it to Spark, never to a log.
    """
    opts = {"bootstrap.servers": cfg.bootstrap_servers, **cfg.options}
    if cfg.group_id:
        opts["group.id"] = cfg.group_id
    if cfg.sasl is not None:
        opts.setdefault("security.protocol", "SASL_SSL")
        opts["sasl.mechanism"] = cfg.sasl.mechanism
        if cfg.sasl.username is not None and cfg.sasl.password is not None:
            user = _jaas_quoted(cfg.sasl.username)
            pw = _jaas_quoted(cfg.sasl.password.get_secret_value())
            opts["sasl.jaas.config"] = (
                f'{_JAAS_MODULES[cfg.sasl.mechanism]} required username="{user}" password="{pw}";'
            )
    for key, secret in cfg.secret_options.items():
        opts[key] = secret.get_secret_value()
    return opts


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


def check_reachable(cfg: KafkaSource) -> None:
    """Fail with a clear error when no bootstrap server accepts a TCP connection in time."""
    wait_for_tcp(bootstrap_hosts(cfg.bootstrap_servers), cfg.connect_timeout_s,
                 what=f"no Kafka broker reachable at {cfg.bootstrap_servers}",
                 key="source.kafka.bootstrap_servers")


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
    what, words = "the broker refused the connection", str(exc).splitlines()[0][:300]
    if chain and chain[0][1].startswith("Failed to create"):  # the client's own setup
        what, words = "the Kafka client could not start", chain[-1][1] or chain[0][1]
    for i, (name, message) in enumerate(chain):
        if name in _REFUSALS:
            what, words = _REFUSALS[name], message
            if name == "SslAuthenticationException" and i + 1 < len(chain):
                words += f" ({chain[-1][1]})"  # why: the certificate check's own words
            break
    return f"Kafka at {servers}: {what}: {words.strip()}"


def check_access(spark: SparkSession, cfg: KafkaSource) -> None:
    """Connect as the query will (the same Java client and options, in the driver's JVM)
    and describe the topics: a wrong password, an untrusted certificate or a missing READ
    ACL is refused here, at start, with one line naming the cause
    (:class:`~lakesink.errors.SourceError`) instead of a failed query later.

    A topic pattern is checked by listing topics (authentication only).
    """
    from py4j.protocol import Py4JJavaError

    from lakesink.errors import SourceError

    if not cfg.check_access:
        return
    conf = spark.sparkContext.getConf()
    if any(k.startswith("spark.kafka.clusters.") for k, _ in conf.getAll()):
        logger.info("Kafka access not checked at start: Spark's delegation tokens "
                    "(spark.kafka.clusters.*) authenticate the query")
        return
    jvm = spark._jvm  # type: ignore[attr-defined]
    assert jvm is not None
    admin_pkg = jvm.org.apache.kafka.clients.admin
    timeout_ms = int(cfg.connect_timeout_s * 1000)
    props = jvm.java.util.Properties()
    for key, value in client_options(cfg).items():
        if key != "group.id":  # a consumer's option, unknown to the admin client
            props.setProperty(key, value)
    props.setProperty("default.api.timeout.ms", str(timeout_ms))
    props.setProperty("request.timeout.ms", str(min(timeout_ms, 30_000)))
    ms = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
    admin = None
    try:
        admin = admin_pkg.AdminClient.create(props)
        if not cfg.topics:
            admin.listTopics().names().get(timeout_ms, ms)
            return
        names = jvm.java.util.ArrayList()
        for topic in cfg.topics:
            names.add(topic)
        options = admin_pkg.DescribeTopicsOptions().includeAuthorizedOperations(True)
        found = admin.describeTopics(names, options).allTopicNames().get(timeout_ms, ms)
    except Py4JJavaError as exc:
        if "UnknownTopicOrPartitionException" in str(exc.java_exception.toString()):
            return  # a topic still to be created: Spark waits for it
        raise SourceError(f"source.kafka: {_refusal(exc, cfg.bootstrap_servers)}") from None
    finally:
        if admin is not None:
            admin.close(jvm.java.time.Duration.ofSeconds(5))
    for topic in cfg.topics:
        ops = found.get(topic).authorizedOperations()
        granted = {op.name() for op in ops} if ops is not None else None
        if granted is not None and not granted & {"READ", "ALL"}:
            raise SourceError(
                f"source.kafka: Kafka at {cfg.bootstrap_servers}: not authorized to read "
                f"topic {topic!r} (the principal may {', '.join(sorted(granted)) or 'nothing'}"
                "; grant it READ)")
    logger.info("Kafka access checked: %s", ", ".join(cfg.topics))


def read_stream(spark: SparkSession, cfg: KafkaSource, *, headers: bool = False
                ) -> DataFrame:
    """The streaming source; ``headers`` adds the records' headers column."""
    reader = spark.readStream.format("kafka")
    if headers:
        reader = reader.option("includeHeaders", "true")
    for key, value in source_options(cfg).items():
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
