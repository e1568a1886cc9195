"""Issue 17: the paths where a commit could record less (or more) than the batch wrote,
each walked with the real broker and Spark and read back by DuckDB or delta-rs."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

from lakesink.config import load_config
from lakesink.config.plan import TableSpec
from lakesink.errors import ConfigError
from lakesink.local.services import produce
from lakesink.tables import fs as fs_module
from tests.fixtures.runs import flatten, run_once
from tests.fixtures.services import (
    config_dict,
    delta_ids,
    duckdb_ids,
    json_events,
    read_ids,
    run_cli,
    run_cli_here,
    run_here,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def dead_letters(lake: Path, table: str = "events") -> list[tuple[Any, ...]]:
    files = list((lake / "_rejected" / table).rglob("*.parquet"))
    if not files:
        return []
    return duckdb.sql(f"SELECT reason, value FROM read_parquet('{lake}/_rejected/{table}/"
                      "*.parquet')").fetchall()


@pytest.mark.parametrize("engine", ["spark", "arrow"])
def test_a_listing_that_loses_staged_files_stops_the_commit(spark, kafka_broker, topic,
                                                            tmp_path, monkeypatch,
                                                            engine) -> None:
    """The invariant behind scenario 1: the `_kind=a/` listing bug lost every staged file
    and committed "0 files". Any listing that loses a staged file must now stop the batch
    before its manifest; a run with a sound listing then writes every row once. The
    Arrow path commits the files its tasks report (no listing): losing one of those
    must stop the batch the same way."""
    from lakesink.pipeline import arrow_path

    produce(kafka_broker.bootstrap_servers, topic, json_events(range(300)))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, engine=engine)
    real = fs_module._list_local
    reported = arrow_path.StagedByTasks.__init__

    def lossy(uri: str, suffix: str) -> list[fs_module.FileInfo]:
        files = real(uri, suffix)
        return files[1:] if "/staging/" in uri else files  # drop one staged file

    def lossy_report(self: Any, results: Any, folder: str, read: int | None = None  # noqa: ANN401
                     ) -> None:
        reported(self, results, folder, read)
        # a task's report that lost a file (its rows still counted by the task): the
        # merge reads what is reported, the commit of unmerged files what is listed
        self.files, self.reported = self.files[1:], self.reported[1:]

    monkeypatch.setattr(fs_module, "_list_local", lossy)
    monkeypatch.setattr(arrow_path.StagedByTasks, "__init__", lossy_report)
    with pytest.raises(Exception, match="CommitMismatch") as exc:
        run_once(spark, data)
    assert "counted as written" in str(exc.value)
    assert not list((lake / ".lakesink" / "events" / "manifests").rglob("*.json"))
    assert duckdb_ids(lake / "events") == []  # nothing published

    monkeypatch.setattr(fs_module, "_list_local", real)
    monkeypatch.setattr(arrow_path.StagedByTasks, "__init__", reported)
    stats = run_once(spark, data)
    assert sorted(duckdb_ids(lake / "events")) == list(range(300))
    assert stats.written == 300
    manifests = [json.loads(p.read_text()) for p in
                 (lake / ".lakesink" / "events" / "manifests").rglob("*.json")]
    assert sum(m["rows"] for m in manifests) == 300
    assert all(sum(f["rows"] for f in m["files"]) == m["rows"] for m in manifests)
    # committed batches leave no bookkeeping behind (scenario 14)
    meta = lake / ".lakesink" / "events"
    assert not [p for p in (meta / "pending").rglob("*") if p.is_file()]
    assert not [p for p in (meta / "staging").rglob("*") if p.is_file()]


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_an_arrow_task_that_loses_a_record_stops_the_batch(spark, kafka_broker, topic, tmp_path,
                                                           monkeypatch, fmt) -> None:
    """known-open L8: the Arrow path's count must not be the tasks' own. A task that
    drops a record before it counts anything (its rows, its suspects and its count all
    agree, one short) wrote a batch one row short and committed it; Spark's count of the
    records it handed the tasks now stops the batch before anything is committed, and
    a sound run then writes every row once."""
    from lakesink.pipeline import arrow_path

    produce(kafka_broker.bootstrap_servers, topic, json_events(range(200)))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, engine="arrow", format=fmt)
    real = arrow_path._in_task

    def loses_one(spec: Any, batches: Any) -> Any:  # noqa: ANN401 - pickled by value
        from pyspark import TaskContext

        from lakesink.pipeline.arrow_task import run_task

        context = TaskContext.get()

        def fewer() -> Any:  # noqa: ANN401 - one record of the first task dropped
            dropped = context.partitionId() != 0
            for batch in batches:
                if not dropped and batch.num_rows:
                    batch, dropped = batch.slice(1), True
                yield batch

        yield from run_task(spec, fewer(), context.partitionId(), context.taskAttemptId())

    monkeypatch.setattr(arrow_path, "_in_task", loses_one)
    with pytest.raises(Exception, match="CommitMismatch") as exc:
        run_once(spark, data)
    assert "Spark handed the Arrow tasks 200 record(s), they counted 199" in str(exc.value)
    if fmt == "parquet":
        assert duckdb_ids(lake / "events") == []  # nothing published
    else:
        assert not (lake / "events" / "_delta_log").exists() or delta_ids(lake / "events") == []
        assert not list((lake / "events").rglob("*.parquet"))  # the tasks' files removed

    monkeypatch.setattr(arrow_path, "_in_task", real)
    run_once(spark, data)
    ids = duckdb_ids(lake / "events") if fmt == "parquet" else delta_ids(lake / "events")
    assert sorted(ids) == list(range(200))


def test_delta_partitions_by_an_underscore_column(spark, kafka_broker, topic, tmp_path
                                                  ) -> None:
    """Scenario 1 for Delta (allowed there: the log lists the files)."""
    records = [(b"k", json.dumps({"id": i, "_kind": "ab"[i % 2]}).encode()) for i in range(50)]
    produce(kafka_broker.bootstrap_servers, topic, records)
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format="delta", partition_by=["_kind"])
    data["table"].pop("timestamp_column")
    data["decode"]["schema"] = [{"name": "id", "type": "Int64"},
                                {"name": "_kind", "type": "Utf8"}]
    assert run_once(spark, data).written == 50
    from deltalake import DeltaTable

    rows = DeltaTable(str(lake / "events")).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["_kind"]) for r in rows) == [(i, "ab"[i % 2]) for i in range(50)]


# -- scenario 3: a committed batch replayed under a changed configuration -----------------

def _two_configs(kafka_broker, topic: str, lake: Path, fmt: str, tmp_path: Path  # noqa: ANN001
                 ) -> tuple[Path, Path]:
    """A: strict schema, unknown fields rejected; B: the operator switched to 'drop'."""
    data = config_dict(kafka_broker, topic, lake, format=fmt, schema_evolution="strict",
                       unknown_fields="reject")
    a = write_config(tmp_path / "a.yaml", data)
    data["table"]["unknown_fields"] = "drop"
    return a, write_config(tmp_path / "b.yaml", data)


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "point"), [("parquet", "after_manifest"),
                                            ("delta", "after_delta_commit")])
def test_dead_letters_of_a_committed_batch_survive_a_config_change(
        spark, kafka_broker, topic, tmp_path, fmt, point) -> None:
    """Killed under config A after batch 0's commit; restarted (in this process) under
    B: the batch is not recomputed under B, its dead letters under A stay."""
    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(40)) + json_events(range(40, 42), extra=1))
    lake = tmp_path / "lake"
    a, b = _two_configs(kafka_broker, topic, lake, fmt, tmp_path)
    crashed = run_cli("run", "-c", str(a), "--until-caught-up",
                      env={"LAKESINK_FAULT": point, "LAKESINK_FAULT_BATCH": "0"})
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    run_here(spark, b)
    ids = read_ids(lake / "events", fmt)
    assert sorted(ids) == list(range(40)), "the batch was committed under A: 40 rows"
    letters = dead_letters(lake) if fmt == "parquet" else _delta_letters(lake)
    assert sorted(json.loads(bytes(v))["id"] for _, v in letters) == [40, 41], (
        "the two records A rejected must be dead letters once, not lost or recomputed")
    assert {r for r, _ in letters} == {"unknown_field"}


def _delta_letters(lake: Path) -> list[tuple[Any, ...]]:
    # dlq.format is parquet in both configs; a Delta table's dead letters are files too
    return dead_letters(lake)


def test_a_delta_write_that_raises_after_its_commit_is_not_written_again(
        spark, kafka_broker, topic, tmp_path, monkeypatch) -> None:
    """Scenario 9: the commit landed, then the write raised (a post-commit hook, a lost
    response). The retry must skip the batch — before, Delta dropped the append by its
    txn, ran no job, and the batch waited forever for its observation."""
    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(200)) + [(b"k", b"not json")])
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format="delta")
    data["retry"] = {"initial_backoff_s": 0}
    monkeypatch.setenv("LAKESINK_FAULT", "raise_after_delta_commit")
    done: dict[str, Any] = {}

    def go() -> None:
        try:
            done["stats"] = run_once(spark, data)
        except BaseException as exc:  # noqa: BLE001
            done["error"] = exc

    runner = threading.Thread(target=go, daemon=True)
    runner.start()
    runner.join(300)
    assert not runner.is_alive(), "the batch hung after a commit that raised"
    assert "error" not in done, done.get("error")
    assert sorted(delta_ids(lake / "events")) == list(range(200))
    assert [r for r, _ in dead_letters(lake)] == ["malformed_json"]


def test_a_checkpoint_that_lost_its_offsets_is_refused_not_skipped(spark, kafka_broker,
                                                                   topic, tmp_path) -> None:
    """Scenario 14: with offsets/ and commits/ gone but lakesink.json kept, batch ids
    restart at 0 and every new batch looked committed (silently skipped)."""
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(30)))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake)
    run_once(spark, data)
    checkpoint = lake / ".lakesink" / "events" / "checkpoint"
    shutil.rmtree(checkpoint / "offsets")
    shutil.rmtree(checkpoint / "commits")
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(30, 40)))
    with pytest.raises(ConfigError) as exc:
        run_once(spark, data)
    assert exc.value.key == "checkpoint" and "offset log" in exc.value.message
    (checkpoint / "lakesink.json").unlink()  # the documented way to start afresh
    run_once(spark, data)
    ids = duckdb_ids(lake / "events")
    assert set(range(30, 40)) <= set(ids), "new records were skipped as committed"


def test_two_first_starts_of_one_checkpoint_share_its_app_id(spark, tmp_path) -> None:
    """audit-2 #11: two processes starting one empty checkpoint each wrote their own
    app id (an overwrite), so each got a lease of its own and one query's replay wrote
    the batch again under the other's names. The identity file is created once; the
    start that loses takes the winner's id."""
    from lakesink.tables.fs import HadoopFS, to_uri
    from lakesink.tables.identity import checkpoint_app_id

    checkpoint = to_uri(str(tmp_path / "checkpoint"))
    fs = HadoopFS(spark, checkpoint)
    real = fs.write_once

    def racing(path: str, text: str) -> bool:  # the other start creates it first
        real(path, json.dumps({"app_id": "the-other-start"}))
        return real(path, text)

    fs.write_once = racing  # type: ignore[method-assign]
    assert checkpoint_app_id(fs, checkpoint) == "the-other-start"
    fs.write_once = real  # type: ignore[method-assign]
    fresh = to_uri(str(tmp_path / "fresh"))
    made = checkpoint_app_id(fs, fresh)  # alone: its own new id, in the file
    assert len(made) == 32 and json.loads(
        (tmp_path / "fresh" / "lakesink.json").read_text())["app_id"] == made


