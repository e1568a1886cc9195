"""Iceberg through pyiceberg: lakesink's Parquet files registered in pyiceberg's SQL
catalog on local disk, read back by pyiceberg's own scan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakesink.app import Pipeline
from lakesink.config import load_config
from tests.fixtures.runs import flatten
from tests.fixtures.services import config_dict, duckdb_ids, produce_events

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def iceberg_run(spark, kafka_broker, topic: str, lake: Path, catalog: dict[str, Any]  # noqa: ANN001
                ) -> Any:  # noqa: ANN401
    data = config_dict(kafka_broker, topic, lake)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 500
    data["catalog"] = {"iceberg": catalog}
    return Pipeline.build(load_config(flags=flatten(data), env={}), spark).run(
        until_caught_up=True)


def test_every_batch_one_snapshot_and_pyiceberg_reads_exactly_the_rows(
        spark, kafka_broker, topic, tmp_path) -> None:
    from pyiceberg.catalog import load_catalog

    lake = tmp_path / "lake"
    catalog = {"kind": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
               "warehouse": f"file://{tmp_path}/warehouse", "namespace": "lake"}
    produce_events(kafka_broker, topic, range(1000))
    stats = iceberg_run(spark, kafka_broker, topic, lake, catalog)
    assert stats.registered == 2 and not stats.unregistered
    produce_events(kafka_broker, topic, range(1000, 1300), firmware="2.0")  # a new field
    stats = iceberg_run(spark, kafka_broker, topic, lake, catalog)
    assert stats.registered == 1

    table = load_catalog("default", type="sql", uri=catalog["uri"]).load_table(("lake", "events"))
    rows = table.scan().to_arrow()
    ids = rows.column("id").to_pylist()
    assert sorted(ids) == list(range(1300)) == sorted(duckdb_ids(lake / "events"))
    firmware = dict(zip(ids, rows.column("firmware").to_pylist(), strict=True))
    assert {i for i, v in firmware.items() if v == "2.0"} == set(range(1000, 1300))
    # the partition columns come from the folders, exactly as DuckDB's Hive reading says
    import duckdb

    hive = dict(((i, (loc, y, m, d)) for i, loc, y, m, d in duckdb.sql(
        f"SELECT id, location, year::VARCHAR, month::VARCHAR, day::VARCHAR FROM read_parquet("
        f"'{lake}/events/**/*.parquet', hive_partitioning=true, hive_types_autocast=false)"
    ).fetchall()))
    got = {r["id"]: (r["location"], r["year"], r["month"], r["day"])
           for r in rows.select(["id", "location", "year", "month", "day"]).to_pylist()}
    assert got == hive
    summaries = [s.summary.additional_properties for s in table.snapshots()]
    assert [s["lakesink.batch-id"] for s in summaries] == ["0", "1", "2"]
    assert len({s["lakesink.app-id"] for s in summaries}) == 1
    files = {f.file.file_path for f in table.scan().plan_files()}
    assert files == {f"file://{p}" for p in (lake / "events").rglob("*.parquet")}
    assert [f.name for f in table.spec().fields] == ["location", "year", "month", "day"]


@pytest.mark.s3
def test_iceberg_rest_catalog_of_seaweedfs_registers_the_s3_lake(
        spark, kafka_broker, s3_server, topic, tmp_path) -> None:
    """The lake on S3 (SeaweedFS), the table in SeaweedFS's own Iceberg REST catalog (its
    S3 Tables bucket ``icetables``): the data files stay in the lake's bucket."""
    from pyiceberg.catalog import load_catalog

    produce_events(kafka_broker, topic, range(600))
    data = config_dict(kafka_broker, topic, tmp_path / "unused")
    data["table"]["base_path"] = f"s3a://lake/iceberg-{topic}"
    data["source"]["kafka"]["max_offsets_per_trigger"] = 400
    data["catalog"] = {"iceberg": {"uri": s3_server.iceberg_uri, "warehouse": "icetables",
                                   "namespace": "lake", "table": f"t_{topic}".replace("-", "_")}}
    credential = f"{s3_server.access_key}:{s3_server.secret_key}"
    env = {**s3_server.env(),
           "LAKESINK_CATALOG__ICEBERG__SECRET_PROPERTIES__CREDENTIAL": credential}
    stats = Pipeline.build(load_config(flags=flatten(data), env=env), spark).run(
        until_caught_up=True)
    assert stats.registered == 2

    table = load_catalog("default", type="rest", uri=s3_server.iceberg_uri,
                         warehouse="icetables", credential=credential,
                         **{"s3.endpoint": s3_server.endpoint, "s3.path-style-access": "true",
                            "s3.access-key-id": s3_server.access_key,
                            "s3.secret-access-key": s3_server.secret_key,
                            "s3.region": "us-east-1"}
                         ).load_table(("lake", data["catalog"]["iceberg"]["table"]))
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(600))
    files = {t.file.file_path for t in table.scan().plan_files()}
    assert files and all(f.startswith(f"s3://lake/iceberg-{topic}/events/") for f in files)
    assert table.location().startswith("s3://icetables/")


def test_a_rest_catalog_that_never_answers_times_out_and_waits() -> None:
    """pyiceberg sets no HTTP timeout: lakesink bounds each request (catalog.iceberg.
    timeout_s), so a catalog that accepts the connection and goes silent delays
    registration (CatalogUnavailable) instead of holding the batch forever."""
    import socket
    import time

    from lakesink.catalog.iceberg import IcebergCatalog
    from lakesink.config.catalog import IcebergCatalogConfig
    from lakesink.errors import CatalogUnavailable

    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        port = silent.getsockname()[1]
        config = IcebergCatalogConfig(uri=f"http://127.0.0.1:{port}", timeout_s=0.5)
        catalog = IcebergCatalog(config, table="t", location="file:/l/t", partition_by=[],
                                 properties={"type": "rest", "uri": config.uri})
        started = time.monotonic()
        with pytest.raises(CatalogUnavailable):
            catalog.prepare()
        assert time.monotonic() - started < 30
    finally:
        silent.close()
