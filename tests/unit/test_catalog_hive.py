"""The Hive catalog without Spark: its config, the Spark settings it implies, the SQL it
writes, how errors are sorted, and the Delta registrar (against a real metastore:
tests/integration/test_catalog_hive.py)."""

from __future__ import annotations

import pytest

from lakesink.catalog import registrar
from lakesink.catalog.hive import (
    DeltaRegistrar,
    HeldTable,
    HiveCatalog,
    literal,
    partition_clause,
    quote,
    same_location,
    sorted_error,
    spark_conf,
)
from lakesink.config import load_config
from lakesink.config.catalog import HiveCatalogConfig
from lakesink.errors import CatalogError, CatalogUnavailable, ConfigError, LayoutError
from lakesink.tables.layout import TableLayout
from tests.unit.test_catalog import KAFKA, FakeFS, write


def test_the_hive_section_chooses_the_catalog_and_its_session(tmp_path) -> None:
    cfg = load_config(write(tmp_path, {**KAFKA, "catalog": {"hive": {
        "uri": "thrift://hms:9083", "database": "lake"}}}), env={})
    assert cfg.catalog.type == "hive"
    conf = spark_conf(cfg.catalog)
    assert conf["spark.sql.catalogImplementation"] == "hive"
    assert conf["spark.hadoop.hive.metastore.uris"] == "thrift://hms:9083"
    # no uri: the session's own metastore (spark-defaults, hive-site.xml)
    cfg = load_config(write(tmp_path, {**KAFKA, "catalog": {"type": "hive"}}), env={})
    assert cfg.catalog.hive is not None and cfg.catalog.hive.database == "default"
    assert "spark.hadoop.hive.metastore.uris" not in spark_conf(cfg.catalog)
    assert spark_conf(load_config(write(tmp_path, KAFKA), env={}).catalog) == {}


@pytest.mark.parametrize(("section", "key"), [
    ({"uri": "http://hms:9083"}, "catalog.hive.uri"),
    ({"database": "my-lake"}, "catalog.hive.database"),
    ({"table": "a.b"}, "catalog.hive.table"),
])
def test_bad_hive_settings_name_their_key(tmp_path, section, key) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, {**KAFKA, "catalog": {"hive": section}}), env={})
    assert key in str(err.value)


def test_one_hive_table_name_for_several_routes_is_refused(tmp_path) -> None:
    data = {**KAFKA, "catalog": {"hive": {"table": "t"}},
            "routes": [{"topics": ["events"], "table": {"name": "a"}}]}
    with pytest.raises(ConfigError, match="catalog.hive.table"):
        load_config(write(tmp_path, data), env={})


def test_lake_table_names_become_hive_names(tmp_path) -> None:
    cfg = load_config(write(tmp_path, {**KAFKA, "catalog": {"hive": {}}}), env={})
    assert cfg.catalog.hive is not None
    hive = HiveCatalog(cfg.catalog.hive, object(), table="User-Events.v1",  # type: ignore[arg-type]
                       location="file:/l", partition_by=[], fmt="parquet")
    assert (hive.database, hive.table) == ("default", "user_events_v1")
    assert spark_conf(cfg.catalog)["spark.sql.variable.substitute"] == "false"


def test_sql_quoting() -> None:
    assert quote("we`ird") == "`we``ird`"
    assert literal("it's a\\b") == "'it\\'s a\\\\b'"
    assert literal(None) == "NULL"
    assert partition_clause({"day": "2026-01-01", "site": None}, ["site", "day"],
                            "s3a://b/t/site=__HIVE_DEFAULT_PARTITION__/day=2026-01-01") == (
        "PARTITION (`site` = NULL, `day` = '2026-01-01') "
        "LOCATION 's3a://b/t/site=__HIVE_DEFAULT_PARTITION__/day=2026-01-01'")


def test_locations_compare_as_the_metastore_keeps_them() -> None:
    assert same_location("file:/lake/events", "file:///lake/events/")
    assert same_location("s3a://b/lake/events", "s3a://b/lake/events/")
    assert not same_location("file:/lake/events", "file:///lake/other")


def test_an_unreachable_metastore_waits_a_refusal_stops() -> None:
    down = sorted_error(RuntimeError("org.apache.thrift.transport.TTransportException: "
                                     "java.net.ConnectException: Connection refused"), "x")
    assert isinstance(down, CatalogUnavailable)
    refused = sorted_error(RuntimeError("[SCHEMA_NOT_FOUND] no such database"), "x")
    assert isinstance(refused, CatalogError) and not isinstance(refused, CatalogUnavailable)


class FakeHive(HiveCatalog):
    """The Delta path of HiveCatalog without Spark: counts table registrations."""

    def __init__(self, exists: bool = False) -> None:
        self.id, self.known, self.exists, self.created, self.down = "hive-x", False, exists, 0, 0

    def describe(self) -> str:
        return "hive x"

    def prepare(self) -> None:
        if self.down:
            self.down -= 1
            raise CatalogUnavailable("down")
        self.known = self.exists

    def register_table(self) -> None:
        self.created += 1
        self.known = True


