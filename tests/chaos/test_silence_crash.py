"""Silence detection killed (SIGKILL, the whole process group) around the delivery of a
batch's events, then restarted: each event lands once in the table and once on the
topic. Event time makes the events deterministic (the replay of test_silence)."""

from __future__ import annotations

import pytest

from lakesink.faults import SILENCE_POINTS
from tests.fixtures.services import config_dict, kill_then_restart, write_config
from tests.integration.test_silence import (REPLAY_EVENTS, REPLAY_SILENCE, T0, _consume,
                                            replay_topic)

pytestmark = [pytest.mark.chaos, pytest.mark.kafka, pytest.mark.spark]


@pytest.mark.parametrize("point", SILENCE_POINTS)
def test_silence_killed_around_delivery_then_restarted(spark, kafka_broker, tmp_path, point
                                                       ) -> None:
    import duckdb

    topic, produced = replay_topic(kafka_broker)
    events_topic = f"{topic}-events"
    kafka_broker.create_topic(events_topic, partitions=1)
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, partition_by=[])
    data["source"]["kafka"].update(starting_offsets="earliest", max_offsets_per_trigger=5)
    data["silence"] = {"table": "silences", "topic": events_topic, **REPLAY_SILENCE}
    cfg = write_config(tmp_path / "c.yaml", data)
    # the first silence batch with events; the restart in the tests' process
    kill_then_restart(cfg, point, batch=None, restart_in=spark)
    con = duckdb.connect()
    table = con.sql("SELECT stream, last_seen_ms FROM read_parquet("
                    f"'{lake}/silences/*.parquet') ORDER BY last_seen_ms").fetchall()
    sent = [(v["stream"], k) for k, v, _ in _consume(kafka_broker, events_topic)]
    print(f"silence-crash point={point} table={len(table)} topic={len(sent)} "
          f"expected={len(REPLAY_EVENTS)}")
    assert [(s, t - T0) for s, t in table] == REPLAY_EVENTS
    assert sent == [(s, s.encode()) for s, _ in REPLAY_EVENTS]
    ingested = con.sql(f"SELECT count(*), count(DISTINCT id) FROM read_parquet('{lake}/events/"
                       "*.parquet')").fetchone()
    assert ingested == (produced, produced)  # ingestion, killed too, is exactly once
