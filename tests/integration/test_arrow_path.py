"""The Arrow data path against the Spark path, record for record.

The Spark path is the oracle: the same records (good ones, and a corpus of edge cases
in every field: wrong JSON types, overflowing numbers, nulls in required fields, bad
UTF-8, unknown keys, epoch numbers of every unit as numbers and as text, ISO-8601
(as the timestamp column and as a timestamp field),
NaN, values outside years 1-9999, hostile partition values) run through
``engine: spark`` and ``engine: arrow`` into two lakes; DuckDB reads both back (rows,
partition folders, key and metadata columns) and the dead letters (offset, reason,
detail, stage) — everything must be equal, and most rows must have come through the
Arrow tasks (the manifests count them), or the test proves nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest

from lakesink.config import load_config
from lakesink.errors import ConfigError
from lakesink.local.services import produce
from tests.fixtures.runs import flatten, run_once
from tests.fixtures.services import config_dict, delta_ids, produce_events, read_ids

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

SCHEMA = ("id bigint not null, location string, ts string, small smallint, ratio float, "
          "score double, flag boolean, at timestamp, born date")
EDGE_VALUES: list[bytes | None] = [
    None, b"", b" ", b"null", b"[1]", b"5", b'"text"', b"not json", b'{"id": 1} {"id": 2}',
    b'{"id": 1, "id": 2}', b'{"id": 1}x', b"\xef\xbb\xbf{\"id\": 1}", b"{'id': 1}",
    b'{"id": 1, "location": "a\xffb"}', b'{"id": 1, "location": "\\ud800"}',
    b'{"id": 1, "location": "\\u00e9 /=..%"}', b'{"id": 1,\n"location":\r\n"nl"}',
    b'{"id": null}', b'{"location": "no id"}', b'{"id": 1.0}', b'{"id": 1e3}',
    b'{"id": "12"}', b'{"id": 9223372036854775808}', b'{"id": -9223372036854775808}',
    b'{"id": 1, "small": 40000}', b'{"id": 1, "small": -32768}', b'{"id": 1, "ratio": 1e39}',
    b'{"id": 1, "ratio": 3.4028235e38}', b'{"id": 1, "ratio": 0.1}', b'{"id": 1, "score": NaN}',
    b'{"id": 1, "score": 1e308}', b'{"id": 1, "score": "1.5"}', b'{"id": 1, "flag": 1}',
    b'{"id": 1, "flag": "true"}', b'{"id": 1, "flag": false, "location": ""}',
    b'{"id": 1, "location": 5}', b'{"id": 1, "location": {"a": 1}}', b'{"id": 1, "extra": 1}',
    b'{"ID": 1}', b'{"id": 1, "ts": "1795000000"}', b'{"id": 1, "ts": "1795000000000"}',
    b'{"id": 1, "ts": "1795000000000000"}', b'{"id": 1, "ts": "1795000000000000000"}',
    b'{"id": 1, "ts": " 1795000000.5 "}', b'{"id": 1, "ts": "\\t1795000000"}',
    b'{"id": 1, "ts": "2026-11-27T08:00:00Z"}', b'{"id": 1, "ts": "2026-11-27 08:00:00"}',
    b'{"id": 1, "ts": "yesterday"}', b'{"id": 1, "ts": "NaN"}', b'{"id": 1, "ts": "1e400"}',
    b'{"id": 1, "ts": "-62135596801"}', b'{"id": 1, "ts": "253402300800"}',
    b'{"id": 1, "ts": "1e20"}', b'{"id": 1, "ts": "+.5e3"}', b'{"id": 1, "ts": ""}',
    b'{"id": 1, "ts": 1795000000}', b'{"id": 1, "ts": null}', b'{"id": 1, "ts": "-1e400"}',
    # a timestamp field: ISO instants with a zone are the Arrow path's, the rest Spark's
    b'{"id": 1, "at": "2026-11-27T08:00:00Z"}', b'{"id": 1, "at": "2026-11-27T08:00:00.5+05:45"}',
    b'{"id": 1, "at": "2026-11-27T08:00:00"}', b'{"id": 1, "at": "2026-11-27 08:00:00Z"}',
    b'{"id": 1, "at": "2026-02-30T08:00:00Z"}', b'{"id": 1, "at": 1795000000}',
    b'{"id": 1, "at": "2026-11-27T08:00:00.1234567Z"}', b'{"id": 1, "at": ""}',
    b'{"id": 1, "at": "soon"}', b'{"id": 1, "at": "0001-01-02T00:30:00+00:30"}',
    b'{"id": 1, "at": "2026-11-27T08:00:00-18:00"}', b'{"id": 1, "at": "2026-11-27"}',
    # a date field: yyyy-mm-dd is the Arrow path's, the rest Spark's
    b'{"id": 1, "born": "2026-11-27"}', b'{"id": 1, "born": "0001-01-01"}',
    b'{"id": 1, "born": "2026-02-30"}', b'{"id": 1, "born": "2026-1-5"}',
    b'{"id": 1, "born": "2026"}', b'{"id": 1, "born": "2026-11-27T08:00:00Z"}',
    b'{"id": 1, "born": 20000}', b'{"id": 1, "born": ""}',
    # partition values that cannot name a folder (a NUL; over 255 bytes escaped) and
    # the longest that can: the first three are dead letters, not a batch that fails
    b'{"id": 1, "location": "a\\u0000b"}', b'{"id": 1, "location": "%s"}' % (b"a" * 247),
    b'{"id": 1, "location": "%s"}' % (b"=" * 83), b'{"id": 1, "location": "%s"}' % (b"a" * 246),
    # fits a folder in Spark's spelling (240 bytes), not in a Delta table's ASCII one
    # (720 bytes): a row of a Parquet table, a dead letter of a Delta table
    b'{"id": 1, "location": "%s"}' % ("\u00e9" * 120).encode(),
]
#: the edge values with reason ``invalid_partition_value`` (Parquet; Delta: one more)
UNFIT_FOLDERS = 3


def _random_records(rng: random.Random, n: int) -> list[bytes | None]:
    """Records that are mostly good, with a random field going wrong now and then."""
    choices: dict[str, list[Any]] = {
        "location": ["oslo", "b/c", "x=y", "..", "", None, 7, "ünï", "%41"],
        "ts": [str(1795000000 + rng.randrange(10**6)), str(1795000000000 + rng.randrange(10**9)),
               1795000000123, None, "2026-01-01T00:00:00", "1.795e9", "-1"],
        "small": [1, -5, 32767, 32768, None, "3", 1.5],
        "ratio": [0.5, 1, None, 1e40, -0.0, "x"],
        "score": [2.25, -1e-300, None, True],
        "flag": [True, False, None, 0],
        "at": ["2026-11-27T08:00:00.25Z", None, "2026-01-01T00:00:00+01:00",
               "2026-01-01 00:00:00", 5, "2026-13-01T00:00:00Z"],
        "born": ["1999-12-31", None, "1999-12-32", "2000-02-29", "2001-02-29", "1999-1-1"],
    }
    out: list[bytes | None] = []
    for i in range(n):
        record: dict[str, Any] = {"id": i}
        for name, values in choices.items():
            if rng.random() < 0.8:
                record[name] = values[0] if rng.random() < 0.7 else rng.choice(values)
        out.append(json.dumps(record).encode())
    return out


def _config(kafka_broker, topic: str, lake: Path, engine: str, **table: Any) -> dict[str, Any]:
    table.setdefault("timestamp_column", "ts")
    data = config_dict(kafka_broker, topic, lake, engine=engine,
                       partition_by=["location", "flag", "year", "month", "day", "hour"],
                       key_column="k", metadata_column="meta",
                       schema_evolution="strict", **table)
    data["decode"] = {"schema": SCHEMA}
    data["source"]["kafka"]["max_offsets_per_trigger"] = 300
    return data


def _rows(table: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    rows = con.sql(
        f"SELECT meta.\"offset\", meta.\"partition\", * EXCLUDE (meta), meta.topic, "
        f"meta.\"timestamp\", meta.timestamp_type FROM read_parquet('{table}/**/*.parquet', "
        "hive_partitioning = true, hive_types_autocast = false)").fetchall()
    def same_nan(v: Any) -> Any:  # noqa: ANN401 - NaN != NaN: compare it as a word
        return "NaN" if isinstance(v, float) and v != v else v

    return sorted((tuple(same_nan(v) for v in r) for r in rows), key=lambda r: (r[1], r[0]))


def _clickhouse_rows(table: Path) -> list[str]:
    """The table as ClickHouse (chDB, a reader nobody here wrote) reads it, row by row
    as text: a Delta table by its log (``deltaLakeLocal``); a Parquet table's every
    file, with the folders' values (as named: ClickHouse does not unescape them)."""
    import contextlib

    import chdb

    source = (f"deltaLakeLocal('{table}')" if (table / "_delta_log").exists() else
              f"file('{table}/**/*.parquet', Parquet) SETTINGS use_hive_partitioning = 1")
    with contextlib.chdir(table):  # ClickHouse reads local tables below its directory
        return sorted(chdb.query(f"SELECT * FROM {source}", "TSV").data().splitlines())


