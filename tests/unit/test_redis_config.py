"""The Redis source's configuration and entry-id arithmetic (no server, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lakesink.config import load_config, redacted_dict
from lakesink.errors import ConfigError
from lakesink.sources import redis_conn
from lakesink.sources.redis_positions import next_id, parse_id, position, previous_id
from lakesink.config.plan import plan

REDIS = {"source": {"redis": {"streams": ["sensors"]}}}


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "lakesink.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_redis_section_sets_the_type_and_names_the_table(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, REDIS), env={})
    assert cfg.source.type == "redis" and cfg.source.kafka is None
    assert cfg.table_name == "sensors" and cfg.source.names == ["sensors"]
    assert cfg.source.redis.value_field == "data"


@pytest.mark.parametrize(("source", "key", "words"), [
    ({"redis": {}}, "source.redis", "streams"),
    ({"redis": {"streams": ["a"], "lists": ["a"]}}, "source.redis", "both"),
    ({"type": "redis", "kafka": {"bootstrap_servers": "b:1", "topics": ["t"]}}, "source",
     "source.redis is missing"),
    ({"redis": {"streams": ["a"]}, "kafka": {"bootstrap_servers": "b:1", "topics": ["t"]}},
     "source.redis", "one source per run"),
    ({}, "source", "source.kafka is missing"),
])
def test_bad_source_sections_name_the_key(tmp_path: Path, source: dict, key: str, words: str
                                          ) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, {"source": source, "table": {"name": "t"}}), env={})
    assert info.value.key == key and words in str(info.value)


def test_password_only_from_the_environment_and_redacted(tmp_path: Path) -> None:
    data = {"source": {"redis": {"streams": ["s"], "password": "hunter2"}}}
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, data), env={})
    assert info.value.key == "source.redis.password" and "hunter2" not in str(info.value)
    cfg = load_config(write(tmp_path, REDIS), env={"LAKESINK_SOURCE__REDIS__PASSWORD": "pw1"})
    assert redis_conn.source_options(cfg.source.redis, ["s"])["password"] == "pw1"
    assert "pw1" not in yaml.safe_dump(redacted_dict(cfg)) + repr(cfg)


def test_keys_from_the_environment_as_a_comma_list(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, {"table": {"name": "t"}}), env={
        "LAKESINK_SOURCE__REDIS__LISTS": "jobs,more", "LAKESINK_SOURCE__TYPE": "redis"})
    assert cfg.source.redis.lists == ["jobs", "more"]


def test_routes_over_redis_keys(tmp_path: Path) -> None:
    data = {"source": {"redis": {"streams": ["a", "b"]}},
            "routes": [{"topics": ["a"]}, {"topics": ["b"], "table": {"name": "bee"}}]}
    cfg = load_config(write(tmp_path, data), env={})
    assert [plan(cfg).route(i).config.table_name for i in range(2)] == ["a", "bee"]


def test_entry_ids_order_and_pack() -> None:
    assert parse_id("1718000000000-3") == (1718000000000, 3)
    assert position("1718000000000-3") == (1718000000000 << 20) + 3
    assert position("1-0") < position("1-1") < position("2-0")
    assert position(f"1-{1 << 20}") == -1 and position(f"{1 << 43}-0") == -1
    assert next_id("5-7") == "5-8" and previous_id("5-0") == f"4-{(1 << 64) - 1}"
    assert previous_id("0-0") == "0-0" and next_id(f"5-{(1 << 64) - 1}") == "6-0"


def test_entry_fields_to_a_record() -> None:
    key, value, headers = redis_conn.decode_fields({b"data": b"{}", b"k": b"7"}, "data", "k")
    assert (key, value, headers) == (b"7", b"{}", [("k", b"7")])
    assert redis_conn.decode_fields({b"x": b"1"}, "data", None)[1] is None
    _, value, _ = redis_conn.decode_fields({b"a": b"1", b"b": "é".encode()}, None, None)
    assert value.decode() == '{"a": "1", "b": "é"}'


def test_the_fs_data_sink_environment(tmp_path: Path) -> None:
    """Its ``SOURCE_TYPE`` and ``REDIS_*``/``KAFKA_*`` variables fill what the config
    leaves unset; lakesink's own keys win."""
    env = {"SOURCE_TYPE": "redis", "REDIS_HOST": "cache", "REDIS_PORT": "6380",
           "REDIS_PASSWORD": "pw2", "REDIS_STREAM_KEYS": "a,b", "KAFKA_TOPICS": "t"}
    cfg = load_config(write(tmp_path, {"table": {"name": "t"}}), env=env)
    r = cfg.source.redis
    assert (cfg.source.type, r.host, r.port, r.streams) == ("redis", "cache", 6380, ["a", "b"])
    assert r.password.get_secret_value() == "pw2" and cfg.source.kafka is None
    cfg = load_config(write(tmp_path, {"source": {"redis": {"host": "mine", "lists": ["l"]}}}),
                      env={"REDIS_HOST": "cache", "REDIS_PORT": "6380"})
    assert (cfg.source.redis.host, cfg.source.redis.port) == ("mine", 6380)
    cfg = load_config(write(tmp_path, {"table": {"name": "t"}}), env={
        "SOURCE_TYPE": "kafka", "KAFKA_BOOTSTRAP_SERVERS": "k:9092", "KAFKA_TOPICS": "x,y",
        "KAFKA_GROUP_ID": "g", "REDIS_HOST": "cache"})
    k = cfg.source.kafka
    assert (k.bootstrap_servers, k.topics, k.group_id) == ("k:9092", ["x", "y"], "g")
    assert cfg.source.redis is None


