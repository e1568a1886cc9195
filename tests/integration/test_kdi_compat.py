"""``lakesink kdi ingest``: kafka-delta-ingest's command line run as users run it (a
separate process), into a Delta table read back by delta-rs; and taking over a table
kafka-delta-ingest wrote, from the ``txn`` offsets it left in the log."""

from __future__ import annotations

import json

import pytest

from lakesink.runtime.services import produce
from tests.fixtures.services import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

#: the upstream README's transforms, as-is
README_TRANSFORMS = ["date: substr(meta.producer.timestamp, `0`, `10`)",
                     "meta.kafka.offset: kafka.offset", "meta.kafka.partition: kafka.partition",
                     "meta.kafka.topic: kafka.topic"]


def test_the_readme_command_line_runs_as_is(kafka_broker, topic, tmp_path) -> None:
    from deltalake import DeltaTable

    n = 300
    produce(kafka_broker.bootstrap_servers, topic, [
        (f"k{i}".encode(), json.dumps({"id": i, "meta": {"producer": {
            "timestamp": f"2026-11-{1 + i % 28:02d}T08:00:00Z"}}}).encode())
        for i in range(n)])
    table = tmp_path / "lake" / "web_requests"
    result = run_cli("kdi", "ingest", topic, str(table), "-l", "60",
                     "-K", "auto.offset.reset=earliest", "-t", *README_TRANSFORMS,
                     "-k", kafka_broker.bootstrap_servers, "-e",
                     "--num_arrow_writer_threads", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--num_arrow_writer_threads" in result.stderr  # reported as ignored
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    print(f"kdi readme: {len(rows)} rows, e.g. {rows[0]}")
    assert sorted(r["id"] for r in rows) == list(range(n))
    by_id = {r["id"]: r for r in rows}
    assert by_id[3]["date"] == "2026-11-04"
    assert by_id[3]["meta"]["kafka"]["topic"] == topic
    assert len({(r["meta"]["kafka"]["partition"], r["meta"]["kafka"]["offset"])
                for r in rows}) == n


def test_taking_over_a_table_kafka_delta_ingest_wrote(kafka_broker, tmp_path) -> None:
    """kafka-delta-ingest (app id ``kdi``) wrote offsets 0-29 of partition 0 and nothing
    of partition 1, its position in ``txn`` ``kdi-0`` = 29: lakesink starts after it, so
    the table ends with every record once."""
    import pyarrow as pa
    from confluent_kafka import Producer
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    topic = f"kdi-takeover-{tmp_path.name}"[:80]
    kafka_broker.create_topic(topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for i in range(100):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=0 if i < 60 else 1)
    assert producer.flush(30) == 0
    table = tmp_path / "lake" / topic  # the fork's <table_base_uri>/<type>: the topic
    write_deltalake(str(table), pa.table({"id": pa.array(range(30), pa.int64())}),
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id="kdi-0", version=29)]))
    result = run_cli("kdi", "ingest", "--topic", topic, "--table_base_uri", str(table.parent),
                     "-a", "kdi", "-k", kafka_broker.bootstrap_servers, "-e", "-l", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "taking over from kafka-delta-ingest's offsets" in result.stderr
    ids = DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    print(f"kdi take-over: txn kdi-0=29; table {len(ids)} rows, "
          f"{len(ids) - len(set(ids))} twice")
    assert sorted(ids) == list(range(100))