def _folders(table: Path) -> set[str]:
    return {str(p.parent.relative_to(table)) for p in table.rglob("*.parquet")}


def _dead_letters(lake: Path) -> list[tuple[Any, ...]]:
    return sorted(duckdb.sql(
        f"SELECT partition, \"offset\", reason, detail, stage, key, value "
        f"FROM read_parquet('{lake}/_rejected/events/*.parquet')").fetchall(),
        key=lambda r: (r[0], r[1]))


def _arrow_rows(lake: Path) -> int:
    return sum(json.loads(p.read_text()).get("arrow_rows", 0)
               for p in (lake / ".lakesink" / "events" / "manifests").rglob("*.json"))


def _files_per_batch_folder(table: Path, fmt: str) -> dict[tuple[int, str], int]:
    """New files per (batch, partition folder): Parquet from the published names
    (``part-<batch>-<run>-<n>``), Delta from each commit's add actions."""
    from collections import Counter
    from urllib.parse import unquote

    if fmt == "parquet":
        return Counter((int(p.name.split("-")[1]), str(p.parent.relative_to(table)))
                       for p in table.rglob("part-*.parquet"))
    out: Counter[tuple[int, str]] = Counter()
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            add = json.loads(line).get("add")
            if add:
                out[(int(entry.stem), unquote(add["path"]).rpartition("/")[0])] += 1
    return out


