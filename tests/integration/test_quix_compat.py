"""The Quix TS Datalake Sink's own example environment, run as-is against the real
broker and S3 (SeaweedFS in MinIO's place), taking over from the Quix sink's consumer
group: the output tree is the one its README describes (``__key`` and ``__None__`` as
the Quix sink writes them), and nothing the Quix sink had consumed is read again."""

from __future__ import annotations

import json

import pytest

from lakesink.app import Pipeline
from lakesink.config import load_config
from lakesink.errors import ConfigError, SecondWriterError

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]


def test_the_seed_example_environment_runs_as_is_and_takes_over(spark, kafka_broker,
                                                                s3_server, topic) -> None:
    """The Quix sink's group (CONSUMER_GROUP) has committed partition 0 up to offset 30
    and nothing of partition 1: lakesink starts at the group's offsets (partition 1 at
    AUTO_OFFSET_RESET=earliest), then follows its own checkpoint."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from tests.fixtures.services import duckdb_s3

    def send(ids: range, partition: int) -> None:
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
        for i in ids:
            value = {"location": ["NYC", "LDN", None][i % 3],
                     "sensor_type": ["temp", "hum"][i % 2],
                     "timestamp": 1_704_067_200_000 + i * 8_640_000, "value": i / 2, "id": i}
            producer.produce(topic, json.dumps(value).encode(), key=f"sensor-{i % 7}".encode(),
                             partition=partition)
        assert producer.flush(30) == 0

    send(range(60), 0)
    send(range(60, 100), 1)
    group = f"quix-{topic}"
    quix = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": group,
                     "enable.auto.commit": False})
    quix.commit(offsets=[TopicPartition(topic, 0, 30)], asynchronous=False)
    quix.close()
    prefix = f"quix-{topic}"
    env = {  # the README's example 2 and its MinIO example, SeaweedFS standing in for MinIO
        "input": topic, "S3_BUCKET": s3_server.bucket, "S3_PREFIX": prefix,
        "HIVE_COLUMNS": "location,sensor_type,year,month", "TIMESTAMP_COLUMN": "timestamp",
        "AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key, "AWS_REGION": "us-east-1",
        "KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers, "CONSUMER_GROUP": group,
        "AUTO_OFFSET_RESET": "earliest", "MAX_WRITE_WORKERS": "10",
    }
    # a group with no committed offset at all (a misspelt name, expired offsets) and
    # no AUTO_OFFSET_RESET given is refused: the sink's default latest would skip what
    # came since it stopped (known-open L5)
    missing = {**{k: v for k, v in env.items() if k != "AUTO_OFFSET_RESET"},
               "CONSUMER_GROUP": f"{group}-misspelt", "S3_PREFIX": f"{prefix}-never"}
    with pytest.raises(ConfigError) as no_offsets:
        Pipeline.build(load_config(env=missing), spark).run(until_caught_up=True)
    assert no_offsets.value.key == "source.kafka.group_id", str(no_offsets.value)
    assert "has no committed offset" in str(no_offsets.value)
    assert "group_missing: fallback" in str(no_offsets.value)
    still_running = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers,
                              "group.id": group, "client.id": "quix-sink",
                              "enable.auto.commit": False})
    still_running.subscribe([topic])
    while not still_running.assignment():  # the Quix sink, still consuming
        still_running.poll(0.5)
    with pytest.raises(SecondWriterError) as refused:
        Pipeline.build(load_config(env=env), spark).run(until_caught_up=True)
    still_running.close()
    print(f"quix take-over while the sink runs: {refused.value}")
    assert f"has 1 active member(s) reading {topic} (quix-sink on" in str(refused.value)
    first = Pipeline.build(load_config(env=env), spark).run(until_caught_up=True)
    send(range(100, 110), 0)
    Pipeline.build(load_config(env=env), spark).run(until_caught_up=True)
    assert first.written == 70

    duck = duckdb_s3(s3_server)
    root = f"s3://{s3_server.bucket}/{prefix}/{topic}"
    files = [r[0][len(root) + 1:] for r in duck.sql(
        f"SELECT file FROM glob('{root}/**/*.parquet')").fetchall()]
    folders = sorted({f.rsplit("/", 1)[0] for f in files})
    print(f"quix tree under s3://{s3_server.bucket}/{prefix}/{topic}/: {folders}")
    assert "location=NYC/sensor_type=temp/year=2024/month=01" in folders
    assert any(f.startswith("location=__None__/") for f in folders)
    assert all(len(f.split("/")) == 4 for f in folders)
    rows = duck.sql(f"SELECT id, location, __key FROM read_parquet('{root}/**/*.parquet', "
                    "hive_partitioning = true, hive_types_autocast = false)").fetchall()
    ids = [r[0] for r in rows]
    print(f"quix take-over: group committed p0@30, p1 none; read back {len(ids)} rows, "
          f"{len(ids) - len(set(ids))} twice, smallest of p0 {min(i for i in ids if i < 60)}")
    assert sorted(ids) == list(range(30, 110))
    by_id = {r[0]: r for r in rows}
    assert bytes(by_id[36][2]) == b"sensor-1" and by_id[32][1] == "__None__"


def test_on_the_platform_the_broker_settings_come_from_the_portal_api(spark, kafka_broker,
                                                                     s3_server, topic) -> None:
    """Quix Cloud gives a deployment a token, not a broker: the Portal API (a protocol
    double here) answers the workspace's librdkafka settings, SASL_SSL with SCRAM and a
    base64 CA, for the broker's SASL_SSL listener; the topic has ACLs (alice may read).
    A wrong token stops the start naming Quix__Sdk__Token."""
    import base64

    from lakesink.errors import ConfigError
    from tests.fixtures.quix_portal import QuixPortalDouble
    from tests.fixtures.services import duckdb_s3, produce_events

    sec = kafka_broker.security
    kafka_broker.grant(topic, "User:alice", "READ", "DESCRIBE")
    produce_events(kafka_broker, topic, range(40))
    workspace = f"ws{topic[-6:]}"
    librdkafka = {"bootstrap.servers": kafka_broker.sasl_bootstrap_servers,
                  "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                  "sasl.username": "alice", "sasl.password": sec.users["alice"],
                  "ssl.ca.cert": base64.b64encode(sec.ca_pem.read_bytes()).decode()}
    blob = {"Provider": "Minio", "S3Compatible": {
        "BucketName": s3_server.bucket, "AccessKeyId": s3_server.access_key,
        "SecretAccessKey": s3_server.secret_key, "Region": "us-east-1",
        "ServiceUrl": s3_server.endpoint}}
    with QuixPortalDouble(token="sdk-token-1", workspace=workspace,
                          librdkafka=librdkafka) as portal:
        env = {"input": topic, "Quix__Sdk__Token": "sdk-token-1",
               "Quix__Portal__Api": portal.url, "Quix__Workspace__Id": workspace,
               "Quix__BlobStorage__Connection__Json": json.dumps(blob),
               "AUTO_OFFSET_RESET": "earliest"}
        with pytest.raises(ConfigError) as refused:
            load_config(env={**env, "Quix__Sdk__Token": "expired"})
        cfg = load_config(env=env)
        stats = Pipeline.build(cfg, spark).run(until_caught_up=True)
        path, headers = portal.requests[-1]
    print(f"quix portal: refused {refused.value}; asked {path} (X-Version "
          f"{headers.get('X-Version')}); written {stats.written}")
    assert refused.value.key == "Quix__Sdk__Token"
    kafka = cfg.source.kafka
    assert kafka.bootstrap_servers == kafka_broker.sasl_bootstrap_servers
    assert kafka.options["security.protocol"] == "SASL_SSL"
    assert "sasl.password" not in str(cfg.model_dump())  # the password is a secret env
    root = f"s3://{s3_server.bucket}/{workspace}/data-lake/time-series/{topic}"
    duck = duckdb_s3(s3_server)
    ids = [r[0] for r in duck.sql(
        f"SELECT id FROM read_parquet('{root}/**/*.parquet')").fetchall()]
    assert sorted(ids) == list(range(40)) and stats.written == 40
