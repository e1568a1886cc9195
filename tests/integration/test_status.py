"""``lakesink status`` after real runs (Parquet and Delta), read without Spark: the
last batch, what the table holds, dead letters by reason, and the Kafka lag once more
records arrive than were ingested."""

from __future__ import annotations

import json

import pytest

from lakesink.local.services import produce
from tests.fixtures.services import (
    config_dict,
    produce_events,
    run_cli,
    write_config,
)
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_status_reports_the_table_and_its_lag(spark, kafka_broker, topic, tmp_path,
                                              fmt) -> None:
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, partition_by=[], format=fmt)
    produce_events(kafka_broker, topic, range(120))
    produce(kafka_broker.bootstrap_servers, topic, [(b"k", b"nope"), (b"k", b"[1]")])
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (120, 2)
    produce_events(kafka_broker, topic, range(120, 150))  # not ingested: the lag
    cfg = write_config(tmp_path / "c.yaml", data)

    from tests.integration.test_observe import PLANTED

    result = run_cli("status", "-c", str(cfg), "--json", timeout=120, env=PLANTED)
    assert result.returncode == 0, result.stderr[-2000:]
    for marker in PLANTED.values():  # the S3 keys it was given never show
        assert marker not in result.stdout + result.stderr
    assert "spark" not in result.stderr.lower()  # no JVM started
    (table,) = json.loads(result.stdout)
    assert (table["table"], table["format"], table["rows"]) == ("events", fmt, 120)
    assert table["batches"] == stats.batches and table["files"] >= 1
    assert table["mean_file_bytes"] == table["bytes"] // table["files"] > 0
    assert table["hint"] is None  # a few files: nothing to say
    assert table["last_batch"] == stats.batches - 1 and table["last_commit"]
    assert table["rejected"] == {"malformed_json": 1, "not_an_object": 1}
    assert table["schema_version"] == 1
    assert set(table["lag"]) == {f"{topic}/0", f"{topic}/1"}, table  # two partitions
    assert sum(table["lag"].values()) == 30, table

    text = run_cli("status", "-c", str(cfg), timeout=120)
    assert text.returncode == 0 and f"{topic}/0: {table['lag'][f'{topic}/0']}" in \
        text.stdout.replace("\n", ""), text.stdout