def delta_registrar(fs: FakeFS, hive: FakeHive) -> DeltaRegistrar:
    return DeltaRegistrar(hive, fs, TableLayout("file:/lake", "events"), run="r",  # type: ignore[arg-type]
                          null_value="", retry_initial_s=1.0, retry_max_s=4.0)


def test_a_delta_table_is_registered_once_after_its_first_commit() -> None:
    fs, hive = FakeFS(), FakeHive()
    fs.files["file:/lake/events/_delta_log/_staged_commits/x.json"] = "{}"  # no commit
    reg = delta_registrar(fs, hive)
    reg.start()  # no commit yet: nothing to register
    assert hive.created == 0 and reg.pending == []
    for b in range(3):
        reg.committed(b)
    assert hive.created == 1 and reg.registered == 1 and reg.pending == []


def test_a_delta_table_already_in_the_metastore_is_left_alone() -> None:
    fs, hive = FakeFS(), FakeHive(exists=True)
    fs.files["file:/lake/events/_delta_log/00000000000000000000.json"] = "{}"
    reg = delta_registrar(fs, hive)
    reg.start()
    reg.committed(0)
    assert hive.created == 0


def test_a_delta_table_waits_for_the_metastore() -> None:
    fs, hive = FakeFS(), FakeHive()
    hive.down = 1
    fs.files["file:/lake/events/_delta_log/00000000000000000000.json"] = "{}"
    reg = delta_registrar(fs, hive)
    reg.start()  # down: waits
    assert hive.created == 0 and reg.pending and reg.failures == 1
    reg.close()  # the last try at stop
    assert hive.created == 1 and reg.pending == []


def test_hive_takes_delta_tables_too(tmp_path) -> None:
    cfg = load_config(write(tmp_path, {**KAFKA, "table": {"format": "delta"},
                                       "catalog": {"hive": {}}}), env={})
    reg = registrar(cfg.catalog, cfg.table, FakeFS(), TableLayout("file:/lake", "events"),  # type: ignore[arg-type]
                    run="r", spark=object())  # type: ignore[arg-type]
    assert isinstance(reg, DeltaRegistrar) and reg.catalog.format == "delta"


def test_hdfs_locations_agree_with_the_metastores_qualified_form() -> None:
    assert same_location("hdfs:///lake/events", "hdfs://nn:8020/lake/events")
    assert not same_location("hdfs://a:8020/lake/events", "hdfs://b:8020/lake/events")
    assert not same_location("hdfs:///lake/events", "s3a://nn/lake/events")


def test_marks_are_per_metastore_and_one_clause_per_partition_value(tmp_path) -> None:
    from lakesink.catalog.base import CatalogFile, CommittedBatch

    cfg = load_config(write(tmp_path, {**KAFKA, "catalog": {"hive": {
        "uri": "thrift://a:9083"}}}), env={})
    other = load_config(write(tmp_path, {**KAFKA, "catalog": {"hive": {
        "uri": "thrift://b:9083"}}}), env={})
    args = {"table": "events", "location": "file:/l", "partition_by": ["site"],
            "fmt": "parquet"}
    hive = HiveCatalog(cfg.catalog.hive, object(), **args)  # type: ignore[arg-type]
    assert hive.id != HiveCatalog(other.catalog.hive, object(), **args).id  # type: ignore[arg-type]
    statements: list[str] = []
    hive._sql = lambda sql, what: statements.append(sql)  # type: ignore[method-assign]
    files = tuple(CatalogFile(f"file:/l/{folder}/part-0.parquet", f"{folder}/part-0.parquet",
                              10, 1, {"site": value})
                  for folder, value in (("site=none", None),
                                        ("site=__HIVE_DEFAULT_PARTITION__",
                                         "__HIVE_DEFAULT_PARTITION__"),
                                        ("site=oslo", "oslo")))
    hive._add_partitions(CommittedBatch("events", "file:/l", "app", "run", 0, files))
    (sql,) = statements
    assert sql.count("PARTITION (") == 2 and "`site` = NULL" in sql and "'oslo'" in sql