def test_the_danube_section_and_the_danube_sink_variables(tmp_path: Path) -> None:
    data = {"source": {"danube": {"topics": "/default/a,/default/b",
                                  "subscription": "lake"}},
            "table": {"name": "t"}}
    cfg = load_config(write(tmp_path, data), env={"DANUBE_SERVICE_URL": "http://d:6650",
                                                  "CONNECTOR_NAME": "sink-1"})
    d = cfg.source.danube
    assert cfg.source.type == "danube" and d.topics == ["/default/a", "/default/b"]
    assert (d.service_url, d.consumer_name, d.subscription_type) == (
        "http://d:6650", "sink-1", "exclusive")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, data), env={})
    assert info.value.key == "source.danube.service_url"
    del data["source"]["danube"]["subscription"]
    with pytest.raises(ConfigError) as info:  # two deployments would split the messages
        load_config(write(tmp_path, data), env={"DANUBE_SERVICE_URL": "http://d:6650"})
    assert info.value.key == "source.danube.subscription"
    cfg = load_config(write(tmp_path, {**data, "source": {"danube": {
        "topics": ["/default/a"], "subscriptions": {"/default/a": "own"}}}}),
        env={"DANUBE_SERVICE_URL": "http://d:6650"})
    assert cfg.source.danube.subscription_of("/default/a") == "own"


DANUBE_TOML = '''
connector_name = "deltalake-sink"
danube_service_url = "http://localhost:6650"
metrics_port = 9090

[retry]
max_retries = 3

[deltalake]
storage_backend = "s3"
s3_region = "us-east-1"
s3_endpoint = "http://localhost:9000"
batch_size = 1000
flush_interval_ms = 5000

[[deltalake.topic_mappings]]
topic = "/events/payments"
subscription = "deltalake-payments"
delta_table_path = "s3://my-bucket/tables/payments"
schema_type = "Json"
include_danube_metadata = true
schema = [
    { name = "payment_id", data_type = "Utf8", nullable = false },
    { name = "amount", data_type = "Float64", nullable = false },
]

[[deltalake.topic_mappings]]
topic = "/iot/sensors"
subscription = "deltalake-iot"
delta_table_path = "s3://my-bucket/tables/sensors"
schema_type = "String"
'''


def test_the_danube_sink_toml_runs_as_a_lakesink_config(tmp_path: Path) -> None:
    """The Danube Delta Lake sink's own file (its README's example, shortened)."""
    path = tmp_path / "connector.toml"
    path.write_text(DANUBE_TOML)
    cfg = load_config(path, env={"CONNECTOR_NAME": "from-env"})
    d = cfg.source.danube
    assert d.topics == ["/events/payments", "/iot/sensors"]
    assert d.subscriptions == {"/events/payments": "deltalake-payments",
                               "/iot/sensors": "deltalake-iot"}
    assert (d.service_url, d.consumer_name, d.max_records_per_trigger) == (
        "http://localhost:6650", "from-env", 1000)  # CONNECTOR_NAME overrides, as there
    payments, sensors = plan(cfg).route(0).config, plan(cfg).route(1).config
    assert (payments.table_name, payments.table.format, payments.table.base_path) == (
        "payments", "delta", "s3://my-bucket/tables")
    assert payments.table.metadata_column == "_danube_metadata"
    assert [f.name for f in payments.decode.schema_] == ["payment_id", "amount"]
    assert (sensors.table_name, sensors.decode.format) == ("sensors", "string")
    assert cfg.storage.s3.endpoint == "http://localhost:9000"
    assert cfg.trigger.interval.startswith("5000")


def test_fields_that_are_not_utf8_make_a_dead_letter_not_replaced_text() -> None:
    """audit-2 #18: with every field as the JSON value, invalid UTF-8 became U+FFFD and
    two names replaced alike collapsed into one key (a value lost) — a row, silently.
    Now the value keeps the raw bytes: invalid UTF-8, which the decoder rejects as a
    dead letter with its bytes."""
    import json

    import pytest

    from lakesink.sources.redis_conn import decode_fields

    _, value, _ = decode_fields({b"\xff": b"a", b"\xfe": b"b", b"f": b"\xc3\x28"}, None, None)
    assert value is not None
    with pytest.raises(UnicodeDecodeError):
        value.decode()
    assert b'"\xff":"a"' in value and b'"\xfe":"b"' in value and b'"f":"\xc3\x28"' in value
    # valid UTF-8 (quotes and backslashes too) is the JSON object of strings, as before
    _, good, _ = decode_fields({b"a": b'say "hi" \\ bye', b"k": "é".encode()}, None, None)
    assert json.loads(good) == {"a": 'say "hi" \\ bye', "k": "é"}


def test_wait_replicas_reaches_the_list_reader_and_is_off_by_default(tmp_path: Path) -> None:
    """audit-2 #17: ``wait_replicas`` (lists) goes to the reader's options; a negative
    count is refused, naming the key."""
    cfg = load_config(write(tmp_path, {"source": {"redis": {"lists": ["jobs"]}}}), env={})
    assert "wait_replicas" not in redis_conn.source_options(cfg.source.redis, ["jobs"])
    data = {"source": {"redis": {"lists": ["jobs"], "wait_replicas": 2, "wait_timeout_ms": 50}}}
    opts = redis_conn.source_options(load_config(write(tmp_path, data), env={}).source.redis,
                                     ["jobs"])
    assert (opts["wait_replicas"], opts["wait_timeout_ms"]) == ("2", "50")
    data["source"]["redis"]["wait_replicas"] = -1
    with pytest.raises(ConfigError, match="source.redis.wait_replicas"):
        load_config(write(tmp_path, data), env={})