@pytest.mark.parametrize(("fmt", "merged_by"), [("parquet", "tasks"), ("delta", "tasks"),
                                               ("parquet", "driver")])
def test_the_arrow_path_writes_one_new_file_per_folder_per_batch(
        spark, kafka_broker, topic, tmp_path, monkeypatch, fmt, merged_by) -> None:
    """``table.files_per_partition: 1`` (the default) on the Arrow path: the topic's two
    partitions are two tasks, each writing a file into every folder it has rows for;
    their files of a folder are merged before the commit (in a Spark job, or by the
    driver for a small batch), so each batch adds one file per folder, every row once
    (DuckDB, delta-rs). With 0 (as the tasks write them) folders get two: the merge is
    what makes the difference."""
    from lakesink.pipeline import arrow_merge

    monkeypatch.setattr(arrow_merge, "DRIVER_ROWS", 0 if merged_by == "tasks" else 10**6)
    produce_events(kafka_broker, topic, range(600))
    files = {}
    for setting in (1, 0):
        lake = tmp_path / f"files-{setting}"
        data = config_dict(kafka_broker, topic, lake, format=fmt, engine="arrow",
                           files_per_partition=setting)
        data["source"]["kafka"]["max_offsets_per_trigger"] = 300
        stats = run_once(spark, data)
        assert stats.written == 600
        assert sorted(read_ids(lake / "events", fmt)) == list(range(600))
        files[setting] = _files_per_batch_folder(lake / "events", fmt)
    assert len(files[1]) >= 12 and set(files[1].values()) == {1}, files[1]
    assert max(files[0].values()) == 2


