"""The FS Data Sink's own config file (YAML as its README documents it, or INI) runs
as a lakesink config: every documented key mapped, its environment over the file as
there, secrets refused in the file, settings with no meaning listed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lakesink.config import load_config
from lakesink.errors import ConfigError

REDIS_S3 = """
source:
  type: redis
  host: cache.internal
  port: 6380
  db: 2
  stream_keys:
    - stream1
    - stream2
  list_keys:
    - list1
  consumer_group: fds
  value_format: json
  batch_size: 500

sink:
  type: s3
  bucket: my-bucket
  prefix: data/raw
  region_name: eu-west-1
  endpoint_url: http://minio:9000
  compression: zstd
  partition_by:
    - date
  merge_enabled: true

telemetry:
  log_level: INFO
  log_format: json

pipeline:
  flush_interval_seconds: 15
  error_handling: log
"""

KAFKA_LOCAL = """
source:
  type: kafka
  bootstrap_servers:
    - broker1:9092
    - broker2:9092
  topics:
    - topic1
  group_id: my-consumer-group
  value_format: arrow_ipc
  batch_size: 1000
  extra_config:
    auto_offset_reset: latest
    enable_auto_commit: true
sink:
  type: local
  base_path: /data/lake
"""


def write(tmp_path: Path, text: str, name: str = "fds.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_redis_and_s3_file_maps_every_key(tmp_path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="lakesink.config.loader"):
        cfg = load_config(write(tmp_path, REDIS_S3), env={})
    r = cfg.source.redis
    assert cfg.source.type == "redis"
    assert (r.host, r.port, r.db, r.streams, r.lists, r.consumer_group,
            r.max_records_per_trigger, r.value_field) == (
        "cache.internal", 6380, 2, ["stream1", "stream2"], ["list1"], "fds", None, "value")
    assert cfg.decode.format == "json"
    assert [(r.topics, r.table["name"]) for r in cfg.routes] == [
        (["stream1"], "stream1"), (["stream2"], "stream2"), (["list1"], "list1")]
    t = cfg.table
    assert (t.base_path, t.compression, t.partition_by) == (
        "s3a://my-bucket/data/raw", "zstd", ["date"])
    assert (cfg.storage.s3.region, cfg.storage.s3.endpoint) == ("eu-west-1",
                                                                "http://minio:9000")
    assert cfg.trigger.interval == "15 seconds"
    said = caplog.text
    assert "sink.merge_enabled" in said and "telemetry" in said
    assert "pipeline.error_handling" in said and "source.batch_size" in said


def test_its_environment_wins_over_the_file_as_there(tmp_path) -> None:
    cfg = load_config(write(tmp_path, REDIS_S3), env={
        "REDIS_HOST": "other", "REDIS_STREAM_KEYS": "a,b", "S3_BUCKET": "b2",
        "S3_PREFIX": "p2", "REDIS_CONTINUOUS": "false", "REDIS_PASSWORD": "pw"})
    r = cfg.source.redis
    assert (r.host, r.streams, cfg.table.base_path) == ("other", ["a", "b"], "s3a://b2/p2")
    assert cfg.trigger.until_caught_up is True
    assert r.password is not None and r.password.get_secret_value() == "pw"


@pytest.mark.parametrize(("text", "key"), [
    (REDIS_S3.replace("  db: 2\n", "  db: 2\n  password: hunter2\n"), "source.password"),
    (REDIS_S3.replace("  region_name", "  aws_secret_access_key: k\n  region_name"),
     "sink.aws_secret_access_key"),
])
def test_secrets_in_the_file_are_refused(tmp_path, text, key) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.key == key
    assert "hunter2" not in str(info.value)


def test_the_kafka_file_and_a_local_sink(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:  # Arrow IPC needs the columns declared
        load_config(write(tmp_path, KAFKA_LOCAL), env={})
    assert info.value.key == "decode.schema"
    own = "decode:\n  schema:\n    - {name: id, type: long}\n"  # lakesink's own section
    cfg = load_config(write(tmp_path, KAFKA_LOCAL + own), env={})
    k = cfg.source.kafka
    assert (k.bootstrap_servers, k.topics, k.group_id, k.max_offsets_per_trigger,
            k.starting_offsets) == ("broker1:9092,broker2:9092", ["topic1"],
                                    "my-consumer-group", None, "latest")
    assert cfg.decode.format == "arrow_ipc" and cfg.table.base_path == "/data/lake"
    assert cfg.table_name == "topic1"  # one topic: its folder, as there
    # continuous is the Redis source's; the Kafka source there reads on regardless
    text = KAFKA_LOCAL.replace("  batch_size", "  continuous: false\n  batch_size")
    cfg = load_config(write(tmp_path, text + own), env={})
    assert cfg.trigger.until_caught_up is False


def test_the_ini_file_the_code_reads(tmp_path) -> None:
    ini = """