def test_dlq_commands_with_a_message_type_route(spark, kafka_broker, topic, tmp_path) -> None:
    """Scenario 10: `dlq show` / `dlq replay` crashed on any message-type route."""
    lake = tmp_path / "lake"
    records = [(b"k", json.dumps({"type": "order", "id": i, "ts_ms": 1_795_000_000_000}
                                 ).encode()) for i in range(10)]
    produce(kafka_broker.bootstrap_servers, topic, records)
    data = config_dict(kafka_broker, topic, lake, partition_by=["day"])
    data.pop("decode")
    data["table"].pop("name")
    data["routes"] = [{"topics": [topic], "message_type": {"field": "type",
                                                            "table_prefix": "ev_"}}]
    assert run_once(spark, data).rejected == 0  # the table's schema: id bigint
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", b'{"type": "order", "id": "seven", "ts_ms": 1795000000000}')])
    assert run_once(spark, data).rejected == 1
    cfg = write_config(tmp_path / "c.yaml", data)
    shown = run_cli_here("dlq", "show", "-c", str(cfg), "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    (summary,) = json.loads(shown.stdout)
    assert summary["table"] == "ev_order" and summary["path"].endswith("/ev_order")
    assert summary["by_reason"] == {"schema_mismatch": 1}
    replayed = run_cli_here("dlq", "replay", "-c", str(cfg))
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    (result,) = json.loads(replayed.stdout)
    assert (result["table"], result["records"], result["rejected"]) == ("ev_order", 1, 1)


def test_a_second_dlq_replay_is_refused_while_one_runs(spark, kafka_broker, topic,
                                                        tmp_path) -> None:
    """Scenario 8: two replays both planned the same pending letters."""
    from lakesink import dlq
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout
    from lakesink.tables.lease import SecondWriterError, WriterLease

    lake = tmp_path / "lake"
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(5)) + [(b"x", b"nope")])
    data = config_dict(kafka_broker, topic, lake)
    run_once(spark, data)
    cfg = load_config(flags=flatten(data), env={})
    layout = TableLayout.of(str(lake), "events")
    held = WriterLease(HadoopFS(spark, layout.base), f"{layout.meta}/dlq/replay.lock",
                       app_id="other-replay", ttl_s=60, table=layout.table)
    held.acquire()  # a replay in this (live) process
    try:
        with pytest.raises(SecondWriterError, match="Two replays at once"):
            dlq.replay(spark, TableSpec(cfg))
    finally:
        held.release()
    result = dlq.replay(spark, TableSpec(cfg))
    assert (result["records"], result["rejected"]) == (1, 1)