@pytest.mark.parametrize("null_value", ["__HIVE_DEFAULT_PARTITION__", "none"])
def test_arrow_path_writes_what_the_spark_path_writes(spark, kafka_broker, topic, tmp_path,
                                                      null_value) -> None:
    rng = random.Random(20261127)
    # the second null folder value needs the edge values and fewer random records
    values = [*EDGE_VALUES,
              *_random_records(rng, 800 if null_value == "__HIVE_DEFAULT_PARTITION__" else 200)]
    keys = [b"k%d" % i if i % 7 else (b"\xff\xfe" if i % 2 else None)
            for i in range(len(values))]
    produce(kafka_broker.bootstrap_servers, topic, list(zip(keys, values, strict=True)))
    lakes = {engine: tmp_path / engine for engine in ("spark", "arrow")}
    configs = {engine: _config(kafka_broker, topic, lake, engine,
                               null_partition_value=null_value)
               for engine, lake in lakes.items()}
    for data in configs.values():  # more than one batch into the folders either way
        data["source"]["kafka"]["max_offsets_per_trigger"] = len(values) // 3 + 1
    stats = {engine: run_once(spark, configs[engine]) for engine in lakes}

    spark_rows, arrow_rows = (_rows(lakes[e] / "events") for e in ("spark", "arrow"))
    assert len(spark_rows) + len(_dead_letters(lakes["spark"])) == len(values)
    assert len(arrow_rows) == len(spark_rows)
    for want, got in zip(spark_rows, arrow_rows, strict=True):
        assert got == want
    assert _folders(lakes["arrow"] / "events") == _folders(lakes["spark"] / "events")
    clickhouse = _clickhouse_rows(lakes["arrow"] / "events")  # known-open T9
    assert len(clickhouse) == len(spark_rows)
    assert clickhouse == _clickhouse_rows(lakes["spark"] / "events")
    assert _dead_letters(lakes["arrow"]) == _dead_letters(lakes["spark"])
    assert [r[2:5] for r in _dead_letters(lakes["spark"])
            if r[2] == "invalid_partition_value"] == [
        ("invalid_partition_value", "location: the value cannot name a partition folder (it "
         "holds a NUL byte, or location=<value>, escaped, is over 255 bytes)", "schema")
    ] * UNFIT_FOLDERS
    assert stats["arrow"].written == stats["spark"].written
    assert stats["arrow"].rejected == stats["spark"].rejected
    assert stats["arrow"].unknown_dropped == stats["spark"].unknown_dropped
    # the Arrow tasks wrote most rows; Spark's decoder only saw the suspects
    assert _arrow_rows(lakes["arrow"]) > len(spark_rows) * 0.5


def test_engine_arrow_refuses_a_table_it_cannot_write(spark, kafka_broker, topic,
                                                      tmp_path) -> None:
    data = _config(kafka_broker, topic, tmp_path / "lake", "arrow",
                   transforms=["doubled: id * 2"])
    with pytest.raises(ConfigError, match="table.engine"):
        run_once(spark, data)


def _delta_rows(spark, table: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]:  # noqa: ANN001
    """(rows as delta-rs reads them, rows as Spark reads them, Spark's count — which
    Delta answers from the files' statistics)."""
    from deltalake import DeltaTable

    def key(r: tuple[Any, ...]) -> tuple[str, ...]:
        return tuple(repr(v) for v in r)

    def same_nan(v: Any) -> Any:  # noqa: ANN401 - and UTC datetimes without their zone
        if isinstance(v, dict):  # (Spark's session time zone is UTC)
            return tuple(sorted((k, same_nan(x)) for k, x in v.items()))
        if isinstance(v, dt.datetime) and v.tzinfo is not None:
            return v.astimezone(dt.UTC).replace(tzinfo=None)
        return "NaN" if isinstance(v, float) and v != v else v

    arrow = DeltaTable(str(table)).to_pyarrow_table()
    names = sorted(arrow.column_names)
    by_rs = sorted((tuple(same_nan(r[n]) for n in names) for r in arrow.to_pylist()), key=key)
    frame = spark.read.format("delta").load(str(table))
    by_spark = sorted((tuple(same_nan(r.asDict(recursive=True)[n]) for n in names)
                       for r in frame.collect()), key=key)
    return by_rs, by_spark, frame.count()


def _delta_rs_rows(table: Path) -> int:
    """Rows added by delta-rs commits (the Arrow path's), from the log."""
    rows = 0
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            info = json.loads(line).get("commitInfo") or {}
            rows += int(info.get("lakesink.rows", 0))
    return rows


