"""The Arrow path's task half (pure pyarrow, no Spark): every record is either a row of
exactly one staged file or a suspect handed back raw; folders and timestamps follow the
reference implementation in :mod:`lakesink.pipeline.partitioning`."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lakesink.pipeline import arrow_json
from lakesink.pipeline.arrow_json import decode, well_formed
from lakesink.pipeline.arrow_task import (
    TaskSpec,
    folder_names,
    run_task,
    timestamp_micros,
    write_folders,
)
from lakesink.pipeline.partitioning import partition_path, time_parts, to_utc
from lakesink.tables.paths import folder_fits, unescape_value

FIELDS = (("id", "bigint", False), ("location", "string", True), ("ts", "bigint", True),
          ("ratio", "float", True))


def _spec(tmp_path: Path, **kw: object) -> TaskSpec:
    base = {"fields": FIELDS, "partition_by": ("location", "year", "month"),
            "timestamp_column": "ts", "derived": ("year", "month"),
            "staging": str(tmp_path / "staging")}
    return TaskSpec(**{**base, **kw})  # type: ignore[arg-type]


def _batch(values: list[bytes | None]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "key": pa.array([b"k"] * n, pa.binary()), "value": pa.array(values, pa.binary()),
        "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array([0] * n, pa.int32())})


def _read(staging: Path, files: list[tuple[str, int, int]]) -> list[dict[str, object]]:
    rows = []
    for rel, count, size in files:
        path = staging / rel
        assert path.stat().st_size == size
        table = pq.read_table(path)
        assert table.num_rows == count
        folder = dict(p.split("=", 1) for p in rel.split("/")[:-1])
        rows += [{**r, **{k: unescape_value(v) for k, v in folder.items()}}
                 for r in table.to_pylist()]
    return rows


def test_one_bad_record_in_a_block_costs_only_itself(tmp_path) -> None:
    rng = random.Random(7)
    values: list[bytes | None] = [json.dumps({"id": i, "location": "a", "ts": 1795000000000})
                                  .encode() for i in range(5000)]
    bad = sorted(rng.sample(range(5000), 12))
    for i in bad:
        values[i] = rng.choice([b"{", b'{"id": "x"}', b"[1]", None, b"", b'{"id": 1, "z": 2}',
                                b'{"id": 1} {"id": 2}', b'{"ratio": 1e39, "id": 3}'])
    decoded, ok = decode(_spec(tmp_path, block_rows=1024), pa.array(values, pa.binary()))
    assert decoded.num_rows == len(values)
    failed = [i for i, good in enumerate(ok.to_pylist()) if not good]
    # the float overflow decodes (Arrow makes it inf); certify() turns it into a suspect
    overflow = [i for i in bad if values[i] == b'{"ratio": 1e39, "id": 3}']
    assert failed == [i for i in bad if i not in overflow]
    ids = decoded.column("id").to_pylist()
    assert all(ids[i] == i for i in range(5000) if i not in bad)


def test_malformed_records_cost_a_scan_and_one_parse_per_run(tmp_path, monkeypatch) -> None:
    """A block with malformed records is scanned once and its good runs parsed once each:
    the parses grow with the bad records, not with a bisection's depth per record."""
    values = [json.dumps({"id": i, "location": "a", "ts": 1795000000000}).encode()
              for i in range(4096)]
    bad = [5, 1000, 1001, 3000, 4095]
    for i in bad:
        values[i] = values[i][:9]  # cut short: not well-formed
    calls = []
    real = arrow_json._parse
    monkeypatch.setattr(arrow_json, "_parse", lambda *a: calls.append(a[2] - a[1]) or real(*a))
    decoded, ok = decode(_spec(tmp_path, block_rows=4096), pa.array(values, pa.binary()))
    failed = [i for i, good in enumerate(ok.to_pylist()) if not good]
    assert failed == bad
    assert decoded.column("id").to_pylist() == [None if i in bad else i for i in range(4096)]
    # the block, then its four good runs ([0,5) [6,1000) [1002,3000) [3001,4095))
    assert calls == [4096, 5, 994, 1998, 1094]


def test_well_formed_is_per_record_and_refuses_invalid_utf8() -> None:
    values = pa.array([b'{"a": 1}', b'{"a": ', b'{"a": "\xff"}', b"", None, b'{"a": "\xc3\xa9"}',
                       b'{"a": 1} {"b": 2}'], pa.binary())
    assert well_formed(values).to_pylist() == [True, False, False, False, False, True, False]


