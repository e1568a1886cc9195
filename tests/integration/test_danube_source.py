"""Danube -> Parquet and Delta through Spark, against the protocol double (the real
danube-client over gRPC: tests/fixtures/danube_broker.py; no Danube broker can run
here): every message once, bad ones in the dead-letter table with the topic and topic
offset, every message acknowledged once the run ends."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

pytest.importorskip("danube")

from lakesink.app import Pipeline
from lakesink.config import load_config
from tests.fixtures.danube_broker import DanubeDouble
from tests.fixtures.runs import flatten
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
    danube.publish(topics[0], [v for _, v in json_events(range(700))])
    danube.publish(topics[1], [b"not json", *[v for _, v in json_events(range(700, 1200))]])
    lake = tmp_path / "lake"
    data = source_config({"danube": {"service_url": danube.url, "topics": topics,
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
    danube.publish(topics[0], [v for _, v in json_events(range(1200, 1300))])
    Pipeline.build(load_config(flags=flatten(data), env={}), spark).run(until_caught_up=True)
    assert sorted(read_ids(lake / "events", fmt)) == list(range(1300))
