"""Hostile input through the real broker and the default data path: every record is
either written as it was sent (DuckDB and Spark read the exact value back) or is a dead
letter with its raw bytes and a reason; nothing leaves the table folder, fails the run
or holds the batch up. The outcome of each input is printed as a ``hostile`` line (the
table in the closing note)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import duckdb
import pytest

from lakesink.app import Pipeline
from lakesink.config import load_config
from tests.fixtures.runs import flatten
from tests.fixtures.services import config_dict

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

BIG = 10 * 1024 * 1024
SCHEMA = "id bigint not null, location string, payload string, score double"


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _record(i: int, *, location: Any = "ok", raw_payload: bytes | None = None,  # noqa: ANN401
            **fields: Any) -> bytes:  # noqa: ANN401
    body = {"id": i, "location": location, **fields}
    text = json.dumps(body, ensure_ascii=False).encode()
    if raw_payload is not None:
        text = text[:-1] + b', "payload": ' + raw_payload + b"}"
    return text


#: name -> (key, value, expected: "written" (its fields read back as sent), or the
#: dead-letter reason)
CASES: dict[str, tuple[bytes | None, bytes, str]] = {
    "value_10MB": (b"k", _record(1, payload="x" * BIG), "written"),
    "value_10MB_not_json": (b"k", b"{" + b"x" * BIG, "malformed_json"),
    # Spark's JSON reader (Jackson) allows 1 000 levels: the record's object and 999
    # arrays read; one more is a dead letter
    "json_nested_999": (b"k", _record(2, raw_payload=_nested(999)), "written"),
    "json_nested_1000": (b"k", _record(20, raw_payload=_nested(1000)), "malformed_json"),
    "json_nested_100000": (b"k", _record(3, raw_payload=_nested(100_000)), "malformed_json"),
    "invalid_utf8_key": (b"\xff\xfe\x00k", _record(4), "written"),
    "invalid_utf8_value": (b"k", b'{"id": 5, "location": "a\xffb"}', "malformed_json"),
    "nan": (b"k", b'{"id": 6, "location": "ok", "score": NaN}', "written"),
    "infinity": (b"k", b'{"id": 7, "location": "ok", "score": Infinity}', "written"),
    "minus_infinity": (b"k", b'{"id": 8, "location": "ok", "score": -Infinity}', "written"),
    "duplicate_keys": (b"k", b'{"id": 9, "location": "first", "location": "last"}', "written"),
    "fields_5000": (b"k", _record(10, **{f"f{n}": n for n in range(5000)}), "too_many_fields"),
    "partition_dotdot": (b"k", _record(11, location="../../x"), "written"),
    "partition_slash": (b"k", _record(12, location="a/b"), "written"),
    "partition_equals": (b"k", _record(13, location="="), "written"),
    "partition_percent_2F": (b"k", _record(14, location="%2F"), "written"),
    # Hive's rule (and Spark's partitionBy): "" shares NULL's folder and reads back as
    # NULL (DuckDB shows the folder's name); documented in docs/operations.md
    "partition_empty": (b"k", _record(15, location=""), "written_as_null"),
    "partition_255_bytes": (b"k", _record(16, location="é" * 123), "written"),
    "partition_over_255_bytes": (b"k", _record(17, location="a" * 300),
                                 "invalid_partition_value"),
    "partition_nul": (b"k", _record(18, location="a\x00b"), "invalid_partition_value"),
    "partition_backslash_dot": (b"k", _record(19, location="..\\..\\x"), "written"),
    # known-open L11: an escape of half a UTF-16 surrogate pair has no character (Spark's
    # reader wrote "?"); a whole pair, and an escaped backslash before "udc80", are text
    "json_lone_surrogate": (b"k", b'{"id": 21, "location": "ok", "payload": "a\\udc80b"}',
                            "malformed_json"),
    "json_surrogate_pair": (b"k", b'{"id": 22, "location": "ok", "payload": '
                            b'"\\ud83d\\ude00"}', "written"),
    "json_backslash_then_udc80": (b"k", b'{"id": 23, "location": "ok", "payload": '
                                  b'"\\\\udc80"}', "written"),
    # two halves with an escaped backslash between them are no pair
    "json_halves_around_a_backslash": (b"k", b'{"id": 24, "location": "ok", "payload": '
                                       b'"\\ud800\\\\\\udc00"}', "malformed_json"),
}


def _sent(value: bytes) -> dict[str, Any]:
    """The record as sent; a deeply nested payload (too deep for Python's parser) as
    the compact JSON text a string column holds."""
    head, sep, tail = value.partition(b', "payload": [')
    if sep:
        return {**json.loads(head + b"}"), "payload": (b"[" + tail[:-1]).decode()}
    return json.loads(value.decode("utf-8"))


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 16 * 1024 * 1024,
                         "compression.type": "zstd", "log_level": 3})
    errors: list[str] = []
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0,
                         on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    remaining = producer.flush(120)
    del producer
    assert remaining == 0 and not errors, errors


def test_hostile_records_are_written_exactly_or_dead_lettered(spark, kafka_broker, tmp_path
                                                              ) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"hostile-{os.getpid()}-{tmp_path.name}"[:100]
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": str(16 << 20)})]
                        )[topic].result(30)
    names = list(CASES)
    good = [(b"g", _record(1000 + i, location="ok")) for i in range(50)]
    _produce(kafka_broker.bootstrap_servers, topic,
             [*good[:25], *((CASES[n][0], CASES[n][1]) for n in names), *good[25:]])

    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, partition_by=["location"], key_column="k",
                       key_format="bytes")
    data["table"].pop("timestamp_column", None)
    data["decode"] = {"schema": SCHEMA}
    data["source"]["kafka"]["options"] = {"max.partition.fetch.bytes": str(16 << 20)}
    cfg = load_config(flags=flatten(data), env={})
    stats = Pipeline.build(cfg, spark).run(until_caught_up=True)

    table = lake / "events"
    # nothing outside the lake; every data file one folder `location=<value>` deep
    outside = [p for p in tmp_path.rglob("*") if p.is_file()
               and not p.resolve().is_relative_to(lake.resolve())]
    assert not outside, outside[:5]
    data_files = [p.relative_to(table) for p in table.rglob("*.parquet")]
    assert data_files and all(len(f.parts) == 2 and f.parts[0].startswith("location=")
                              for f in data_files), data_files
    print(f"hostile folders: {sorted({f.parts[0] for f in data_files})}")

    con = duckdb.connect()
    rows = {r[0]: r for r in con.sql(
        f"SELECT id, location, payload, score, k FROM read_parquet('{table}/**/*.parquet', "
        "hive_partitioning = true, hive_types_autocast = false)").fetchall()}
    sparked = {r["id"]: r for r in spark.read.parquet(str(table)).collect()}
    dead = {bytes(r[1]): r[0] for r in con.sql(
        f"SELECT reason, value FROM read_parquet('{lake}/_rejected/events/*.parquet')"
    ).fetchall()}

    outcomes, wrong = {}, []
    for name in names:
        key, value, expected = CASES[name]
        sent = _sent(value) if expected.startswith("written") else None
        if value in dead:
            outcome = dead[value]
        elif sent is not None and sent["id"] in rows:
            outcome = expected if expected.startswith("written") else "written"
        else:
            outcome = "missing"
        outcomes[name] = outcome
        print(f"hostile input={name} bytes={len(value)} outcome={outcome}")
        if outcome != expected:
            wrong.append((name, outcome))
        if not outcome.startswith("written") or outcome != expected:
            continue
        duck, spk = rows[sent["id"]], sparked[sent["id"]]
        if expected == "written_as_null":
            assert spk["location"] is None and duck[1] in (None, "__HIVE_DEFAULT_PARTITION__")
        else:
            assert duck[1] == sent["location"] == spk["location"], (name, duck[1])
        payload = sent.get("payload")
        want = None if payload is None else (
            payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":")))
        assert duck[2] == want and spk["payload"] == want, name
        score = sent.get("score")
        for got in (duck[3], spk["score"]):
            assert (got is None and score is None) or (
                math.isnan(got) if score is not None and math.isnan(score) else got == score)
        assert bytes(duck[4]) == key and bytes(spk["k"]) == key
    assert not wrong, wrong
    for i in range(1000, 1050):
        assert i in rows and rows[i][1] == "ok"
    assert stats.written == len(rows) == len(sparked)
    assert stats.rejected == sum(1 for e in CASES.values() if not e[2].startswith("written"))
