"""Dead letters: ``dlq show`` and ``dlq replay`` — fix the config, replay, the rows
appear once and the dead letters are marked; a replay that stopped before it marked
its plan is finished by the next one without doubling anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lakesink import dlq
from lakesink.config import load_config
from lakesink.config.plan import TableSpec
from lakesink.local.services import produce
from tests.fixtures.runs import flatten
from tests.fixtures.services import config_dict, json_events, read_ids, run_cli_here, write_config
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _site_values(lake: Path, fmt: str) -> dict[int, Any]:
    if fmt == "delta":
        from deltalake import DeltaTable

        rows = DeltaTable(str(lake / "events")).to_pyarrow_table(columns=["id", "site"]).to_pylist()
        return {r["id"]: r["site"] for r in rows}
    import duckdb

    return dict(duckdb.sql(f"SELECT id, site FROM read_parquet('{lake}/events/**/*.parquet', "
                           "union_by_name=true)").fetchall())


@pytest.mark.parametrize(("fmt", "dlq_format"),
                         [("parquet", "parquet"), ("delta", "parquet"), ("delta", "delta")])
def test_fix_config_replay_rows_appear_once(spark, kafka_broker, topic, tmp_path, fmt,
                                            dlq_format) -> None:
    lake = tmp_path / "lake"
    good = json_events(range(30))
    with_site = json_events(range(30, 36), site="north")
    malformed = [(b"m1", b"{oops"), (b"m2", b"[1]")]
    produce(kafka_broker.bootstrap_servers, topic, good + with_site + malformed)
    strict = config_dict(kafka_broker, topic, lake, format=fmt, schema_evolution="strict",
                         unknown_fields="reject")
    strict["dlq"] = {"format": dlq_format}
    first = run_once(spark, strict)
    assert (first.written, first.rejected) == (30, 8)

    cfg = load_config(flags=flatten(strict), env={})
    shown = dlq.show(spark, TableSpec(cfg))
    assert shown["by_reason"] == {"unknown_field": 6, "malformed_json": 1, "not_an_object": 1}
    assert shown["replayed_records"] == 0 and len(shown["sample"]) == 5

    # the fix: new fields become columns
    fixed = config_dict(kafka_broker, topic, lake, format=fmt)
    fixed["dlq"] = {"format": dlq_format}
    fixed_cfg = load_config(flags=flatten(fixed), env={})
    result = dlq.replay(spark, TableSpec(fixed_cfg))
    assert (result["records"], result["written"], result["rejected"]) == (8, 6, 2)
    ids = read_ids(lake / "events", fmt)
    assert sorted(ids) == list(range(36))
    sites = _site_values(lake, fmt)
    assert {i for i, s in sites.items() if s == "north"} == set(range(30, 36))

    after = dlq.show(spark, TableSpec(fixed_cfg))
    assert after["replayed_records"] == 8
    assert after["by_reason"] == {"malformed_json": 1, "not_an_object": 1}  # failed again

    # a replay that stopped after its commit but before marking its plan: resumed, no doubles
    plan_file = sorted((lake / ".lakesink/events/dlq").glob("replay-*.json"))[-1]
    plan = json.loads(plan_file.read_text())
    plan["state"] = "planned"
    plan_file.write_text(json.dumps(plan))
    (plan_file.parent / f".{plan_file.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum
    resumed = dlq.replay(spark, TableSpec(fixed_cfg))
    assert resumed["replay"] == plan["replay"] and resumed["resumed"]
    assert sorted(read_ids(lake / "events", fmt)) == list(range(36))

    # the next replay takes only the two that failed again
    again = dlq.replay(spark, TableSpec(fixed_cfg))
    assert (again["records"], again["written"], again["rejected"]) == (2, 0, 2)
    assert sorted(read_ids(lake / "events", fmt)) == list(range(36))

    # the stream itself carries on after the replays
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(36, 40), site="south"))
    assert run_once(spark, fixed).written == 4
    assert sorted(read_ids(lake / "events", fmt)) == list(range(40))
    if dlq_format == "delta":  # the dead-letter table, read by delta-rs
        from deltalake import DeltaTable

        letters = DeltaTable(str(lake / "_rejected" / "events")).to_pyarrow_table().to_pylist()
        assert len(letters) == 8 + 2 + 2  # the first run, then each replay's re-rejections
        assert {(r["stage"], r["reason"]) for r in letters} == {
            ("schema", "unknown_field"), ("decode", "malformed_json"),
            ("decode", "not_an_object")}
        assert all(r["value"] is not None and r["offset"] is not None for r in letters)


def test_dlq_show_cli(spark, kafka_broker, topic, tmp_path) -> None:
    lake = tmp_path / "lake"
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(5)) + [(b"x", b"nope")])
    data = config_dict(kafka_broker, topic, lake)
    assert run_once(spark, data).rejected == 1
    cfg = write_config(tmp_path / "c.yaml", data)
    shown = run_cli_here("dlq", "show", "-c", str(cfg), "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    (summary,) = json.loads(shown.stdout)  # a list of tables, as status --json prints
    assert (summary["table"], summary["path"]) == ("events", f"file://{lake}/events")
    assert summary["by_reason"] == {"malformed_json": 1}
    assert summary["sample"][0]["value"] == "nope"
    # the parser's message and position, not only "not valid JSON"
    assert summary["sample"][0]["detail"] == ("the value is not valid JSON: Expecting value "
                                              "at line 1 column 1 (char 0)")


@pytest.mark.parametrize("dlq_format", ["parquet", "delta"])
def test_retention_deletes_old_dead_letters_but_not_a_replay_in_progress(
        spark, kafka_broker, topic, tmp_path, dlq_format) -> None:
    import time

    from lakesink import maintenance

    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, partition_by=[])
    data["dlq"] = {"format": dlq_format, "retention_days": 1.5 / 86400}  # 1.5 s
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(5)) + [(b"k", b"{x")] * 3)
    assert run_once(spark, data).rejected == 3
    produce(kafka_broker.bootstrap_servers, topic, [(b"k", b"[2]")] * 2)
    assert run_once(spark, data).rejected == 2
    cfg = load_config(flags=flatten(data), env={})
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(str(lake), "events")
    letters = dlq.DeadLetters(spark, HadoopFS(spark, layout.base), layout, dlq_format)
    first, second = letters.units()
    # an unfinished replay holds the second batch's dead letters
    letters.save({"replay": 0, "state": "planned", "files": [second],
                  "planned_at": "2026-11-29T00:00:00+00:00"})
    time.sleep(2)
    report = maintenance.vacuum(TableSpec(cfg), spark)
    expired = report["dead_letters_expired"]
    assert expired[("rows" if dlq_format == "delta" else "files")] == (3 if dlq_format == "delta"
                                                                        else 1), report
    assert letters.units() == [second]
    assert letters.read([second]).count() == 2
    assert sorted(read_ids(lake / "events", "parquet")) == list(range(5)), "the table stays"
    # the expired dead letters' bytes leave the storage, not only the table (audit-2 #14:
    # Delta's DELETE frees no file until the dead-letter table's own VACUUM)
    import duckdb

    def stored_values() -> list[bytes]:
        return sorted(bytes(r[0]) for r in duckdb.sql(
            f"SELECT value FROM read_parquet('{lake}/_rejected/events/**/*.parquet')"
            ).fetchall())

    if dlq_format == "delta":
        assert b"{x" in stored_values()  # deleted from the log, still on storage
        forced = load_config(flags=flatten({**data, "maintenance": {
            "vacuum_retention_hours": 0}}), env={})
        swept = maintenance.vacuum(TableSpec(forced), spark, force=True)["dead_letters_vacuum"]
        assert swept["files_after"] == 1, swept
    assert stored_values() == [b"[2]", b"[2]"]


def test_dead_letter_retention_beside_a_running_replay(spark, kafka_broker, topic, tmp_path,
                                                       monkeypatch) -> None:
    """known-open T4: ``vacuum`` with ``dlq.retention_days`` (another process) while a
    ``dlq replay`` runs. Both take the replay lock: the vacuum finds the replay renewing
    it and stops with one line, expiring nothing under the replay's feet; after the
    replay it expires the replayed letters. Every row once."""
    import threading
    import time

    from lakesink import maintenance
    from tests.fixtures.services import run_cli

    lake = tmp_path / "lake"
    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(5)) + json_events(range(5, 11), site="north"))
    strict = config_dict(kafka_broker, topic, lake, partition_by=[],
                         schema_evolution="strict", unknown_fields="reject")
    first = run_once(spark, strict)
    assert (first.written, first.rejected) == (5, 6)
    fixed = config_dict(kafka_broker, topic, lake, partition_by=[])
    fixed["dlq"] = {"retention_days": 1.5 / 86400}  # 1.5 s
    spec = TableSpec(load_config(flags=flatten(fixed), env={}))
    time.sleep(2)  # the dead letters are past their retention
    monkeypatch.setattr(dlq, "REPLAY_LOCK_TTL_S", 3.0)  # renewed every second
    inside, go = threading.Event(), threading.Event()
    real = dlq._replay_locked

    def held(*args: Any) -> Any:  # noqa: ANN401
        inside.set()
        assert go.wait(300)
        return real(*args)

    monkeypatch.setattr(dlq, "_replay_locked", held)
    replayed: list[Any] = []
    thread = threading.Thread(target=lambda: replayed.append(dlq.replay(spark, spec)))
    thread.start()
    try:
        assert inside.wait(120)
        beside = run_cli("vacuum", "-c", str(write_config(tmp_path / "c.yaml", fixed)))
    finally:
        go.set()
        thread.join(300)
    assert beside.returncode == 1, beside.stderr[-2000:]
    assert "renewed its lease" in beside.stderr, beside.stderr[-2000:]
    (result,) = replayed
    assert (result["records"], result["written"], result["rejected"]) == (6, 6, 0), result
    assert sorted(read_ids(lake / "events", "parquet")) == list(range(11))
    expired = maintenance.vacuum(spec, spark)["dead_letters_expired"]
    assert expired["files"] == 1, expired
    assert dlq.show(spark, spec)["by_reason"] == {}
    assert sorted(read_ids(lake / "events", "parquet")) == list(range(11))