def test_arrow_path_commits_to_delta_what_the_spark_path_commits(spark, kafka_broker, topic,
                                                                  tmp_path) -> None:
    """The same corpus into Delta tables: Spark's writer against the Arrow tasks'
    files committed by delta-rs (the suspects Spark accepts moved in beside them). Both
    readers (delta-rs, Spark) see the same rows in both tables, Spark's count (from the
    add actions' statistics) is exact, and most rows came through delta-rs commits.
    The timestamp column here is the timestamp field ``at`` (the year/month/day/hour
    partition values are in the rows compared)."""
    rng = random.Random(20261128)
    values = [*EDGE_VALUES, *_random_records(rng, 1200)]  # enough batches for a checkpoint
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k%d" % i, v) for i, v in enumerate(values)])
    lakes = {engine: tmp_path / engine for engine in ("spark", "arrow")}
    stats = {engine: run_once(spark, _config(kafka_broker, topic, lake, engine, format="delta",
                                         timestamp_column="at", delta_checkpoint_interval=3))
             for engine, lake in lakes.items()}
    want_rs, want_spark, want_count = _delta_rows(spark, lakes["spark"] / "events")
    got_rs, got_spark, got_count = _delta_rows(spark, lakes["arrow"] / "events")
    assert len(want_rs) + len(_dead_letters(lakes["spark"])) == len(values)
    assert got_rs == want_rs
    assert got_spark == want_spark == want_rs
    assert got_count == want_count == len(want_rs)
    clickhouse = _clickhouse_rows(lakes["arrow"] / "events")  # known-open T9
    assert len(clickhouse) == len(want_rs)
    assert clickhouse == _clickhouse_rows(lakes["spark"] / "events")
    assert _dead_letters(lakes["arrow"]) == _dead_letters(lakes["spark"])
    assert [r[2:5] for r in _dead_letters(lakes["spark"])
            if r[2] == "invalid_partition_value"] == [
        ("invalid_partition_value", "location: the value cannot name a partition folder (it "
         "holds a NUL byte, or location=<value>, escaped, is over 255 bytes)", "schema")
    ] * (UNFIT_FOLDERS + 1)
    assert stats["arrow"].written == stats["spark"].written
    assert stats["arrow"].rejected == stats["spark"].rejected
    assert _delta_rs_rows(lakes["spark"] / "events") == 0
    assert _delta_rs_rows(lakes["arrow"] / "events") > len(want_rs) * 0.5
    # 5+ commits: both writers follow the table's checkpoint interval of 3 (delta-rs'
    # own default would be 100; it checkpoints the 3rd commit, version 2)
    for lake in lakes.values():
        assert list((lake / "events" / "_delta_log").glob("*.checkpoint.parquet"))


def _delta_with_commits(spark, kafka_broker, topic: str, lake: Path, caplog, seed: int,
                        n: int) -> tuple[list[Any], list[str]]:  # noqa: ANN001
    """``n`` random records and one malformed into a Delta table on the Arrow path (its
    delta-rs commits patched by the caller); checks that every record is a row once
    (delta-rs, Spark and Spark's count agree) or a dead letter. Returns the dead letters
    and the WARNING lines said."""
    import logging

    values = [*_random_records(random.Random(seed), n), b"not json"]
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k%d" % i, v) for i, v in enumerate(values)])
    with caplog.at_level(logging.WARNING, logger="lakesink"):
        stats = run_once(spark, _config(kafka_broker, topic, lake, "auto", format="delta"))
    rows, by_spark, count = _delta_rows(spark, lake / "events")
    dead = _dead_letters(lake)
    assert len(rows) + len(dead) == len(values) == stats.written + stats.rejected
    assert by_spark == rows and count == len(rows)
    ids = delta_ids(lake / "events")
    assert len(set(ids)) == len(ids) == len(rows)  # every id once
    assert _delta_rs_rows(lake / "events") in (0, len(rows))
    return dead, [r.getMessage() for r in caplog.records]


