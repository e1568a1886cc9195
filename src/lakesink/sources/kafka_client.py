"""The Kafka client's settings, once for both clients: the Java client's options
(:func:`client_options`: what Spark's Kafka source and lakesink's admin checks are
given) and librdkafka's (:func:`librdkafka_conf`, the same options translated for
``confluent_kafka``, which ``lakesink status``, the catch-up progress and the take-over
checks use without a JVM)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakesink.config.source import KafkaSource


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


def librdkafka_conf(kafka: KafkaSource) -> dict[str, Any]:
    """librdkafka settings for reading end offsets, from the Java client's options:
    plaintext, SASL (the ``sasl`` section or a PLAIN/SCRAM ``sasl.jaas.config``) and TLS
    with PEM trust stores and PKCS#12 key stores (librdkafka reads no JKS)."""
    opts = {**kafka.options, **{k: v.get_secret_value() for k, v in
                                kafka.secret_options.items()}}
    conf: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap_servers,
                            "group.id": "lakesink-status", "enable.auto.commit": False,
                            "log_level": 0}  # a failure is reported in the status instead
    protocol = opts.get("security.protocol")
    if kafka.sasl is not None:
        conf["security.protocol"] = protocol or "SASL_SSL"
        conf["sasl.mechanism"] = kafka.sasl.mechanism
        if kafka.sasl.username is not None and kafka.sasl.password is not None:
            conf["sasl.username"] = kafka.sasl.username
            conf["sasl.password"] = kafka.sasl.password.get_secret_value()
    elif protocol:
        conf["security.protocol"] = protocol
    jaas = opts.get("sasl.jaas.config", "")
    for key in ("username", "password"):
        found = re.search(rf'\b{key}="((?:[^"\\]|\\.)*)"', jaas)
        if found:
            conf[f"sasl.{key}"] = re.sub(r"\\(.)", r"\1", found.group(1))
    if opts.get("sasl.mechanism"):
        conf["sasl.mechanism"] = opts["sasl.mechanism"]
    if opts.get("ssl.truststore.type", "").upper() == "PEM" and opts.get(
            "ssl.truststore.location"):
        conf["ssl.ca.location"] = opts["ssl.truststore.location"]
    if opts.get("ssl.truststore.type", "").upper() == "PEM" and opts.get(
            "ssl.truststore.certificates"):
        conf["ssl.ca.pem"] = opts["ssl.truststore.certificates"]
    if opts.get("ssl.keystore.type", "").upper() == "PEM" and opts.get(
            "ssl.keystore.certificate.chain"):
        conf["ssl.certificate.pem"] = opts["ssl.keystore.certificate.chain"]
        if opts.get("ssl.keystore.key"):
            conf["ssl.key.pem"] = opts["ssl.keystore.key"]
    if opts.get("ssl.keystore.type", "").upper() == "PKCS12" and opts.get(
            "ssl.keystore.location"):
        conf["ssl.keystore.location"] = opts["ssl.keystore.location"]
        if opts.get("ssl.keystore.password"):
            conf["ssl.keystore.password"] = opts["ssl.keystore.password"]
    if opts.get("ssl.endpoint.identification.algorithm") == "":
        conf["ssl.endpoint.identification.algorithm"] = "none"
    return conf
