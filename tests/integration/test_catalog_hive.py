"""The Hive metastore catalog against a real metastore (the standalone thrift service
from pyspark's jars), read back by Spark SQL by table name in an application of its own.

The kills after the commit and after the registration are in the crash matrix
(``tests/chaos/test_crash.py``, the ``-hive`` cases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.local.services import free_port
from tests.fixtures import hive_client
from tests.fixtures.services import config_dict, produce_events, run_cli, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: a metastore URI where nothing listens
DOWN = f"thrift://127.0.0.1:{free_port()}"


def test_each_step_through_spark_sql(hive_metastore, tmp_path) -> None:
    """A null partition (two null folder names), escaped folder names (``/``, quotes,
    ``\``, ``${…}``), a new column, a widened column (in place, the partitions kept), a
    batch registered twice, an older batch registered late, a table with other partition
    columns, another folder or another format refused, a Delta table, one whose
    log was deleted (refused, saying what to do) and that was made again at its folder."""
    out = hive_client.run("scenario", hive_metastore.uri, str(tmp_path))
    first = out["after_create"]
    assert first["provider"] == "parquet"
    assert sorted(first["ids"]) == [0, 1, 2, 3]
    assert first["columns"] == ["id", "v", "site", "day"]
    assert sorted(first["partitions"]) == ["site=__HIVE_DEFAULT_PARTITION__/day=2026-01-01",
                                           "site=a%2Fb/day=2026-01-02",
                                           "site=oslo/day=2026-01-01"]
    assert out["null_site_ids"] == [2]
    assert out["slash_site"] == ["a/b"]
    again = out["after_new_column"]
    assert sorted(again["ids"]) == [0, 1, 2, 3, 4]  # registered twice: no row twice
    assert again["columns"] == ["id", "v", "extra", "site", "day"]
    assert out["extra"] == [1.5]
    widened = out["after_widening"]
    assert sorted(widened["ids"]) == [0, 1, 2, 3, 4, 5_000_000_000]
    assert len(widened["partitions"]) == 5  # widened in place: the partitions stay
    assert out["id_type"] == "bigint"
    assert out["odd_site"] == [out["odd_expected"]]  # quotes, \ and ${…} kept as text
    assert out["none_site"] == [2, 7]
    late = out["after_late"]
    assert sorted(late["ids"]) == [0, 1, 2, 3, 4, 6, 7, 5_000_000_000]
    assert len(late["partitions"]) == 7
    assert out["id_type_after_late"] == "bigint"
    made, restarted, again, others, seen, copied, remade = out["generations"]
    assert made is not None and made == restarted and again not in (None, made)
    # the same table seen from a JVM in another time zone (DESCRIBE's text moved)
    assert out["generation_in_tokyo"] == made
    # told as DESCRIBE tells it in a UTC JVM: generations recorded before stay the same
    (utc,) = out["created_in_utc"]
    assert made.endswith(f"@{utc}"), (made, utc)
    (tokyo,) = out["created_in_tokyo"]
    assert tokyo not in made, (tokyo, made)
    assert others not in (None, made, again) and seen == others
    # made again from SHOW CREATE TABLE (lakesink's property copied): another one
    assert copied not in (None, made, again, others)
    assert out["dropped_while_registering"] == ["CatalogUnavailable", None]
    assert remade not in (None, made, again, others, copied)
    assert sorted(out["after_made_again"]["ids"]) == [4]  # only what was registered since
    assert out["refused"] == "table.partition_by"
    (key, said), (key2, said2) = out["refusals"]["location"], out["refusals"]["provider"]
    assert key == key2 == "catalog.hive.table"
    assert f"exists at file:{tmp_path}/events" in said and "/elsewhere" in said, said
    assert "exists as a parquet table; this table is delta" in said2, said2
    assert out["delta"]["provider"] == "delta"
    assert sorted(out["delta"]["ids"]) == list(range(7))
    gone = out["delta_log_gone"] or ""
    assert f"lake.dtable is registered as the Delta table at file://{tmp_path}/dtable, but " \
        "its _delta_log has no commit" in gone, gone
    assert "DROP TABLE `lake`.`dtable`" in gone and "restore the log" in gone, gone
    assert "exists as a delta table; this table is parquet" in (
        out["parquet_over_delta"] or ""), out["parquet_over_delta"]
    assert out["delta_made_again"]["provider"] == "delta"
    assert sorted(out["delta_made_again"]["ids"]) == [10, 11]


def test_a_metastore_down_delays_registration_not_ingestion(kafka_broker, topic, tmp_path,
                                                            hive_metastore) -> None:
    """Parquet: with the metastore unreachable the run writes every row and reports the
    batches waiting; the next run, with the metastore back, registers the backlog."""
    produce_events(kafka_broker, topic, range(300))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake)
    data["catalog"] = {"hive": {"uri": DOWN, "database": "down"}, "retry_initial_s": 60}
    cfg = write_config(tmp_path / "c.yaml", data)
    first = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "unavailable" in first.stderr
    assert "unregistered" in first.stdout + first.stderr
    data["catalog"]["hive"]["uri"] = hive_metastore.uri
    write_config(cfg, data)
    second = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert second.returncode == 0, second.stderr[-3000:]
    out = hive_client.run("read", hive_metastore.uri, "down.events")
    assert sorted(out["ids"]) == list(range(300))
    folders = {str(p.parent.relative_to(lake / "events")) for p in
               Path(lake / "events").rglob("*.parquet")}
    assert set(out["partitions"]) == folders


def test_a_metastore_down_does_not_stop_an_existing_delta_table(kafka_broker, topic,
                                                                tmp_path, hive_metastore
                                                                ) -> None:
    """Delta: a run on a registered table while the metastore is down still ingests
    (lakesink's Delta writer reads the log, never a path table through the session
    catalog, which would ask the metastore); by name, the table then has every row."""
    produce_events(kafka_broker, topic, range(300))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format="delta")
    data["catalog"] = {"hive": {"uri": hive_metastore.uri, "database": "down_delta"},
                       "retry_initial_s": 60}
    cfg = write_config(tmp_path / "c.yaml", data)
    first = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert first.returncode == 0, first.stderr[-3000:]
    produce_events(kafka_broker, topic, range(300, 400))
    data["catalog"]["hive"]["uri"] = DOWN
    write_config(cfg, data)
    second = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "unavailable" in second.stderr
    out = hive_client.run("read", hive_metastore.uri, "down_delta.events")
    assert sorted(out["ids"]) == list(range(400))
