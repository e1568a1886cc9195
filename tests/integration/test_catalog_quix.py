"""The Quix lakehouse catalog: lakesink's calls against the protocol double
(``tests/fixtures/quix_catalog.py``, an HTTP server following the Quix sink's API; no Quix
catalog can run here), and whole runs whose files must each be registered once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakesink.catalog.base import CatalogFile, CommittedBatch
from lakesink.catalog.outbox import partition_of
from lakesink.catalog.quix import QuixCatalog
from lakesink.config.catalog import QuixCatalogConfig
from lakesink.errors import CatalogError, CatalogUnavailable, LayoutError
from tests.fixtures.quix_catalog import QuixCatalogDouble
from tests.fixtures.runs import run_once
from tests.fixtures.services import config_dict, duckdb_ids, produce_events

pytestmark = [pytest.mark.integration]


@pytest.fixture()
def quix() -> Iterator[QuixCatalogDouble]:
    double = QuixCatalogDouble(token="tok").start()
    yield double
    double.stop()


# -- the calls ---------------------------------------------------------------------------

def quix_catalog(double: QuixCatalogDouble, **kw: Any) -> QuixCatalog:  # noqa: ANN401
    cfg = QuixCatalogConfig(url=double.url + "/", auth_token="tok", timeout_s=1.0, **kw)
    return QuixCatalog(cfg, table="events", location="s3a://lake/data/events",
                       partition_by=["day", "city"])


def batch(*rels: str) -> CommittedBatch:
    return CommittedBatch(table="events", location="s3a://lake/data/events", app_id="a",
                          run="r", batch_id=0, files=tuple(
                              CatalogFile(f"s3a://lake/data/events/{r}", r, 100, 5,
                                          partition_of(r, "__HIVE_DEFAULT_PARTITION__"))
                              for r in rels))


def test_quix_creates_the_table_and_registers_files_as_the_quix_sink_does(quix) -> None:
    cat = quix_catalog(quix)
    cat.prepare()
    table = quix.tables[("default", "events")]
    assert table["location"] == "s3://lake/data/events"
    assert table["properties"]["expected_partitions"] == ["day", "city"]
    cat.register(batch("day=1/city=__HIVE_DEFAULT_PARTITION__/part-0000000000-r-0.parquet"))
    (sent,) = quix.registered_files("events")
    assert sent["file_path"] == ("s3://lake/data/events/day=1/city=__HIVE_DEFAULT_PARTITION__/"
                                 "part-0000000000-r-0.parquet")
    assert sent["partition_values"] == {"day": "1", "city": "__None__"}
    assert (sent["file_size"], sent["row_count"]) == (100, 5)


def test_quix_refuses_other_partitions_and_warns_on_another_order(quix, caplog) -> None:
    quix.tables[("default", "events")] = {"partition_spec": ["city", "day"]}
    quix_catalog(quix).prepare()
    assert "another order" in caplog.text
    quix.tables[("default", "events")] = {"partition_spec": ["day"]}
    with pytest.raises(LayoutError, match="table.partition_by"):
        quix_catalog(quix).prepare()


def test_quix_failures_are_sorted_by_what_helps(quix) -> None:
    cat = quix_catalog(quix)
    quix.fail(500)
    with pytest.raises(CatalogUnavailable):
        cat.prepare()
    quix.fail(1.5)  # longer than the client's 1 s timeout
    with pytest.raises(CatalogUnavailable):
        cat.prepare()
    cat.prepare()
    quix.token = "other"
    with pytest.raises(CatalogError, match="401") as err:
        cat.register(batch("day=1/city=x/part-0000000000-r-0.parquet"))
    assert not isinstance(err.value, CatalogUnavailable) and "tok" not in str(err.value)


def test_quix_without_auto_discover_waits_for_the_table(quix) -> None:
    cat = quix_catalog(quix, auto_discover=False)
    with pytest.raises(CatalogUnavailable, match="auto_discover"):
        cat.prepare()
    assert ("default", "events") not in quix.tables
    quix.tables[("default", "events")] = {"partition_spec": []}
    cat.prepare()
    cat.register(batch("day=1/city=x/part-0000000000-r-0.parquet"))
    assert len(quix.registered("events")) == 1


# -- whole runs --------------------------------------------------------------------------

def table_files(table: Path) -> list[str]:
    return sorted(str(p.relative_to(table)) for p in table.rglob("*.parquet"))


def registered(quix: QuixCatalogDouble, table: Path) -> list[str]:
    prefix = f"file://{table}/"
    paths = quix.registered("events")
    assert all(p.startswith(prefix) for p in paths), paths[:3]
    return sorted(p[len(prefix):] for p in paths)


def quix_run(spark, kafka_broker, topic: str, lake: Path, quix: QuixCatalogDouble,  # noqa: ANN001
             **catalog: Any) -> Any:  # noqa: ANN401
    data = config_dict(kafka_broker, topic, lake)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 500
    data["catalog"] = {"quix": {"url": quix.url, "timeout_s": 1}, "retry_initial_s": 0.2,
                       **catalog}
    return run_once(spark, data, {"CATALOG_AUTH_TOKEN": "tok"})


@pytest.mark.kafka
@pytest.mark.spark
def test_every_committed_file_registered_once_and_a_down_catalog_catches_up(
        spark, kafka_broker, topic, tmp_path, quix) -> None:
    lake = tmp_path / "lake"
    produce_events(kafka_broker, topic, range(1000))
    stats = quix_run(spark, kafka_broker, topic, lake, quix)
    files = table_files(lake / "events")
    assert registered(quix, lake / "events") == files and stats.registered == 2
    sent = quix.registered_files("events")
    assert sum(f["row_count"] for f in sent) == 1000 == len(duckdb_ids(lake / "events"))
    assert {tuple(f["partition_values"]) for f in sent} == {("location", "year", "month", "day")}

    # down for the next run (every call fails): ingestion goes on, nothing registered
    produce_events(kafka_broker, topic, range(1000, 2000))
    quix.fail(*[500] * 1000)
    stats = quix_run(spark, kafka_broker, topic, lake, quix)
    assert stats.written == 1000 and stats.registered == 0 and stats.unregistered == 2
    assert sorted(duckdb_ids(lake / "events")) == list(range(2000))
    assert registered(quix, lake / "events") == files
    quix.failing.clear()

    # back: the next start registers the backlog, then the new batch; each file once
    produce_events(kafka_broker, topic, range(2000, 2100))
    stats = quix_run(spark, kafka_broker, topic, lake, quix)
    assert stats.registered == 3 and not stats.unregistered
    assert registered(quix, lake / "events") == table_files(lake / "events")
    counts = Counter(quix.sent_paths("events"))
    assert max(counts.values()) == 1  # no file was even sent twice