def test_s3_scheme_writes_are_conditional(spark, s3_server) -> None:
    """Scenario 7: `s3://` is S3A too, so manifests use the conditional PUT."""
    from lakesink.runtime import storage
    from lakesink.tables.fs import HadoopFS

    cfg = load_config(overrides=["source.kafka.bootstrap_servers=a:1",
                                 "source.kafka.topics=t",
                                 f"table.base_path=s3://{s3_server.bucket}/cond"],
                      env=s3_server.env())
    storage.apply(spark, cfg.storage, [cfg.table.base_path])
    for scheme in ("s3", "s3a"):
        fs = HadoopFS(spark, f"{scheme}://{s3_server.bucket}/cond")
        assert fs.s3a, f"{scheme}:// is not recognised as S3A"
        path = f"{scheme}://{s3_server.bucket}/cond/{scheme}-manifest.json"
        assert fs.write_once(path, "first")
        assert not fs.write_once(path, "second")
        assert fs.read_text(path) == "first"


def test_jaas_password_with_backslash_and_quote_reaches_kafka_intact(spark) -> None:
    """Scenario 15: Kafka's own JAAS parser reads the password lakesink built."""
    from lakesink.sources.kafka_client import client_options

    password = 'pa\\ss"w\\"ord'
    cfg = load_config(overrides=["source.kafka.bootstrap_servers=a:1", "source.kafka.topics=t",
                                 "source.kafka.sasl.username=alice"],
                      env={"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": password})
    jaas = client_options(cfg.source.kafka)["sasl.jaas.config"]
    jvm = spark.sparkContext._jvm
    parsed = jvm.org.apache.kafka.common.security.JaasConfig("KafkaClient", jaas)
    entry = parsed.getAppConfigurationEntry("KafkaClient")[0]
    assert entry.getOptions().get("password") == password
    assert entry.getOptions().get("username") == "alice"