def test_every_record_is_a_staged_row_or_a_suspect(tmp_path) -> None:
    values: list[bytes | None] = [
        b'{"id": 1, "location": "oslo", "ts": 1795000000}',
        b'{"id": 2, "location": "a/b", "ts": 1795000000123, "ratio": 0.5}',
        b'{"location": "no id", "ts": 1795000000}',  # required id missing
        b'{"id": 4, "ratio": 1e39, "ts": 1}',  # float overflow
        b'{"id": 5, "location": "\xff", "ts": 1}',  # not UTF-8
        b'{"id": 6, "location": "", "ts": 1e30}',  # year past 9999
        b'{"id": 7, "location": null, "ts": null}',
        b"not json", None,
    ]
    spec = _spec(tmp_path, key_column="k", metadata_column="meta")
    out = pa.Table.from_batches(list(run_task(spec, [_batch(values)], task=3)))
    kinds = out.column("kind").to_pylist()
    assert kinds.count("count") == 1
    assert out.filter(pc.equal(out.column("kind"), "count")).column("rows")[0].as_py() == 9
    suspects = out.filter(pc.equal(out.column("kind"), "suspect"))
    assert suspects.column("offset").to_pylist() == [2, 3, 4, 5, 7, 8]
    assert suspects.column("value").to_pylist() == [values[i] for i in (2, 3, 4, 5, 7, 8)]
    files = out.filter(pc.equal(out.column("kind"), "file"))
    staged = list(zip(files.column("path").to_pylist(), files.column("rows").to_pylist(),
                      files.column("bytes").to_pylist(), strict=True))
    rows = _read(Path(spec.staging), staged)
    assert sorted(r["id"] for r in rows) == [1, 2, 7]
    by_id = {r["id"]: r for r in rows}
    assert by_id[2]["location"] == "a/b" and by_id[2]["meta"]["offset"] == 1
    assert by_id[1]["year"] == "2026" and by_id[1]["k"] == "k"
    assert all(p.startswith("location=") and "part-00003-" in p for p, *_ in staged)


def test_ts_none_row_is_staged_with_null_time_folders(tmp_path) -> None:
    spec = _spec(tmp_path)
    out = pa.Table.from_batches(list(run_task(
        spec, [_batch([b'{"id": 7, "location": null, "ts": null}'])], task=0)))
    files = out.filter(pc.equal(out.column("kind"), "file"))
    assert files.column("path").to_pylist() == [
        "location=__HIVE_DEFAULT_PARTITION__/year=__HIVE_DEFAULT_PARTITION__/"
        "month=__HIVE_DEFAULT_PARTITION__/part-00000-0-00000.parquet"]


@pytest.mark.parametrize("value", [0, 1, -1, 1795000000, 1795000000.5, 99999999999,
                                   100000000000, 1795000000123, 1795000000123456,
                                   1795000000123456789, -1795000000123, 2**53 + 1])
def test_epoch_numbers_match_the_reference(value: float) -> None:
    number = (pa.array([value], pa.int64()) if isinstance(value, int)
              else pa.array([value], pa.float64()))
    for col in (number, pa.array([str(value)], pa.string())):
        micros, ok = timestamp_micros(_spec(Path("/x")), col, pa.array([0]))
        assert ok.to_pylist() == [True]
        want = to_utc(float(value))
        assert want is not None
        got = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
            microseconds=micros[0].as_py())
        assert got == want


@pytest.mark.parametrize("text", ["2026-11-27T08:00:00Z", "yesterday", "NaN", "1e400", "",
                                  "\t5", "1d", "1e30", "-1e30"])
def test_texts_only_spark_reads_are_not_certified(text: str) -> None:
    _, ok = timestamp_micros(_spec(Path("/x")), pa.array([text]), pa.array([0]))
    assert ok.to_pylist() == [False]


def test_time_parts_and_folders_match_the_reference(tmp_path) -> None:
    locations = ["oslo", "a/b", "x=y", "..", "", None, "%41", "ünï", "\x01\x7f", "#?*:[]{}^'\""]
    ts = [1795000000000 + i * 86_400_000 * 40 for i in range(len(locations))]
    table = pa.table({"location": pa.array(locations, pa.string()),
                      "year": [time_parts(to_utc(t))["year"] for t in ts],
                      "month": [time_parts(to_utc(t))["month"] for t in ts]})
    got = folder_names(_spec(tmp_path), table).to_pylist()
    want = [partition_path({"location": loc, **time_parts(to_utc(t))},
                           ["location", "year", "month"]) for loc, t in zip(locations, ts,
                                                                             strict=True)]
    assert got == want


