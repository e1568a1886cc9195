"""The lake on S3: a real S3 server (SeaweedFS on 127.0.0.1) through Hadoop S3A,
configured the way the Quix connector is (S3_BUCKET, S3_PREFIX, AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), read back by DuckDB (httpfs),
delta-rs and Spark."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from lakesink.app import Pipeline
from lakesink.config import load_config
from lakesink.runtime.services import produce
from tests.fixtures.services import (
    config_dict,
    delta_rs_s3_options,
    duckdb_s3,
    json_events,
)
from tests.integration.test_ingest import _flatten

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]

_prefix = itertools.count()


def _env(server: Any, prefix: str) -> dict[str, str]:  # noqa: ANN401
    return {**server.env(), "S3_BUCKET": server.bucket, "S3_PREFIX": prefix}


def run_s3(spark, data: dict[str, Any], env: dict[str, str]) -> Any:  # noqa: ANN001, ANN401
    cfg = load_config(flags=_flatten(data), env=env)
    return Pipeline.build(cfg, spark).run(until_caught_up=True)


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_s3_end_to_end_with_the_quix_settings(spark, kafka_broker, s3_server, topic, tmp_path,
                                              fmt) -> None:
    prefix = f"e2e-{next(_prefix)}-{fmt}"
    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(300)) + [(b"k", b"not json")])
    data = config_dict(kafka_broker, topic, tmp_path / "unused", format=fmt)
    data["table"].pop("base_path")  # S3_BUCKET / S3_PREFIX say where the lake is
    env = _env(s3_server, prefix)
    cfg = load_config(flags=_flatten(data), env=env)
    assert cfg.table.base_path == f"s3a://lake/{prefix}"
    assert cfg.storage.s3.endpoint == s3_server.endpoint
    stats = run_s3(spark, data, env)
    assert (stats.written, stats.rejected) == (300, 1)

    table = f"s3://lake/{prefix}/events"
    duck = duckdb_s3(s3_server)
    if fmt == "delta":
        from deltalake import DeltaTable

        ids = DeltaTable(table, storage_options=delta_rs_s3_options(s3_server)).to_pyarrow_table(
            columns=["id"]).column("id").to_pylist()
        spark_ids = [r[0] for r in spark.read.format("delta").load(
            table.replace("s3://", "s3a://")).select("id").collect()]
    else:
        ids = [r[0] for r in duck.sql(
            f"SELECT id FROM read_parquet('{table}/**/*.parquet', hive_partitioning=true)"
        ).fetchall()]
        spark_ids = [r[0] for r in spark.read.parquet(table).select("id").collect()]
    assert sorted(ids) == list(range(300))
    assert sorted(spark_ids) == list(range(300))
    bad = duck.sql(
        f"SELECT reason FROM read_parquet('s3://lake/{prefix}/_rejected/events/*.parquet')"
    ).fetchall()
    assert bad == [("malformed_json",)]

    # a second run appends only what is new (the checkpoint is on S3 too)
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(300, 350)))
    assert run_s3(spark, data, env).written == 50