def test_an_existing_table_must_be_this_lake_table() -> None:
    """What the metastore holds (one read of its ``CatalogTable``) against the config:
    another format or folder is refused naming ``catalog.hive.table``; a Parquet table
    with other partition columns naming ``table.partition_by`` (a Delta table's
    partitions are its log's)."""
    def catalog(fmt: str) -> HiveCatalog:
        return HiveCatalog(HiveCatalogConfig(uri="thrift://x", database="lake"),
                           None, table="events", location="file:///lake/events",  # type: ignore[arg-type]
                           partition_by=["site", "day"], fmt=fmt)

    def held(**changed: object) -> HeldTable:
        return HeldTable(**{"provider": "parquet", "location": "file:/lake/events",
                            "partition_by": ("Site", "day"), "generation": None,
                            **changed})  # type: ignore[arg-type]

    catalog("parquet")._check(held())  # the metastore's spelling of the same folder
    catalog("delta")._check(held(provider="delta", partition_by=()))
    for fmt, other, key, said in [
            ("parquet", held(provider="delta"), "catalog.hive.table",
             "exists as a delta table; this table is parquet"),
            ("parquet", held(provider="hive"), "catalog.hive.table", "as a hive table"),
            ("delta", held(provider="delta", location="file:/elsewhere"),
             "catalog.hive.table", "exists at file:/elsewhere, not at file:///lake/events"),
            ("parquet", held(partition_by=("day", "site")), "table.partition_by",
             "partitioned by ['day', 'site']")]:
        with pytest.raises(LayoutError) as refused:
            catalog(fmt)._check(other)
        assert refused.value.key == key and said in str(refused.value), str(refused.value)


class _Option:
    """scala.Option as py4j shows it."""

    def __init__(self, value: object = None) -> None:
        self.value = value

    def isDefined(self) -> bool:  # noqa: N802 - the JVM's name
        return self.value is not None

    def get(self) -> object:
        return self.value


def test_the_generation_is_read_as_earlier_versions_wrote_it(monkeypatch) -> None:
    """The generation recorded in the outbox's marks (``<lakesink.generation>@<created
    in UTC>``, or the creation time alone for a table made without the property) must
    read the same after an upgrade: another spelling re-registers every batch."""
    from types import SimpleNamespace as NS

    def held(properties: dict[str, str], provider: str | None = "parquet") -> HeldTable:
        meta = NS(properties=lambda: NS(get=lambda k: _Option(properties.get(k))),
                  createTime=lambda: 1796559166000 + 999,  # Hive keeps seconds
                  provider=lambda: _Option(provider),
                  storage=lambda: NS(locationUri=lambda: _Option("file:/lake/x%20y")),
                  partitionSchema=lambda: NS(fieldNames=lambda: ["site", "day"]))
        utils = NS(URIToString=lambda uri: uri.replace("%20", " "))
        jvm = NS(org=NS(apache=NS(spark=NS(sql=NS(catalyst=NS(catalog=NS(
            CatalogUtils=utils)))))))
        catalog = HiveCatalog(HiveCatalogConfig(uri="thrift://x", database="lake"),
                              NS(sparkContext=NS(_jvm=jvm)), table="events",  # type: ignore[arg-type]
                              location="file:///lake/x y", partition_by=["site", "day"],
                              fmt="parquet")
        monkeypatch.setattr(catalog, "_jcatalog", lambda: NS(getTableMetadata=lambda _: meta))
        monkeypatch.setattr(catalog, "_ident", lambda: "lake.events")
        return catalog._held()

    made = "0123456789abcdef0123456789abcdef"
    assert held({"lakesink.generation": made}) == HeldTable(
        "parquet", "file:/lake/x y", ("site", "day"), f"{made}@Sun Dec 06 12:12:46 UTC 2026")
    assert held({}).generation == "Sun Dec 06 12:12:46 UTC 2026"
    assert held({"lakesink.generation": "copied by hand"}).generation == (
        "Sun Dec 06 12:12:46 UTC 2026")
    assert held({}, provider=None).provider == "hive"


def test_a_registered_delta_tables_log_is_checked_and_a_listing_error_waits(
        monkeypatch) -> None:
    """A registered Delta table whose ``_delta_log`` has no commit is refused (the next
    commit would start the table afresh under its name); a store that does not answer
    the listing is waited for (:class:`CatalogUnavailable`), not a refusal."""
    from lakesink.tables import delta

    catalog = HiveCatalog(HiveCatalogConfig(uri="thrift://x", database="lake"),
                          None, table="events", location="file:///lake/events",  # type: ignore[arg-type]
                          partition_by=[], fmt="delta")
    answers: list[object] = [True, False, OSError("connection reset\nat ...")]

    def has_commit(fs: object, table: str) -> bool:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)

    monkeypatch.setattr(delta, "has_commit", has_commit)
    monkeypatch.setattr("lakesink.tables.fs.HadoopFS", lambda spark, where: None)
    catalog._check_log()  # a commit: nothing to say
    with pytest.raises(CatalogError) as refused:
        catalog._check_log()
    assert not isinstance(refused.value, CatalogUnavailable)
    assert "_delta_log has no commit" in str(refused.value)
    assert "DROP TABLE `lake`.`events`" in str(refused.value)
    with pytest.raises(CatalogUnavailable, match="listing file:///lake/events/_delta_log: "
                       "connection reset"):
        catalog._check_log()
