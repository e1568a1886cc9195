"""Kafka over SASL_SSL (SCRAM-SHA-512) and mutual TLS, ACLs on: the shared test broker's
secured listeners (certificates made by ``openssl`` at its start, SCRAM users made
when its storage is formatted; :mod:`lakesink.local.kafka_security`).

Reads use the settings docs/sources.md documents; each refusal (wrong password,
untrusted certificate, no READ) stops the start with one line and no secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakesink.app import Pipeline
from lakesink.config import load_config
from lakesink.errors import SourceError
from tests.fixtures.runs import flatten, run_once
from tests.fixtures.services import config_dict, duckdb_ids, produce_events

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

N = 400


@pytest.fixture()
def guarded(kafka_broker, topic) -> str:  # noqa: ANN001
    """``topic`` with ACLs: alice and the mTLS client may read it, carol may only
    describe it, bob has nothing (and, as the topic has ACLs, is refused)."""
    kafka_broker.grant(topic, "User:alice", "READ", "DESCRIBE")
    kafka_broker.grant(topic, "User:lakesink-client", "READ", "DESCRIBE")
    kafka_broker.grant(topic, "User:carol", "DESCRIBE")
    produce_events(kafka_broker, topic, range(N))
    return topic


def sasl_source(broker: Any, user: str, *, trust: Path | None = None) -> dict[str, Any]:  # noqa: ANN401
    sec = broker.security
    return {"bootstrap_servers": broker.sasl_bootstrap_servers,
            "options": {"security.protocol": "SASL_SSL", "ssl.truststore.type": "PEM",
                        "ssl.truststore.location": str(trust or sec.ca_pem)},
            "sasl": {"mechanism": "SCRAM-SHA-512", "username": user}}


def mtls_source(broker: Any, *, trust: Path | None = None) -> dict[str, Any]:  # noqa: ANN401
    sec = broker.security
    return {"bootstrap_servers": broker.tls_bootstrap_servers,
            "options": {"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                        "ssl.truststore.location": str(trust or sec.ca_pem),
                        "ssl.keystore.type": "PKCS12",
                        "ssl.keystore.location": str(sec.client_p12)}}


def secrets_env(broker: Any, user: str | None = None, *, password: str | None = None  # noqa: ANN401
                ) -> dict[str, str]:
    """The secrets as users pass them: environment variables only."""
    sec = broker.security
    if user is not None:
        return {"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": password or sec.users[user]}
    return {"LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS": (
        f'{{"ssl.keystore.password": "{sec.store_password}", '
        f'"ssl.key.password": "{sec.store_password}"}}')}


def data_for(broker: Any, topic: str, lake: Path, source: dict[str, Any]) -> dict[str, Any]:  # noqa: ANN401
    data = config_dict(broker, topic, lake)
    data["source"]["kafka"].update(source)
    return data


def lag_over(data: dict[str, Any], env: dict[str, str]) -> Any:  # noqa: ANN401
    """``lakesink status``'s lag, read with librdkafka over the same listener."""
    from lakesink.config.plan import plan
    from lakesink.status import status

    [table] = status(plan(load_config(flags=flatten(data), env=env)))
    return table.lag_error or table.lag


@pytest.mark.parametrize("listener", ["sasl_ssl", "mtls"])
def test_reads_over_a_secured_listener(spark, kafka_broker, guarded, tmp_path, listener
                                       ) -> None:
    lake = tmp_path / "lake"
    if listener == "sasl_ssl":
        source, env = sasl_source(kafka_broker, "alice"), secrets_env(kafka_broker, "alice")
    else:
        source, env = mtls_source(kafka_broker), secrets_env(kafka_broker)
    data = data_for(kafka_broker, guarded, lake, source)
    stats = run_once(spark, data, env)
    produce_events(kafka_broker, guarded, range(N, N + 7))
    lag = lag_over(data, env)
    ids = duckdb_ids(lake / "events")
    print(f"kafka-security listener={listener} produced={N} read_back={len(ids)} "
          f"duplicated={len(ids) - len(set(ids))} status_lag={lag}")
    assert sorted(ids) == list(range(N)) and stats.written == N
    assert isinstance(lag, dict) and sum(lag.values()) == 7, lag


def refusal_cases(broker: Any) -> dict[str, tuple[dict[str, Any], dict[str, str], str]]:  # noqa: ANN401
    sec = broker.security
    return {
        "wrong_password": (sasl_source(broker, "alice"),
                           secrets_env(broker, "alice", password="not-" + sec.users["alice"]),
                           "authentication failed"),
        "untrusted_certificate": (sasl_source(broker, "alice", trust=sec.rogue_ca_pem),
                                  secrets_env(broker, "alice"), "TLS handshake failed"),
        "untrusted_certificate_mtls": (mtls_source(broker, trust=sec.rogue_ca_pem),
                                       secrets_env(broker), "TLS handshake failed"),
        "no_acl": (sasl_source(broker, "bob"), secrets_env(broker, "bob"),
                   "not authorized to read the topic"),
        "describe_only": (sasl_source(broker, "carol"), secrets_env(broker, "carol"),
                          "not authorized to read topic"),
        # a topic still to be created (which carol may describe) does not hide the
        # others: the check asks each topic on its own (known-open S2)
        "describe_only_beside_a_topic_to_come": (
            {**sasl_source(broker, "carol"), "topics": ["still-to-come", "{guarded}"]},
            secrets_env(broker, "carol"), "not authorized to read topic"),
        "wrong_keystore_password": (mtls_source(broker), {
            "LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS":
                '{"ssl.keystore.password": "not-it", "ssl.key.password": "not-it"}'},
            "the Kafka client could not start"),
    }


@pytest.mark.parametrize("case", ["wrong_password", "untrusted_certificate",
                                  "untrusted_certificate_mtls", "no_acl", "describe_only",
                                  "describe_only_beside_a_topic_to_come",
                                  "wrong_keystore_password"])
def test_a_refused_connection_stops_the_start_with_one_line(spark, kafka_broker, guarded,
                                                            tmp_path, case) -> None:
    source, env, expected = refusal_cases(kafka_broker)[case]
    if "topics" in source:
        source["topics"] = [t.replace("{guarded}", guarded) for t in source["topics"]]
        kafka_broker.grant(source["topics"][0], "User:carol", "DESCRIBE")
    data = data_for(kafka_broker, guarded, tmp_path / "lake", source)
    cfg = load_config(flags=flatten(data), env=env)
    with pytest.raises(SourceError) as refused:
        Pipeline.build(cfg, spark)
    message = str(refused.value)
    print(f"kafka-security refusal={case}: {message}")
    assert message.startswith("source.kafka: Kafka at 127.0.0.1:") and expected in message
    assert "\n" not in message
    for secret in (*kafka_broker.security.users.values(), kafka_broker.security.store_password,
                   *env.values()):
        assert secret not in message
    assert not (tmp_path / "lake" / "events").exists()  # refused before any table work


# The process boundary of a refusal (exit code 1, the one `error:` line, the password
# in no output) is tested by test_planted_secrets.py's failing run.
