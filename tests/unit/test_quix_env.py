"""The Quix TS Datalake Sink's environment as lakesink's config (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lakesink.cli import app
from lakesink.config import load_config
from lakesink.errors import ConfigError

#: the seed's "Multi-dimensional partitioning" and MinIO examples, one environment
SEED = {"input": "sensor-data", "S3_BUCKET": "lake", "HIVE_COLUMNS":
        "location,sensor_type,year,month", "TIMESTAMP_COLUMN": "timestamp",
        "AWS_ENDPOINT_URL": "http://minio.example.com:9000", "AWS_ACCESS_KEY_ID": "minioadmin",
        "AWS_SECRET_ACCESS_KEY": "minioadmin", "AWS_REGION": "us-east-1",
        "KAFKA_BOOTSTRAP_SERVERS": "broker:9092", "CONSUMER_GROUP": "s3_direct_sink_v1.0",
        "AUTO_OFFSET_RESET": "earliest", "COMMIT_INTERVAL": "30", "BATCH_SIZE": "1000",
        "MAX_WRITE_WORKERS": "10", "KAFKA_KEY_DESERIALIZER": "str",
        "KAFKA_VALUE_DESERIALIZER": "json", "LOGLEVEL": "INFO"}


def test_the_seed_environment_is_a_config_with_the_quix_layout() -> None:
    cfg = load_config(env=SEED)  # no file, input set: the Quix surface
    kafka = cfg.source.kafka
    assert kafka is not None
    assert (kafka.topics, kafka.bootstrap_servers, kafka.group_id, kafka.starting_offsets,
            kafka.group_fallback, kafka.max_offsets_per_trigger) == (
        ["sensor-data"], "broker:9092", "s3_direct_sink_v1.0", "group", "earliest", None)
    t = cfg.table
    assert (t.name, t.base_path, t.partition_by, t.timestamp_column) == (
        "sensor-data", "s3a://lake/data", ["location", "sensor_type", "year", "month"],
        "timestamp")
    assert (t.null_partition_value, t.key_column, t.key_format, t.timestamp_fallback) == (
        "__None__", "__key", "bytes", "kafka")
    assert cfg.storage.s3.endpoint == "http://minio.example.com:9000"
    assert cfg.storage.s3.secret_access_key.get_secret_value() == "minioadmin"
    assert cfg.trigger.interval == "30 seconds"
    assert cfg.decode.format == "json"


def test_the_platforms_blob_storage_and_workspace_give_the_lakehouse_path() -> None:
    blob = {"Provider": "Minio", "S3Compatible": {
        "BucketName": "quixlake", "AccessKeyId": "AK", "SecretAccessKey": "SK",
        "Region": "eu-west-1", "ServiceUrl": "http://minio:9000"}}
    cfg = load_config(env={"input": "t", "Quix__Broker__Address": "kafka:9092",
                           "Quix__Workspace__Id": "ws-1", "TABLE_NAME": "Sensors.v2",
                           "Quix__BlobStorage__Connection__Json": json.dumps(blob)})
    assert cfg.table.base_path == "s3a://quixlake/ws-1/data-lake/time-series"
    assert cfg.table.name == "Sensors.v2"
    assert cfg.source.kafka.bootstrap_servers == "kafka:9092"
    assert cfg.source.kafka.group_fallback == "latest"  # the sink's code default
    assert cfg.source.kafka.group_id == "ws-1-s3_direct_sink_v1.0"  # quixstreams' prefix
    assert cfg.trigger.interval == "30 seconds"  # COMMIT_INTERVAL unset: the sink's 30
    s3 = cfg.storage.s3
    assert (s3.endpoint, s3.region, s3.access_key_id.get_secret_value(),
            s3.secret_access_key.get_secret_value()) == ("http://minio:9000", "eu-west-1",
                                                          "AK", "SK")


@pytest.mark.parametrize(("env", "key"), [
    ({"TABLE_NAME": "-bad"}, "TABLE_NAME"),
    ({"TABLE_NAME": "a/b"}, "TABLE_NAME"),
    ({"KAFKA_VALUE_DESERIALIZER": "avro"}, "KAFKA_VALUE_DESERIALIZER"),
    ({"AUTO_OFFSET_RESET": "smallest"}, "AUTO_OFFSET_RESET"),
    ({"COMMIT_INTERVAL": "0"}, "COMMIT_INTERVAL"),
    ({"S3_BUCKET": ""}, "S3_BUCKET"),
    ({"Quix__BlobStorage__Connection__Json": '{"Provider": "Azure"}', "S3_BUCKET": ""},
     "Quix__BlobStorage__Connection__Json"),
])
def test_a_bad_quix_variable_is_named(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(env={**SEED, **env})
    assert refused.value.key == key


def test_a_config_file_wins_unless_compat_is_asked(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("source: {kafka: {bootstrap_servers: 'b:1', topics: [own]}}\n")
    assert load_config(path, env=SEED).source.kafka.topics == ["own"]
    with pytest.raises(ConfigError) as refused:
        load_config(path, env=SEED, compat="quix")
    assert refused.value.key == "--compat"


def test_run_prints_the_config_the_quix_environment_makes() -> None:
    result = CliRunner().invoke(app, ["run", "--compat", "quix", "--print-config"], env=SEED)
    assert result.exit_code == 0, result.output
    printed = result.stdout
    assert "minioadmin" not in printed
    assert "null_partition_value: __None__" in printed and "key_column: __key" in printed
    assert "storage.s3.secret_access_key: LAKESINK_STORAGE__S3__SECRET_ACCESS_KEY" in printed


def test_the_portal_api_librdkafka_settings_map_to_the_java_client() -> None:
    import base64

    from lakesink.compat.quix_portal import PASSWORD_ENV, java_settings

    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    kafka, env, unused = java_settings({
        "bootstrap.servers": "k1:9093,k2:9093", "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "ws-user",
        "sasl.password": "pw-1", "ssl.ca.cert": base64.b64encode(pem.encode()).decode(),
        "ssl.endpoint.identification.algorithm": "none", "socket.keepalive.enable": True})
    assert kafka == {"bootstrap_servers": "k1:9093,k2:9093",
                     "sasl": {"mechanism": "SCRAM-SHA-256", "username": "ws-user"},
                     "options": {"security.protocol": "SASL_SSL",
                                 "ssl.truststore.type": "PEM",
                                 "ssl.truststore.certificates": pem,
                                 "ssl.endpoint.identification.algorithm": ""}}
    assert env == {PASSWORD_ENV: "pw-1"} and unused == ["socket.keepalive.enable"]
    plain, env, _ = java_settings({"bootstrap.servers": "k:9092"})
    assert plain == {"bootstrap_servers": "k:9092"} and env == {}


def test_a_broker_address_wins_over_the_portal_token() -> None:
    cfg = load_config(env={**SEED, "KAFKA_BOOTSTRAP_SERVERS": "", "Quix__Broker__Address":
                           "b:9092", "Quix__Sdk__Token": "t", "Quix__Workspace__Id": "ws"})
    assert cfg.source.kafka.bootstrap_servers == "b:9092"  # no Portal asked (none runs)


def test_the_portal_token_needs_the_workspace() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(env={**SEED, "KAFKA_BOOTSTRAP_SERVERS": "", "Quix__Sdk__Token": "t"})
    assert refused.value.key == "Quix__Workspace__Id"


def test_the_token_goes_only_over_https() -> None:
    from lakesink.compat.quix_portal import fetch

    with pytest.raises(ConfigError) as refused:
        fetch({"Quix__Sdk__Token": "t", "Quix__Workspace__Id": "ws",
               "Quix__Portal__Api": "http://portal.example.com/"})
    assert refused.value.key == "Quix__Portal__Api"


def test_a_group_that_committed_nothing_starts_at_the_reset_only_when_it_is_given() -> None:
    """known-open L5: the sink's default latest would skip what came since it stopped."""
    told = load_config(env=SEED).source.kafka
    assert (told.group_fallback, told.group_missing) == ("earliest", "fallback")
    untold = load_config(env={k: v for k, v in SEED.items()
                              if k != "AUTO_OFFSET_RESET"}).source.kafka
    assert (untold.group_fallback, untold.group_missing) == ("latest", "refuse")
