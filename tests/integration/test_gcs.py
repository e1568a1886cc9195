"""The lake on GCS (gs://, the GCS connector) against fake-gcs-server, the GCS emulator
(Google Cloud Storage itself cannot run here). Read back by DuckDB (objects fetched over
the emulator's JSON API) and Spark."""

from __future__ import annotations

import pytest

from lakesink.local.services import produce
from tests.fixtures.services import config_dict, json_events
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark, pytest.mark.gcs]


@pytest.fixture(scope="module")
def gcs():  # noqa: ANN201
    from lakesink.errors import ServiceError
    from lakesink.local.gcsserver import FakeGcs

    try:
        server = FakeGcs(bucket="lake").start()
    except ServiceError as exc:
        pytest.skip(f"GCS emulator unavailable: {exc}")
    yield server
    server.stop()


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_gcs_end_to_end(spark, kafka_broker, gcs, topic, tmp_path, fmt) -> None:
    import duckdb

    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(150)) + [(b"k", b"not json")])
    data = config_dict(kafka_broker, topic, tmp_path, format=fmt)
    data["table"]["base_path"] = f"gs://lake/{fmt}"
    data["storage"] = {"gcs": {"endpoint": gcs.endpoint, "project_id": "test",
                               "options": {"auth.type": "UNAUTHENTICATED"}}}
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (150, 1)
    table = f"gs://lake/{fmt}/events"
    if fmt == "delta":
        spark_ids = [r[0] for r in spark.read.format("delta").load(table).select("id").collect()]
        log = [n for n in gcs.list_objects(f"{fmt}/events/_delta_log/") if n.endswith(".json")]
        assert log, "no Delta log in the bucket"
        # data files only: which of them are live is the log's business, so Spark reads
        files = [n for n in gcs.list_objects(f"{fmt}/events/") if n.endswith(".parquet")
                 and "_delta_log" not in n]
    else:
        spark_ids = [r[0] for r in spark.read.parquet(table).select("id").collect()]
        files = [n for n in gcs.list_objects(f"{fmt}/events/") if n.endswith(".parquet")]
        local = [str(gcs.download(n, tmp_path / "got" / n)) for n in files]
        ids = [r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet({local})").fetchall()]
        assert sorted(ids) == list(range(150))
    assert files
    assert sorted(spark_ids) == list(range(150))
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(150, 170)))
    assert run_once(spark, data).written == 20