def test_rows_per_file_splits_a_folder_and_attempts_never_share_a_file(tmp_path) -> None:
    spec = _spec(tmp_path, rows_per_file=40, partition_by=("location",), derived=())
    table = pa.table({"id": pa.array(range(100), pa.int64()),
                      "location": ["a"] * 70 + ["b"] * 30})
    first = write_folders(spec, table, task=1, attempt=7)
    assert [(p, r) for p, r, *_ in first] == [
        ("location=a/part-00001-7-00000.parquet", 40),
        ("location=a/part-00001-7-00001.parquet", 30),
        ("location=b/part-00001-7-00000.parquet", 30)]
    # another attempt of the same task (a retry, a speculative copy) writes its own files:
    # it cannot truncate a file the driver already counted
    again = write_folders(spec, table, task=1, attempt=8)
    assert not {p for p, *_ in again} & {p for p, *_ in first}
    for rel, rows, size, stats in first:
        assert stats is None  # Parquet tables: no Delta statistics
        path = Path(spec.staging) / rel
        assert pq.read_table(path).num_rows == rows and path.stat().st_size == size
    assert not list(Path(spec.staging).rglob("*.tmp"))  # written aside, then renamed


def test_delta_files_carry_a_tag_and_exact_statistics(tmp_path) -> None:
    spec = _spec(tmp_path, partition_by=("location",), derived=(), file_tag="-b0000000003-run1",
                 stats=True, metadata_column="meta")
    table = pa.table({"id": pa.array([5, -2, 9], pa.int64()), "location": ["a", "a", "b"],
                      "ts": pa.array([None, None, None], pa.int64()),
                      "ratio": pa.array([0.5, None, float("1e30")], pa.float32()),
                      "name": ["x", None, "y"],
                      "meta": pa.array([{"offset": 1}] * 3)})
    files = write_folders(spec, table, task=2, attempt=4)
    assert [p for p, *_ in files] == ["location=a/part-00002-4-00000-b0000000003-run1.parquet",
                                      "location=b/part-00002-4-00000-b0000000003-run1.parquet"]
    a = json.loads(files[0][3])
    assert a == {"numRecords": 2, "minValues": {"id": -2, "ratio": 0.5},
                 "maxValues": {"id": 5, "ratio": 0.5},
                 "nullCount": {"id": 0, "ts": 2, "ratio": 1, "name": 1}}
    b = json.loads(files[1][3])
    assert b["maxValues"]["ratio"] == pytest.approx(1e30, rel=1e-6)


def test_chunks_bound_memory_and_number_a_folders_files_on(tmp_path) -> None:
    spec = _spec(tmp_path, chunk_rows=100, block_rows=32)
    values: list[bytes | None] = [json.dumps({"id": i, "location": "a", "ts": 1795000000})
                                  .encode() for i in range(250)]
    values[120] = b"{"
    batches = [_batch(values[i:i + 50]) for i in range(0, 250, 50)]
    out = pa.Table.from_batches(list(run_task(spec, batches, task=2)))
    files = out.filter(pc.equal(out.column("kind"), "file"))
    assert files.column("path").to_pylist() == [
        f"location=a/year=2026/month=11/part-00002-0-0000{n}.parquet" for n in range(3)]
    assert sum(files.column("rows").to_pylist()) == 249
    assert out.filter(pc.equal(out.column("kind"), "count")).column("rows").to_pylist() == [250]
    suspects = out.filter(pc.equal(out.column("kind"), "suspect"))
    assert suspects.column("value").to_pylist() == [b"{"]


@pytest.mark.parametrize("value", [b" ", b"\n", b" {\"id\": 1}", b"null", b" null",
                                   b"\xef\xbb\xbf{\"id\": 1}", b'{"id": 1, "location": "a\nb"}',
                                   b'{"id": 1, "location": "a\rb"}',
                                   b'{"id": 1, "location": "a\tb"}', b'{"id": 1,\n"x": 2}',
                                   b'{"id": 1}\n{"id": 9}', b'{"id": 1, "location": "\x01"}'])