[source]
type = redis
host = cache
stream_keys = s1, s2
batch_size = 200

[sink]
type = local
base_path = /lake
partition_by = date,hour
"""
    cfg = load_config(write(tmp_path, ini, "fds.ini"), env={})
    assert cfg.source.redis.streams == ["s1", "s2"]
    assert cfg.source.redis.max_records_per_trigger is None
    assert cfg.table.partition_by == ["date", "hour"]
    assert cfg.trigger.until_caught_up is False and cfg.trigger.interval == "10 seconds"
    # its getboolean words, and a flush interval left at none
    for word, once in (("off", True), ("no", True), ("on", False), ("1", False)):
        text = ini.replace("batch_size = 200", f"continuous = {word}") + (
            "\n[pipeline]\nflush_interval_seconds = none\n")
        cfg = load_config(write(tmp_path, text, "fds.ini"), env={})
        assert (cfg.trigger.until_caught_up, cfg.trigger.interval) == (once, "10 seconds")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, ini.replace("batch_size = 200", "continuous = maybe"),
                          "fds.ini"), env={})
    assert info.value.key == "source.continuous"


@pytest.mark.parametrize(("value", "once"), [("false", True), ("False", True),
                                             ("off", True), ("true", False), ("yes", False)])
def test_redis_continuous_from_the_environment_as_there(tmp_path, value, once) -> None:
    # there: os.environ["REDIS_CONTINUOUS"].lower() in ("true", "1", "yes")
    cfg = load_config(write(tmp_path, REDIS_S3), env={"REDIS_CONTINUOUS": value})
    assert cfg.trigger.until_caught_up is once


def test_one_key_names_the_table_and_brotli_is_refused(tmp_path) -> None:
    one = REDIS_S3.replace("    - stream2\n", "").replace("  list_keys:\n    - list1\n", "")
    cfg = load_config(write(tmp_path, one.replace("stream1", "sensors:eu")), env={})
    assert cfg.routes == [] and cfg.table_name == "sensors_eu"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, one.replace("zstd", "brotli")), env={})
    assert info.value.key == "sink.compression" and "zstd" in str(info.value)


@pytest.mark.parametrize("key", ["sasl_plain_password", "ssl_password", "api_token"])
def test_a_secret_in_extra_config_is_refused(tmp_path, key) -> None:
    text = KAFKA_LOCAL.replace("    enable_auto_commit: true\n",
                               f"    enable_auto_commit: true\n    {key}: hunter2\n")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.key == f"source.extra_config.{key}"
    assert "hunter2" not in str(info.value)


def test_an_hdfs_sink_needs_the_rpc_address(tmp_path) -> None:
    text = KAFKA_LOCAL.replace("arrow_ipc", "json").replace(
        "  type: local\n  base_path: /data/lake\n",
                               "  type: hdfs\n  url: http://nn:9870\n  base_path: /raw\n")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.key == "sink.url" and "hdfs://<namenode>:8020/raw" in str(info.value)
    cfg = load_config(write(tmp_path, text + "table:\n  base_path: hdfs://nn:8020/raw\n"
                                        + "decode:\n  format: json\n"), env={})
    assert cfg.table.base_path == "hdfs://nn:8020/raw"


def test_a_lakesink_file_is_not_taken_for_one(tmp_path) -> None:
    text = "source:\n  redis:\n    streams: [s]\ntable:\n  name: t\n"
    cfg = load_config(write(tmp_path, text), env={})
    assert cfg.source.redis.streams == ["s"] and cfg.table.name == "t"


def test_a_key_file_path_in_extra_config_is_not_a_secret(tmp_path) -> None:
    text = KAFKA_LOCAL.replace("    enable_auto_commit: true\n",
                               "    enable_auto_commit: true\n    ssl_keyfile: /k.pem\n")
    cfg = load_config(write(tmp_path, text.replace("arrow_ipc", "json")), env={})
    assert cfg.source.kafka.topics == ["topic1"]