def test_a_delta_dead_letter_table_on_s3_has_one_writer(spark, s3_server) -> None:
    """Scenario 4: the Delta dead-letter table had no writer lease, so a second process
    (a routed run, a replay) could overwrite its commits."""
    from lakesink.runtime import storage
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout
    from lakesink.tables.lease import SecondWriterError
    from lakesink.tables.rejected import RejectedWriter

    base = f"s3a://{s3_server.bucket}/dlq-lease"
    cfg = load_config(overrides=["source.kafka.bootstrap_servers=a:1", "source.kafka.topics=t",
                                 f"table.base_path={base}", "table.format=parquet",
                                 "dlq.format=delta"], env=s3_server.env())
    storage.apply(spark, cfg.storage, [cfg.table.base_path])
    lease = storage.lease_options(cfg.storage, cfg.table, cfg.dlq.format)
    # a Delta dead-letter table on S3 needs one writer, whatever the data table's format
    assert lease["lease_s"] > 0 and lease["lease_per_table"]
    layout = TableLayout.of(base, "events")
    fs = HadoopFS(spark, layout.base)
    first = RejectedWriter(fs, layout, app_id="a" * 32, fmt="delta", spark=spark,
                           lease=lease)
    try:
        with pytest.raises(SecondWriterError):
            RejectedWriter(fs, layout, app_id="b" * 32, fmt="delta", spark=spark,
                           lease=lease)
    finally:
        first.close()
    RejectedWriter(fs, layout, app_id="b" * 32, fmt="delta", spark=spark,
                   lease=lease).close()  # free again


