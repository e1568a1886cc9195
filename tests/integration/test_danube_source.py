"""Danube -> Parquet and Delta through Spark, against the protocol double (the real
danube-client over gRPC, reliable dispatch: tests/fixtures/danube_broker.py; no Danube
broker can run here): every message once, bad ones in the dead-letter table with the topic and topic
offset, every message acknowledged once the run ends."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

pytest.importorskip("danube")

from lakesink.app import Pipeline
from lakesink.config import load_config
from tests.fixtures.danube_broker import DanubeDouble
from tests.fixtures.runs import flatten, run_once
from tests.fixtures.services import json_events, read_ids, source_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture()
def danube() -> Iterator[DanubeDouble]:
    double = DanubeDouble().start()
    yield double
    double.stop()


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_danube_topics_every_message_once(spark, danube, tmp_path, fmt) -> None:
    topics = ["/default/a", "/default/b"]
    for t in topics:
        danube.subscribe_at_start(t, "lakesink")  # made before the messages
    danube.publish(topics[0], [v for _, v in json_events(range(700))])
    danube.publish(topics[1], [b"not json", *[v for _, v in json_events(range(700, 1200))]])
    lake = tmp_path / "lake"
    data = source_config({"danube": {"service_url": danube.url, "topics": topics,
                                     "subscription": "lakesink",
                                     "max_records_per_trigger": 400, "idle_s": 2}},
                         lake, format=fmt)
    stats = Pipeline.build(load_config(flags=flatten(data), env={}), spark).run(
        until_caught_up=True)
    assert sorted(read_ids(lake / "events", fmt)) == list(range(1200))
    assert stats.written == 1200 and stats.rejected == 1
    import duckdb

    dead = duckdb.sql(f"SELECT reason, topic, \"offset\" FROM "
                      f"read_parquet('{lake}/_rejected/events/*.parquet')").fetchall()
    assert Counter(dead) == Counter({("malformed_json", topics[1], 0): 1})
    assert [danube.unacked(t, "lakesink") for t in topics] == [0, 0]
    from lakesink.config.plan import plan
    from lakesink.status import status

    # the spool holds nothing after the last batch (the broker's own backlog is not
    # visible to a subscriber: the lag is what was received and not yet written)
    (table,) = status(plan(load_config(flags=flatten(data), env={})))
    assert table.lag == {t: 0 for t in topics} and table.rows == 1200, table
    danube.publish(topics[0], [v for _, v in json_events(range(1200, 1300))])
    run_once(spark, data)
    assert sorted(read_ids(lake / "events", fmt)) == list(range(1300))


def test_the_danube_sink_toml_file_runs_unchanged(spark, danube, tmp_path) -> None:
    """The Danube Delta Lake sink's config file, pointed at this double and a local
    folder: two topics with their own subscriptions into two Delta tables."""
    from tests.fixtures.services import delta_ids

    lake = tmp_path / "tables"
    toml = tmp_path / "connector.toml"
    toml.write_text(f'''
connector_name = "deltalake-sink"
danube_service_url = "{danube.url}"
[deltalake]
storage_backend = "s3"
batch_size = 300
[[deltalake.topic_mappings]]
topic = "/events/payments"
subscription = "deltalake-payments"
delta_table_path = "{lake}/payments"
schema_type = "Json"
include_danube_metadata = true
schema = [{{ name = "id", data_type = "Int64", nullable = false }},
          {{ name = "location", data_type = "Utf8" }}]
[[deltalake.topic_mappings]]
topic = "/iot/sensors"
subscription = "deltalake-iot"
delta_table_path = "{lake}/sensors"
schema_type = "Json"
schema = [{{ name = "id", data_type = "Int64" }}]
''')
    danube.subscribe_at_start("/events/payments", "deltalake-payments")  # made earlier
    danube.subscribe_at_start("/iot/sensors", "deltalake-iot")
    danube.publish("/events/payments", [v for _, v in json_events(range(400))])
    danube.publish("/iot/sensors", [v for _, v in json_events(range(400, 650))])
    cfg = load_config(toml, env={}, overrides=[f"checkpoint={tmp_path / 'checkpoint'}"])
    Pipeline.build(cfg, spark).run(until_caught_up=True)
    assert sorted(delta_ids(lake / "payments")) == list(range(400))
    assert sorted(delta_ids(lake / "sensors")) == list(range(400, 650))
    assert danube.unacked("/events/payments", "deltalake-payments") == 0
    assert danube.unacked("/iot/sensors", "deltalake-iot") == 0
    from deltalake import DeltaTable

    meta = DeltaTable(str(lake / "payments")).to_pyarrow_table(
        columns=["_danube_metadata"]).column(0).to_pylist()
    assert {m["topic"] for m in meta} == {"/events/payments"}
