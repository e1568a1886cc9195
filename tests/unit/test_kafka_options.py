"""Kafka options passed to Spark (no Spark)."""

from __future__ import annotations

import json

import pytest

from lakesink.config import load_config
from lakesink.errors import SourceError
from lakesink.config.source import bootstrap_hosts
from lakesink.errors import ConfigError
from lakesink.sources.kafka import check_reachable, source_options
from lakesink.local.services import free_port


def cfg(**kafka: object):  # noqa: ANN201
    base = {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"]}
    return load_config(flags={f"source.kafka.{k}": v for k, v in {**base, **kafka}.items()},
                       env={})


def test_subscribe_and_defaults() -> None:
    opts = source_options(cfg(max_offsets_per_trigger=100).source.kafka)
    assert opts["subscribe"] == "t"
    assert opts["startingOffsets"] == "earliest"
    assert opts["failOnDataLoss"] == "true"
    assert opts["maxOffsetsPerTrigger"] == "100"
    assert opts["kafka.bootstrap.servers"] == "127.0.0.1:1"


def test_pattern_and_passthrough() -> None:
    c = load_config(env={}, overrides=[
        "source.kafka.bootstrap_servers=h:9",
        "source.kafka.topic_pattern=events-.*",
        "table.name=t",
        "source.kafka.options.security.protocol=SSL",
        "source.kafka.fail_on_data_loss=false",
    ])
    opts = source_options(c.source.kafka)
    assert opts["subscribePattern"] == "events-.*" and "subscribe" not in opts
    assert opts["kafka.security.protocol"] == "SSL"
    assert opts["failOnDataLoss"] == "false"


def test_sasl_builds_jaas_from_secret() -> None:
    c = load_config(env={"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": 'pa"ss'}, overrides=[
        "source.kafka.bootstrap_servers=h:9", "source.kafka.topics=t",
        "source.kafka.sasl.username=alice", "source.kafka.sasl.mechanism=SCRAM-SHA-512",
    ])
    opts = source_options(c.source.kafka)
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="alice" password="pa\\"ss";')


def test_bootstrap_hosts() -> None:
    assert bootstrap_hosts("a:1, b:2,PLAINTEXT://c:3") == [("a", 1), ("b", 2), ("c", 3)]
    with pytest.raises(ValueError, match="not host:port"):
        bootstrap_hosts("nohost")
    with pytest.raises(ConfigError) as info:  # a malformed list is a config error (exit 2)
        cfg(bootstrap_servers="nohost")
    assert info.value.key == "source.kafka.bootstrap_servers"


def test_unreachable_broker_fails_in_bounded_time() -> None:
    import time

    port = free_port()  # nothing listens there
    c = cfg(bootstrap_servers=f"127.0.0.1:{port}", connect_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(SourceError, match="no Kafka broker reachable"):
        check_reachable(c.source.kafka)
    assert time.monotonic() - started < 10


def test_status_reads_the_java_clients_tls_and_jaas_options_with_librdkafka() -> None:
    """``lakesink status`` (librdkafka) connects as the Java client would: the PEM trust
    store, the PKCS#12 key store and the JAAS config's user and password (quotes and
    backslashes unescaped as Kafka's JAAS parser does)."""
    from lakesink.sources.kafka_client import librdkafka_conf

    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            'username="ingest" password="p\\"w\\\\d";')
    config = load_config(flags={
        "source.kafka.bootstrap_servers": "b:9094", "source.kafka.topics": "t",
        "source.kafka.options": {"security.protocol": "SASL_SSL",
                                 "sasl.mechanism": "SCRAM-SHA-512",
                                 "ssl.truststore.type": "PEM",
                                 "ssl.truststore.location": "/ca.pem",
                                 "ssl.keystore.type": "PKCS12",
                                 "ssl.keystore.location": "/client.p12",
                                 "ssl.endpoint.identification.algorithm": ""}},
        env={"LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS":
             '{"sasl.jaas.config": %s, "ssl.keystore.password": "ks"}' % json.dumps(jaas)})
    conf = librdkafka_conf(config.source.kafka)
    assert conf["security.protocol"] == "SASL_SSL"
    assert (conf["sasl.mechanism"], conf["sasl.username"], conf["sasl.password"]) == (
        "SCRAM-SHA-512", "ingest", 'p"w\\d')
    assert conf["ssl.ca.location"] == "/ca.pem"
    assert (conf["ssl.keystore.location"], conf["ssl.keystore.password"]) == (
        "/client.p12", "ks")
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