def test_records_only_spark_reads_are_suspects_and_shift_nothing(tmp_path, value) -> None:
    """Review of the first version: a whitespace-only value (0 rows) beside a value of
    two objects (2 rows) kept a range's row count and shifted rows onto other records;
    ``null`` first in a range crashed pyarrow; raw newlines were made spaces."""
    values = [b'{"id": 0}', value, b'{"id": 2} {"id": 3}', b'{"id": 4}', value, b'{"id": 5}']
    decoded, ok = decode(_spec(tmp_path), pa.array(values, pa.binary()))
    assert ok.to_pylist() == [True, False, False, True, False, True]
    assert [decoded.column("id")[i].as_py() for i in (0, 3, 5)] == [0, 4, 5]


@pytest.mark.parametrize("text", [b"Inf", b"-Inf", b"-NaN", b"NaN", b"1e400"])
def test_non_finite_doubles_are_suspects(tmp_path, text) -> None:
    spec = _spec(tmp_path, fields=(*FIELDS, ("score", "double", True)))
    out = pa.Table.from_batches(list(run_task(
        spec, [_batch([b'{"id": 1, "ts": 1, "score": ' + text + b"}"])], task=0)))
    assert out.column("kind").to_pylist() == ["suspect", "count"]


@pytest.mark.parametrize(("location", "fits"), [
    ("a" * 246, True), ("a" * 247, False), ("/" * 82, True), ("/" * 83, False),
    ("é" * 123, True), ("é" * 124, False), ("a\x00b", False), ("", True)])
def test_a_partition_value_that_cannot_name_a_folder_is_a_suspect(tmp_path, location,
                                                                   fits) -> None:
    """A NUL, or ``location=<escaped value>`` over 255 bytes, would fail the batch on
    every retry (ext4, XFS and HDFS refuse such a name): the record is a suspect, which
    Spark's path rejects as ``invalid_partition_value``."""
    assert folder_fits("location", location) is fits
    record = json.dumps({"id": 1, "location": location, "ts": 1795000000}).encode()
    out = pa.Table.from_batches(list(run_task(_spec(tmp_path), [_batch([record])], task=0)))
    assert out.column("kind").to_pylist() == (["file", "count"] if fits
                                              else ["suspect", "count"])


def test_a_kafka_timestamp_outside_years_1_to_9999_is_a_suspect(tmp_path) -> None:
    spec = _spec(tmp_path, use_kafka_timestamp=True)
    kafka = pa.array([1795000000000000, 2**62, None], pa.timestamp("us", tz="UTC"))
    micros, ok = timestamp_micros(spec, pa.array([None, None, None], pa.int64()), kafka)
    assert ok.to_pylist() == [True, False, True]
    assert micros.to_pylist() == [1795000000000000, None, None]


def test_too_many_suspects_hand_the_batch_to_spark(tmp_path) -> None:
    spec = _spec(tmp_path, max_suspects=10)
    out = pa.Table.from_batches(list(run_task(spec, [_batch([b"x"] * 11)], task=0)))
    assert out.column("kind").to_pylist() == ["overflow"]


def test_warm_up_runs_a_task_and_leaves_nothing(tmp_path, monkeypatch) -> None:
    """The workers' warm-up (before the first batch) runs the task's steps in a
    temporary folder of its own: nothing lands in the table's staging folder. It does
    not load DuckDB (32 MiB per worker, for the scan of a long run of records that
    failed to parse: only a batch with malformed records needs it)."""
    from lakesink.pipeline import arrow_json
    from lakesink.pipeline.arrow_task import warm_up

    def no_duckdb(values):  # noqa: ANN001, ANN202
        raise AssertionError("the warm-up scanned for malformed records (DuckDB)")

    monkeypatch.setattr(arrow_json, "well_formed", no_duckdb)
    spec = _spec(tmp_path)
    warm_up(spec)
    assert not (tmp_path / "staging").exists()


