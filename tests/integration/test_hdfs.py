"""The lake on HDFS: a real MiniDFSCluster, tables written through Spark's HDFS client,
read back by DuckDB (files fetched over WebHDFS), delta-rs (its native HDFS client)
and Spark."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from lakesink.local.services import produce
from tests.fixtures.services import HDFS_CLIENT_CONF, config_dict, json_events
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark, pytest.mark.hdfs]

_n = itertools.count()


def hdfs_parquet_ids(hdfs, table: str, tmp: Path) -> list[int]:  # noqa: ANN001
    import duckdb

    files = [f for f in hdfs.list_files(table) if f.endswith(".parquet")]
    local = [hdfs.download(f, tmp / f.lstrip("/")) for f in files]
    return [r[0] for r in duckdb.sql(
        f"SELECT id FROM read_parquet({[str(p) for p in local]})").fetchall()]


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_hdfs_end_to_end(spark, kafka_broker, hdfs, topic, tmp_path, fmt) -> None:
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in HDFS_CLIENT_CONF.items():
        conf.set(key.removeprefix("spark.hadoop."), value)
    base = f"{hdfs.uri}/lake-{next(_n)}"
    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(200)) + [(b"k", b"not json")])
    data = config_dict(kafka_broker, topic, tmp_path, format=fmt)
    data["table"]["base_path"] = base
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (200, 1)
    table = f"{base}/events"
    if fmt == "delta":
        from deltalake import DeltaTable

        ids = DeltaTable(table).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
        spark_ids = [r[0] for r in spark.read.format("delta").load(table).select("id").collect()]
    else:
        ids = hdfs_parquet_ids(hdfs, table.split(hdfs.uri)[1], tmp_path / "fetched")
        spark_ids = [r[0] for r in spark.read.parquet(table).select("id").collect()]
    assert sorted(ids) == list(range(200))
    assert sorted(spark_ids) == list(range(200))
    assert spark.read.parquet(f"{base}/_rejected/events").count() == 1
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(200, 230)))
    assert run_once(spark, data).written == 30
