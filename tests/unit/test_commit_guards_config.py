"""Issue 17's configuration refusals (no Spark): configs that would make a commit record
less than the batch wrote, two routes share one commit key, or a secret sit in a plain
option map, stop at start with one message naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from lakesink.config.loader import load_config
from lakesink.config.secrets import is_secret_key, redact
from lakesink.errors import ConfigError
from lakesink.config.plan import plan
from lakesink.runtime.storage import hadoop_options
from lakesink.sources.kafka_client import client_options

SOURCE = ["source.kafka.bootstrap_servers=b:9092", "source.kafka.topics=events"]


def _load(*overrides: str, flags: dict[str, Any] | None = None,
          env: dict[str, str] | None = None):  # noqa: ANN202
    return load_config(overrides=[*SOURCE, *overrides], flags=flags, env=env or {})


def test_a_parquet_partition_column_starting_with_underscore_is_refused() -> None:
    # scenario 1: Hadoop, Hive, Trino and pyarrow skip `_kind=a/` folders
    with pytest.raises(ConfigError) as exc:
        _load("table.partition_by=_kind")
    assert exc.value.key == "table.partition_by"
    assert "'_kind' starts with '_'" in exc.value.message
    assert "kind: _kind" in exc.value.message  # the fix: a transform renaming it


def test_delta_may_partition_by_an_underscore_column() -> None:
    # Delta's log lists the files; its readers never list folders
    assert _load("table.partition_by=_kind", "table.format=delta").table.partition_by == [
        "_kind"]


def test_a_route_partitioning_by_underscore_names_the_route() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["source.kafka.bootstrap_servers=a:1"], env={},
                    flags={"routes": [{"topics": ["a"], "table": {"partition_by": ["_k"]}}]})
    assert exc.value.key == "routes.0.table.partition_by"


@pytest.mark.parametrize(("first", "second"), [("", ""), ("", "x_"), ("ord", "ord_"),
                                               ("A_", "a_")])
def test_two_message_type_routes_that_can_name_one_table_are_refused(first: str,
                                                                     second: str) -> None:
    # scenario 2: type 'order' on both routes was one table under one commit key
    routes = [{"topics": ["a"], "message_type": {"field": "type", "table_prefix": first}},
              {"topics": ["b"], "message_type": {"field": "type", "table_prefix": second}}]
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["source.kafka.bootstrap_servers=a:1"], flags={"routes": routes},
                    env={})
    assert exc.value.key == "routes.1.message_type.table_prefix"
    assert "routes.0" in exc.value.message


def test_message_type_routes_with_distinct_prefixes_are_fine() -> None:
    routes = [{"topics": ["a"], "message_type": {"field": "type", "table_prefix": "a_"}},
              {"topics": ["b"], "message_type": {"field": "type", "table_prefix": "b_"}}]
    cfg = load_config(overrides=["source.kafka.bootstrap_servers=a:1"],
                      flags={"routes": routes}, env={})
    assert len(cfg.routes) == 2


@pytest.mark.parametrize(("key", "option"), [
    ("source.kafka.options", "sasl.jaas.config"),
    ("source.kafka.options", "ssl.key.password"),
    ("source.kafka.options", "ssl.keystore.password"),
    ("storage.s3.options", "fs.s3a.secret.key"),
    ("storage.s3.options", "fs.s3a.bucket.lake.secret.key"),
    ("storage.s3.options", "fs.s3a.encryption.key"),
    ("storage.s3.options", "fs.s3a.session.token"),
    ("storage.gcs.options", "fs.gs.auth.client.secret"),
    ("storage.azure.options", "fs.azure.account.key.acct.dfs.core.windows.net"),
    ("storage.azure.options", "fs.azure.sas.fixed.token.acct.dfs.core.windows.net"),
    ("spark.conf", "spark.hadoop.fs.s3a.secret.key"),
])
def test_secret_bearing_keys_in_plain_maps_are_refused(key: str, option: str) -> None:
    # scenario 15: a plain map is printed by `validate` and logged at DEBUG
    with pytest.raises(ConfigError) as exc:
        _load(flags={f"{key}": {option: "hunter2-secret-value"}})
    assert exc.value.key == f"{key}.{option}"
    assert "hunter2" not in str(exc.value) and "hunter2" not in exc.value.message
    assert "secret_options" in exc.value.message or "credential" in exc.value.message


@pytest.mark.parametrize("option", [
    "security.protocol", "ssl.keystore.location", "ssl.endpoint.identification.algorithm",
    "sasl.oauthbearer.token.endpoint.url", "fs.s3a.aws.credentials.provider",
    "fs.azure.sas.token.provider.type", "fs.s3a.connection.maximum",
])
def test_ordinary_options_are_not_secrets(option: str) -> None:
    assert not is_secret_key(option)


def test_secret_options_reach_the_client_from_the_environment_only() -> None:
    cfg = _load(env={"LAKESINK_STORAGE__S3__SECRET_OPTIONS": '{"fs.s3a.encryption.key": "k1"}',
                     "LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS": '{"ssl.key.password": "p1"}'})
    opts = hadoop_options(cfg.storage, plan(cfg).paths())
    assert opts["fs.s3a.encryption.key"] == "k1"
    assert redact(opts)["fs.s3a.encryption.key"] == "**********"
    assert client_options(cfg.source.kafka)["ssl.key.password"] == "p1"


def test_sasl_password_with_backslash_and_quote_is_escaped_for_jaas() -> None:
    cfg = _load("source.kafka.sasl.username=alice",
                env={"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": 'a\\b"c'})
    jaas = client_options(cfg.source.kafka)["sasl.jaas.config"]
    assert jaas.endswith('password="a\\\\b\\"c";')