def test_timestamp_fields_certify_iso_instants_only(tmp_path) -> None:
    """A timestamp field: ISO-8601 with ``T`` and an explicit zone becomes that UTC
    instant in microseconds (the Parquet type Spark writes); other texts (no zone, a
    space, 7 fraction digits, a day the month lacks, year 0000 in UTC) and JSON numbers
    (seconds to Spark) are suspects for Spark's decoder; null stays null."""
    spec = _spec(tmp_path, fields=(*FIELDS, ("at", "timestamp", True)))
    good = {'"2026-11-27T08:00:00Z"': dt.datetime(2026, 11, 27, 8, tzinfo=dt.UTC),
            '"2026-11-27T08:00:00.5-05:30"': dt.datetime(2026, 11, 27, 13, 30, 0, 500000,
                                                         tzinfo=dt.UTC),
            '"9999-12-31T23:59:59+00:00"': dt.datetime(9999, 12, 31, 23, 59, 59,
                                                       tzinfo=dt.UTC),
            "null": None}
    bad = ['"2026-11-27T08:00:00"', '"2026-11-27 08:00:00Z"', '"2026-11-27T08:00:00.1234567Z"',
           '"2026-02-30T08:00:00Z"', '"0001-01-01T00:00:00+01:00"', '"2026-11-27t08:00:00z"',
           '""', "1795000000"]
    rows, suspects, arrow_type = _one_field(spec, "at", [*good, *bad])
    assert suspects == len(bad)
    assert arrow_type == pa.timestamp("us", tz="UTC")
    assert rows == list(enumerate(good.values()))


def _one_field(spec: TaskSpec, name: str, texts: list[str]
               ) -> tuple[list[tuple[object, object]], int, pa.DataType]:
    """Records ``{"id": i, "ts": …, name: texts[i]}`` through a task: ((id, value) of the
    staged rows by id, the number of suspects, the field's type in the files)."""
    values = [b'{"id": %d, "ts": 1795000000, "%s": %s}' % (i, name.encode(), v.encode())
              for i, v in enumerate(texts)]
    out = list(run_task(spec, [_batch(values)], 0))
    files = [(b.column("path")[0].as_py(), b.column("rows")[0].as_py(),
              b.column("bytes")[0].as_py()) for b in out if b.column(0)[0].as_py() == "file"]
    suspects = sum(b.num_rows for b in out if b.column(0)[0].as_py() == "suspect")
    staged = Path(spec.staging)
    rows = sorted(((r["id"], r[name]) for r in _read(staged, files)), key=lambda r: r[0])
    return rows, suspects, pq.read_schema(staged / files[0][0]).field(name).type


def test_date_fields_certify_yyyy_mm_dd_only(tmp_path) -> None:
    spec = _spec(tmp_path, fields=(*FIELDS, ("born", "date", True)))
    good = {'"2026-11-27"': dt.date(2026, 11, 27), '"0001-01-01"': dt.date(1, 1, 1),
            '"9999-12-31"': dt.date(9999, 12, 31), "null": None}
    bad = ['"2026-02-30"', '"2026-1-5"', '"2026"', '"2026-11-27T08:00:00Z"', '"0000-01-01"',
           '""', "20000"]
    rows, suspects, arrow_type = _one_field(spec, "born", [*good, *bad])
    assert suspects == len(bad)
    assert arrow_type == pa.date32()
    assert rows == list(enumerate(good.values()))


def test_iso_values_without_a_bad_day_take_the_vectorised_cast() -> None:
    """The good texts alone (no day the month lacks): Arrow's cast, not the per-value
    fallback, gives the instants, offsets applied."""
    from lakesink.pipeline.arrow_task import iso_values

    values, certified = iso_values(pa.array(["2026-11-27T08:00:00.5-05:30",
                                             "2026-11-27T08:00:00+17:59", None]), "timestamp")
    assert certified.to_pylist() == [True, True, True]
    assert values.to_pylist() == [
        dt.datetime(2026, 11, 27, 13, 30, 0, 500000, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 26, 14, 1, tzinfo=dt.UTC), None]


@pytest.mark.parametrize(("setting", "value"), [
    ("spark.sql.legacy.timeParserPolicy", "LEGACY"),
    ("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MILLIS"),
    ("spark.sql.parquet.datetimeRebaseModeInWrite", "LEGACY")])
def test_time_settings_that_change_spark_s_reading_keep_time_fields_on_spark(setting,
                                                                            value) -> None:
    from lakesink.pipeline.arrow_path import TIME_SETTINGS, time_settings_refusal

    class Conf(dict):
        def get(self, key, default=None):  # noqa: ANN001, ANN202
            return super().get(key, default)

    class Session:
        conf = Conf(TIME_SETTINGS)

    assert time_settings_refusal(Session()) is None  # type: ignore[arg-type]
    Session.conf = Conf({**TIME_SETTINGS, setting: value})
    assert time_settings_refusal(Session()) == f"{setting} is {value}"  # type: ignore[arg-type]


@pytest.mark.parametrize(("type_name", "text", "folder"), [
    ("timestamp", "2026-12-31T23:30:00-01:00", "year=2027/month=01"),
    ("date", "2026-12-31", "year=2026/month=12")])