def test_a_commit_delta_rs_refuses_falls_back_to_spark_writer(spark, kafka_broker, topic,
                                                             tmp_path, monkeypatch,
                                                             caplog) -> None:
    """delta-rs refuses a commit without the log moving (a table feature or state it
    does not handle; injected here): nothing is committed from the tasks' files, the
    batch is written by Spark's Delta writer instead (dead letters staged once, by that
    path), and the later batches go there directly: every row once, no stuck stream.
    known-open T5: Spark's first commit is cut off after that path staged the dead
    letters (the batch is done again, as a restart would): still every dead letter
    once."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    from lakesink.tables.delta import DeltaTableWriter

    def refuse(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise CommitFailedError("refused by the test")

    real, cut = DeltaTableWriter.write_batch, []

    def cut_off_once(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if not cut and self.layout.name == "events":
            cut.append(1)
            raise RuntimeError("cut off before Spark's commit (the test)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", refuse)
    monkeypatch.setattr(DeltaTableWriter, "write_batch", cut_off_once)
    lake = tmp_path / "lake"
    dead, said = _delta_with_commits(spark, kafka_broker, topic, lake, caplog, 7, 900)
    assert cut == [1]
    assert any(r[1] < 100 for r in dead)  # the batch cut off (the first) had dead letters
    assert "malformed_json" in {r[2] for r in dead}
    assert _delta_rs_rows(lake / "events") == 0
    assert sum("take Spark's Delta writer" in m for m in said) == 1


def test_a_delta_rs_commit_that_fails_once_is_tried_again_not_refused(
        spark, kafka_broker, topic, tmp_path, monkeypatch, caplog) -> None:
    """A commit that fails once with the log unmoved (a failed put: delta-rs reports a
    store error like a refusal) is tried once more: the batch lands through delta-rs,
    the table does not turn to Spark's writer, every row once."""
    from deltalake import DeltaTable

    real = DeltaTable.create_write_transaction
    failed: list[int] = []

    def fail_once(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        from deltalake.exceptions import CommitFailedError

        if not failed:
            failed.append(1)
            raise CommitFailedError("Error interacting with object store: injected")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", fail_once)
    lake = tmp_path / "lake"
    dead, said = _delta_with_commits(spark, kafka_broker, topic, lake, caplog, 8, 600)
    assert failed == [1]
    rows = len(delta_ids(lake / "events"))
    assert rows and _delta_rs_rows(lake / "events") == rows  # every row through delta-rs
    assert sum("trying once more" in m for m in said) == 1
    assert not any("Spark's Delta writer" in m or "take Spark's writer" in m for m in said)


def test_time_folders_are_utc_whatever_the_session_time_zone(spark, kafka_broker, topic,
                                                             tmp_path) -> None:
    """``spark.sql.session.timeZone`` set to a zone 5:45 ahead of UTC: both engines put
    23:30 UTC on 27 November (and 00:10 UTC on 1 January 1970's eve, before the epoch)
    in that UTC day's and hour's folders (Spark's ``year``/``hour`` of a timestamp would
    use the session zone), and a date timestamp column at its midnight UTC (a cast of a
    date to a timestamp would take the session zone's)."""
    instants = {dt.datetime(2026, 11, 27, 23, 30, tzinfo=dt.UTC):
                "year=2026/month=11/day=27/hour=23",
                dt.datetime(1969, 12, 31, 0, 10, tzinfo=dt.UTC):
                "year=1969/month=12/day=31/hour=00"}
    produce(kafka_broker.bootstrap_servers, topic, [
        (b"k", json.dumps({"id": i, "location": "x", "flag": True, "born": "2026-11-27",
                           "ts": str(int(t.timestamp()))}).encode())  # epoch seconds
        for i, t in enumerate(instants)])
    lakes = {(engine, column): tmp_path / f"{engine}-{column}"
             for engine in ("spark", "arrow") for column in ("ts", "born")}
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kathmandu")
    try:
        stats = {(engine, column): run_once(spark, _config(kafka_broker, topic, lake, engine,
                                                       timestamp_column=column))
                 for (engine, column), lake in lakes.items()}
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    want = {"ts": {f"location=x/flag=true/{folder}" for folder in instants.values()},
            "born": {"location=x/flag=true/year=2026/month=11/day=27/hour=00"}}
    for (engine, column), lake in lakes.items():
        assert stats[engine, column].written == len(instants)
        assert _folders(lake / "events") == want[column], (engine, column)
        if engine == "arrow":
            assert _arrow_rows(lake) == len(instants)


def test_a_refused_commit_that_lands_late_keeps_its_dead_letters(
        spark, kafka_broker, topic, tmp_path, monkeypatch) -> None:
    """Two failed puts count as a refusal, but the second one lands after all (its
    answer was lost): Spark's writer then finds the batch committed and skips it. The
    dead letters staged for that commit are published, not dropped (review)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    from lakesink.tables.delta import DeltaTableWriter

    real_commit = DeltaTable.create_write_transaction
    real_write = DeltaTableWriter.write_batch
    late: list[tuple[Any, ...]] = []

    def fail(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        late[:] = [(self, args, kwargs)]
        raise CommitFailedError("Error interacting with object store: injected")

    def land_then_write(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if late:  # the lost put lands before Spark's writer runs
            table, a, k = late.pop()
            real_commit(table, *a, **k)
            landed.append(1)
        return real_write(self, *args, **kwargs)

    landed: list[int] = []
    monkeypatch.setattr(DeltaTable, "create_write_transaction", fail)
    monkeypatch.setattr(DeltaTableWriter, "write_batch", land_then_write)
    values = [*_random_records(random.Random(9), 200), b"not json"]
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k%d" % i, v) for i, v in enumerate(values)])
    lake = tmp_path / "lake"
    stats = run_once(spark, _config(kafka_broker, topic, lake, "auto", format="delta"))
    assert landed == [1]  # the window was walked: the batch came through the late put
    assert stats.skipped == 1  # Spark's writer found it committed
    ids = delta_ids(lake / "events")
    dead = _dead_letters(lake)
    assert len(set(ids)) == len(ids) and len(ids) + len(dead) == len(values)
    assert "malformed_json" in {r[2] for r in dead}


def test_a_batch_cut_off_after_its_suspects_moved_in_leaves_no_row(spark, kafka_broker, topic,
                                                                   tmp_path, monkeypatch) -> None:
    """known-open T7: a Delta batch on the Arrow path that stops after ``stage_in_place``
    moved the suspects Spark accepted into the table's folders, before its commit (a
    crash there leaves the same files; here the batch's retry runs it again, as a
    restart would): the files are in no commit, so no reader sees them; the batch runs
    again under another attempt tag (no file of the first attempt is replaced); every
    record is a row once; VACUUM deletes the orphans."""
    from deltalake import DeltaTable

    from lakesink import maintenance
    from lakesink.config.plan import TableSpec
    from lakesink.tables.delta_files import DeltaFiles

    real = DeltaFiles.commit_files
    cut: list[list[str]] = []

    def cut_off_once(self, batch_id, files, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        moved = [f[0] for f in files if "/part-s-" in f"/{f[0]}"]
        if moved and not cut:
            cut.append(moved)
            raise RuntimeError("cut off after the suspects moved in (the test)")
        return real(self, batch_id, files, *args, **kwargs)

    monkeypatch.setattr(DeltaFiles, "commit_files", cut_off_once)
    values = [*EDGE_VALUES, *_random_records(random.Random(11), 300)]
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k%d" % i, v) for i, v in enumerate(values)])
    lake = tmp_path / "lake"
    data = _config(kafka_broker, topic, lake, "arrow", format="delta")
    stats = run_once(spark, data)  # the batch is tried again (a restart does the same)
    assert cut
    table = lake / "events"
    rows, by_spark, count = _delta_rows(spark, table)
    assert by_spark == rows and count == len(rows)
    assert len(rows) + len(_dead_letters(lake)) == len(values)
    ids = Counter(delta_ids(table))
    assert sum(ids.values()) == len(rows)
    assert {i for i, n in ids.items() if n > 1} <= {1}  # the edge values' id, many times
    live = {Path(u.removeprefix("file://")) for u in DeltaTable(str(table)).file_uris()}
    on_disk = {p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}
    orphans = on_disk - live
    # every folder of a file delta-rs committed is named in ASCII (Zürich: Z%C3%BCrich)
    assert all(str(p.relative_to(table)).isascii() for p in live)
    assert any("%C3%BC" in str(p) for p in live)
    assert {table / rel for rel in cut[0]} <= orphans  # moved in, never committed
    assert not any(rel in {str(p.relative_to(table)) for p in live} for rel in cut[0])
    assert stats.written == len(rows)
    data["maintenance"] = {"vacuum_retention_hours": 0}
    cfg = load_config(flags=flatten(data), env={})
    assert maintenance.vacuum(TableSpec(cfg), spark, force=True)["applied"]
    assert {p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts} == live
    assert _delta_rows(spark, table)[0] == rows
    # `lakesink files` names each file as the store does (not the log's %25 spelling)
    listed = maintenance.files(TableSpec(cfg), None)
    assert {table / f["path"] for f in listed["files"]} == live
    assert listed["rows"] == len(rows)