def test_a_partly_committed_routed_batch_is_refused_under_other_routes(
        spark, kafka_broker, topic, tmp_path) -> None:
    """Scenario 3 for routes: a batch that one route's table committed, replayed after
    the operator changed the routes, would put records in a second table or drop them
    from the unrouted ones. It is refused until it is finished with the old routes."""
    other = f"{topic}-b"
    kafka_broker.create_topic(other, partitions=1)
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(20)))
    produce(kafka_broker.bootstrap_servers, other, json_events(range(100, 105)))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake)
    data["table"].pop("name")
    data["source"]["kafka"]["topics"] = [topic, other]
    data["routes"] = [{"topics": [topic], "table": {"name": "a"}}]
    assert run_once(spark, data).rejected == 5  # the other topic's records: unrouted
    commits = lake / ".lakesink" / "_routes" / "checkpoint" / "commits"
    newest = max((p for p in commits.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    newest.unlink()  # the crash window: table a committed, Spark's commit log did not
    (commits / f".{newest.name}.crc").unlink(missing_ok=True)

    changed = {**data, "routes": [*data["routes"], {"topics": [other], "table": {"name": "b"}}]}
    with pytest.raises(Exception, match="partly committed") as exc:
        run_once(spark, changed)
    assert "ConfigError" in str(exc.value) or isinstance(exc.value, ConfigError)
    assert not list((lake / "b").rglob("*.parquet"))  # nothing written to the new table

    run_once(spark, data)  # the old routes finish the batch (a skip)
    assert sorted(duckdb_ids(lake / "a")) == list(range(20))
    letters = dead_letters(lake, "_unrouted")
    assert sorted(json.loads(bytes(v))["id"] for _, v in letters) == list(range(100, 105))
    run_once(spark, changed)  # then the new routes apply to new batches


@pytest.mark.slow
def test_a_second_process_on_one_checkpoint_is_refused_until_the_first_stops(
        spark, kafka_broker, topic, tmp_path) -> None:
    """Scenario 6: a rolling deploy started a second process on the same Parquet
    checkpoint; its cleanup deleted the first's files and the loser's stayed. Now the
    second is refused (its lease sees the first renew) until the first has stopped;
    then a run (in this process) takes the released lease at once."""
    import os
    import signal
    import subprocess
    import time

    from tests.fixtures.services import lakesink_cmd, produce_events

    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, writer_lease_s=6)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 400
    cfg = write_config(tmp_path / "c.yaml", data)
    produce_events(kafka_broker, topic, range(3000))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_")}
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115
    first = subprocess.Popen(lakesink_cmd("run", "-c", str(cfg)), stdout=log,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        manifests = lake / ".lakesink" / "events" / "manifests"
        deadline = time.monotonic() + 240
        while not list(manifests.rglob("*.json")):
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first process committed nothing"
            time.sleep(0.2)
        second = run_cli("run", "-c", str(cfg), "--until-caught-up")
        assert second.returncode == 1, second.stderr[-3000:]
        said = " ".join(second.stderr.split())  # rich wraps long lines
        assert "another lakesink" in said and f"pid {first.pid}" in said, said[-2000:]
        assert first.poll() is None, "the first process must go on"
        first.send_signal(signal.SIGTERM)  # the old pod drains and releases its lease
        assert first.wait(timeout=180) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        log.close()
    produce_events(kafka_broker, topic, range(3000, 3500))
    started = time.monotonic()
    again = run_here(spark, cfg)
    assert "lakesink.app: query started" in again, again[-3000:]  # its log is read
    # the lease was released, not left for a take-over, and is taken at once
    assert "taking over the writer lease" not in again and "waiting up to" not in again
    assert time.monotonic() - started < 120
    ids = duckdb_ids(lake / "events")
    assert len(ids) == 3500 and sorted(ids) == list(range(3500))