def test_a_timestamp_or_date_field_as_the_timestamp_column(tmp_path, type_name, text,
                                                           folder) -> None:
    """The folders come from the field's UTC instant (a date: its midnight, UTC)."""
    spec = _spec(tmp_path, fields=(("id", "bigint", False), ("location", "string", True),
                                   ("at", type_name, True)),
                 timestamp_column="at", partition_by=("year", "month"))
    out = list(run_task(spec, [_batch([b'{"id": 1, "at": "%s"}' % text.encode()])], 0))
    files = [b.column("path")[0].as_py() for b in out if b.column(0)[0].as_py() == "file"]
    assert [f.rpartition("/")[0] for f in files] == [folder]


def test_a_timestamp_field_named_like_a_time_part_is_still_certified(tmp_path) -> None:
    """A timestamp field ``hour`` that is also the derived ``hour`` partition (and the
    timestamp column): its text is certified like any timestamp field's (review: the
    raw text was read as an epoch number, where Spark's decoder rejects it)."""
    spec = _spec(tmp_path, fields=(("id", "bigint", False), ("hour", "timestamp", True)),
                 timestamp_column="hour", partition_by=("hour",), derived=("hour",))
    out = list(run_task(spec, [_batch([b'{"id": 1, "hour": "1700000000"}',
                                       b'{"id": 2, "hour": "2026-11-27T22:10:00+01:00"}'])],
                        0))
    files = [b.column("path")[0].as_py() for b in out if b.column(0)[0].as_py() == "file"]
    assert [f.rpartition("/")[0] for f in files] == ["hour=21"]
    assert sum(b.num_rows for b in out if b.column(0)[0].as_py() == "suspect") == 1


def test_the_suspects_budget_is_the_batchs_shared_by_its_tasks() -> None:
    """audit-2 #8: each task handed back up to 64 MiB of suspects, so 32 partitions could
    bring 2 GiB to a 1 GiB driver, every retry alike. Now the tasks share one batch
    budget (a task's own cap stays the most)."""
    from lakesink.pipeline.arrow_path import task_suspect_share
    from lakesink.pipeline.arrow_task import (
        BATCH_SUSPECT_BYTES,
        BATCH_SUSPECTS,
        MIN_TASK_SUSPECT_BYTES,
        TaskSpec,
    )

    spec = TaskSpec(fields=(("id", "bigint", True),))
    one = task_suspect_share(spec, 1)
    assert one == {"max_suspects": spec.max_suspects, "suspect_bytes": spec.suspect_bytes}
    for tasks in (2, 32, 200):
        share = task_suspect_share(spec, tasks)
        assert share["suspect_bytes"] * tasks <= BATCH_SUSPECT_BYTES
        assert share["max_suspects"] * tasks <= BATCH_SUSPECTS
    assert task_suspect_share(spec, 10_000)["suspect_bytes"] == MIN_TASK_SUSPECT_BYTES


def test_a_task_s_report_must_account_for_every_record_spark_handed_it(tmp_path) -> None:
    """known-open L8: the commit's record count is Spark's (counted in the JVM), and
    the tasks' written rows and suspects must add up to it; a report that falls short
    by one (a record lost inside a task, or a count the task got wrong) stops the batch
    before anything is committed."""
    from lakesink.errors import CommitMismatch
    from lakesink.pipeline.arrow_path import StagedByTasks

    values = [b'{"id": %d}' % i for i in range(9)] + [b"not json"]
    out = pa.Table.from_batches(list(run_task(_spec(tmp_path), [_batch(values)], task=0)))
    StagedByTasks(out, str(tmp_path), read=10).check_accounted(0, "t")  # 9 rows + 1 suspect
    for read in (11, 9, None):
        with pytest.raises(CommitMismatch, match=f"handed the Arrow tasks {read} record"):
            StagedByTasks(out, str(tmp_path), read=read).check_accounted(0, "t")
    # a task whose own count is off (rows and suspects agree with Spark's count)
    miscounted = out.filter(pc.not_equal(out.column("kind"), "count")).to_batches() + \
        [pa.RecordBatch.from_pylist([{"kind": "count", "rows": 11}], schema=out.schema)]
    with pytest.raises(CommitMismatch, match="they counted 11 and accounted for 10"):
        StagedByTasks(pa.Table.from_batches(miscounted), str(tmp_path), read=10
                      ).check_accounted(0, "t")
