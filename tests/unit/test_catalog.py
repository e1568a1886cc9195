"""The catalog step without Spark or network: the config, the outbox's order, marks and
backoff (the Quix catalog's calls: tests/integration/test_catalog_quix.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lakesink.catalog import Catalog, CommittedBatch, registrar
from lakesink.catalog.marks import generation_tag
from lakesink.catalog.outbox import Registrar, partition_of
from lakesink.config import load_config, redacted_dict
from lakesink.errors import CatalogError, CatalogUnavailable, ConfigError
from lakesink.tables.layout import TableLayout

KAFKA = {"source": {"kafka": {"bootstrap_servers": "b:9092", "topics": ["events"]}}}


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "lakesink.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# -- configuration -----------------------------------------------------------------------

def test_no_catalog_by_default(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, KAFKA), env={}).catalog.type == "none"


def test_the_quix_variables_fill_the_quix_catalog(tmp_path: Path) -> None:
    env = {"Quix__Lakehouse__Catalog__Url": "http://cat:8080/", "CATALOG_URL": "http://other",
           "Quix__Lakehouse__Catalog__AuthToken": "tok-123", "CATALOG_NAMESPACE": "lake",
           "AUTO_DISCOVER": "false"}
    cfg = load_config(write(tmp_path, KAFKA), env=env)
    quix = cfg.catalog.quix
    assert cfg.catalog.type == "quix" and quix is not None
    assert (quix.url, quix.namespace, quix.auto_discover) == ("http://cat:8080/", "lake", False)
    assert quix.auth_token is not None and quix.auth_token.get_secret_value() == "tok-123"
    assert "tok-123" not in json.dumps(redacted_dict(cfg), default=str)


def test_auto_discover_is_on_only_for_true_as_in_the_quix_sink(tmp_path: Path) -> None:
    url = {"Quix__Lakehouse__Catalog__Url": "http://c"}
    for value, on in (("TRUE", True), ("true", True), ("1", False), ("yes", False),
                      ("off", False)):
        cfg = load_config(write(tmp_path, KAFKA), env={**url, "AUTO_DISCOVER": value})
        assert cfg.catalog.quix is not None and cfg.catalog.quix.auto_discover is on, value


def test_catalog_url_alone_needs_the_quix_catalog_chosen(tmp_path: Path) -> None:
    """CATALOG_URL is a generic name (pyiceberg's too): it only fills a chosen catalog."""
    assert load_config(write(tmp_path, KAFKA), env={"CATALOG_URL": "http://c"}
                       ).catalog.type == "none"
    cfg = load_config(write(tmp_path, {**KAFKA, "catalog": {"type": "quix"}}),
                      env={"CATALOG_URL": "http://c", "CATALOG_AUTH_TOKEN": "t"})
    assert cfg.catalog.quix is not None and cfg.catalog.quix.url == "http://c"
    assert cfg.catalog.quix.auth_token is not None


def test_the_quix_catalog_needs_a_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="catalog.quix.url"):
        load_config(write(tmp_path, {**KAFKA, "catalog": {"type": "quix"}}), env={})


def test_a_token_in_the_file_is_refused(tmp_path: Path) -> None:
    data = {**KAFKA, "catalog": {"quix": {"url": "http://c", "auth_token": "s3cr3t"}}}
    with pytest.raises(ConfigError, match="catalog.quix.auth_token") as err:
        load_config(write(tmp_path, data), env={})
    assert "s3cr3t" not in str(err.value)


def test_a_delta_table_with_a_file_catalog_is_refused(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, {**KAFKA, "table": {"format": "delta"},
                                       "catalog": {"quix": {"url": "http://c"}}}), env={})
    with pytest.raises(ConfigError, match="catalog.type"):
        registrar(cfg.catalog, cfg.table, FakeFS(), TableLayout.of("/lake", "events"), run="r")


# -- the outbox --------------------------------------------------------------------------

def test_partition_values_come_back_unescaped_with_nulls() -> None:
    rel = "city=São%2FPaulo/day=__HIVE_DEFAULT_PARTITION__/part-0000000001-r-0.parquet"
    assert partition_of(rel, "__HIVE_DEFAULT_PARTITION__") == {"city": "São/Paulo",
                                                                "day": None}
    assert partition_of("part-0.parquet", "x") == {}


@dataclass
class Info:
    path: str
    relative: str
    size: int


class FakeFS:
    """The HadoopFS calls the outbox makes, over a dict of path -> JSON text."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def list_files(self, path: str, *, suffix: str = "") -> list[Info]:
        base = path.rstrip("/") + "/"
        return sorted((Info(p, p[len(base):], len(t)) for p, t in self.files.items()
                       if p.startswith(base) and p.endswith(suffix)), key=lambda i: i.relative)

    def read_json(self, path: str) -> Any:  # noqa: ANN401
        return json.loads(self.files[path]) if path in self.files else None

    def write_json(self, path: str, data: Any) -> None:  # noqa: ANN401
        self.files[path] = json.dumps(data)

    def exists(self, path: str) -> bool:
        return path in self.files

    def delete(self, path: str, *, recursive: bool = True) -> bool:
        below = path.rstrip("/") + "/"
        gone = [p for p in self.files if p == path or (recursive and p.startswith(below))]
        for p in gone:
            del self.files[p]
        return bool(gone)

    def rename(self, src: str, dst: str) -> bool:
        if src not in self.files or dst in self.files:
            return False
        self.files[dst] = self.files.pop(src)
        return True


class FakeCatalog(Catalog):
    id = "fake"

    def __init__(self) -> None:
        self.batches: list[tuple[str, int]] = []
        self.down = 0  # calls left that fail
        self.prepared = 0
        self.refuse: set[int] = set()  # batches it answers with a refusal (a 4xx)
        self.gen: str | None = None  # the table's generation (None: no table, or untold)
        self.made: str | None = None  # the generation of a table register makes

    def generation(self) -> str | None:
        return self.gen

    def prepare(self) -> None:
        self._maybe_down()
        self.prepared += 1

    def register(self, batch: CommittedBatch) -> None:
        self._maybe_down()
        if batch.batch_id in self.refuse:
            raise CatalogError("413 Payload Too Large: 1000 files in one request")
        if self.gen is None:
            self.gen = self.made
        self.batches.append((batch.run, batch.batch_id))

    def _maybe_down(self) -> None:
        if self.down:
            self.down -= 1
            raise CatalogUnavailable("down")


LAYOUT = TableLayout("file:/lake", "events")


def commit(fs: FakeFS, run: str, batch: int) -> None:
    """A committed batch: its manifest, and its file in the table."""
    rel = f"day=1/part-{batch:010d}-{run}-0.parquet"
    fs.write_json(f"{LAYOUT.table}/{rel}", {})
    fs.write_json(LAYOUT.manifest(run, batch), {
        "batch_id": batch, "app_id": f"app-{run}",
        "files": [{"path": rel, "bytes": 10, "rows": 3}]})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(fs: FakeFS, catalog: FakeCatalog, clock: Clock, run: str = "r2") -> Registrar:
    return Registrar(catalog, fs, LAYOUT, run=run, null_value="__HIVE_DEFAULT_PARTITION__",
                     retry_initial_s=1.0, retry_max_s=4.0, clock=clock)


def test_start_registers_every_runs_unmarked_batches_in_order() -> None:
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    for run, batch in (("r2", 1), ("r1", 7), ("r2", 0), ("r1", 3)):
        commit(fs, run, batch)
    fs.write_json(Registrar(catalog, fs, LAYOUT, run="r2", null_value="").marks.mark("r1", 3), {})
    reg = make(fs, catalog, clock)
    reg.start()
    assert catalog.batches == [("r1", 7), ("r2", 0), ("r2", 1)]  # other runs first
    assert reg.pending == [] and reg.registered == 3
    assert all(fs.exists(reg.marks.mark(r, b)) for r, b in catalog.batches)
    reg.committed(1)  # a replay of a registered batch: not again
    assert len(catalog.batches) == 3


def test_a_catalog_that_is_down_delays_registration_with_backoff() -> None:
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    catalog.down = 3
    reg = make(fs, catalog, clock)
    reg.start()  # prepare fails: 1 s
    for b in range(4):
        commit(fs, "r2", b)
        reg.committed(b)
        clock.now += 0.6
    # tried at t=100 (start; then waits 1 s) and 101.2 (b2; then waits 2 s): both failed
    assert catalog.batches == [] and reg.pending == [("r2", b) for b in range(4)]
    assert reg.failures == 2 and reg.next_try == pytest.approx(103.2)
    clock.now = reg.next_try
    reg.drain()  # fails a third time: 4 s, the most
    assert reg.failures == 3 and reg.next_try == pytest.approx(107.2)
    clock.now = reg.next_try
    commit(fs, "r2", 4)
    reg.committed(4)  # the catalog is back: the backlog goes first, in order
    assert catalog.batches == [("r2", b) for b in range(5)] and catalog.prepared == 1
    assert reg.failures == 0 and reg.pending == []


def test_close_tries_once_more_and_leaves_the_rest_to_the_next_start() -> None:
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    reg = make(fs, catalog, clock)
    reg.start()
    catalog.down = 10
    commit(fs, "r2", 0)
    reg.committed(0)
    reg.close()  # not waiting for the backoff, fails again
    assert reg.pending == [("r2", 0)] and catalog.batches == []
    catalog.down = 0
    again = make(fs, catalog, clock)
    again.start()
    assert catalog.batches == [("r2", 0)]


def test_a_batch_marked_by_another_process_is_not_registered_again() -> None:
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    commit(fs, "r2", 0)
    commit(fs, "r2", 1)
    reg = make(fs, catalog, clock)
    catalog.down = 1
    reg.start()  # unavailable: both wait
    fs.write_json(reg.marks.mark("r2", 0), {})  # meanwhile another process registered batch 0
    clock.now += 5
    reg.drain()
    assert catalog.batches == [("r2", 1)] and reg.pending == []


def test_a_long_backlog_is_registered_over_several_batches() -> None:
    fs, clock = FakeFS(), Clock()

    class Slow(FakeCatalog):
        def register(self, batch: CommittedBatch) -> None:
            super().register(batch)
            clock.now += 4.0  # each registration takes 4 s

    catalog = Slow()
    for b in range(10):
        commit(fs, "r1", b)
    reg = Registrar(catalog, fs, LAYOUT, run="r2", null_value="", budget_s=10.0, clock=clock)
    reg.start()  # 3 registrations fit in 10 s
    assert len(catalog.batches) == 3 and len(reg.pending) == 7
    commit(fs, "r2", 0)
    reg.committed(0)  # the next batch goes on with the oldest first
    assert catalog.batches[3:] == [("r1", 3), ("r1", 4), ("r1", 5)]


def test_close_never_raises_and_an_unreadable_manifest_is_reported(caplog) -> None:
    fs, clock = FakeFS(), Clock()

    class Refusing(FakeCatalog):  # fails in a way no rule expects (a refusal is set
        def register(self, batch: CommittedBatch) -> None:  # aside: the test above)
            raise OSError("the outbox's store went away")

    fs.files[LAYOUT.manifest("r2", 0)] = ""  # a manifest emptied by a kill (older lakesink)
    catalog = FakeCatalog()
    reg = make(fs, catalog, clock)
    reg.start()
    assert "unreadable" in caplog.text and reg.pending == [] and catalog.batches == []
    reg = make(fs, Refusing(), clock)
    commit(fs, "r2", 1)
    reg.pending = [("r2", 1)]
    reg.close()  # logged, not raised: closing goes on to release the writers
    assert "registration failed at stop" in caplog.text and reg.pending == [("r2", 1)]


def test_catalog_ids_and_log_names_hide_passwords() -> None:
    from lakesink.catalog.iceberg import IcebergCatalog, safe_uri
    from lakesink.config.catalog import IcebergCatalogConfig

    assert safe_uri("postgresql://u:hunter2@db:5432/x?sslkey=k") == "postgresql://db:5432/x"

    def ice(uri: str) -> IcebergCatalog:
        return IcebergCatalog(IcebergCatalogConfig(uri=uri), table="t", location="file:/l/t",
                              partition_by=[], properties={})

    one = ice("postgresql://u:hunter2@db/x")
    assert "hunter2" not in one.describe() and "hunter2" not in one.id
    assert one.id != ice("postgresql://u:hunter2@other/x").id  # another catalog: anew


def test_the_quix_url_alone_leaves_a_delta_table_unregistered(tmp_path: Path, caplog) -> None:
    data = {**KAFKA, "table": {"format": "delta"}}
    cfg = load_config(write(tmp_path, data), env={"Quix__Lakehouse__Catalog__Url": "http://c"})
    assert cfg.catalog.type == "quix" and cfg.catalog.from_environment
    assert registrar(cfg.catalog, cfg.table, FakeFS(), LAYOUT, run="r") is None
    assert "not registered" in caplog.text


def test_one_iceberg_table_name_for_several_routes_is_refused(tmp_path: Path) -> None:
    data = {**KAFKA, "routes": [{"topics": ["a"]}, {"topics": ["b"]}],
            "catalog": {"iceberg": {"uri": "http://c", "table": "all"}}}
    with pytest.raises(ConfigError, match="catalog.iceberg.table"):
        load_config(write(tmp_path, data), env={})


def test_iceberg_properties_take_storage_s3_and_secrets_from_env(tmp_path: Path) -> None:
    from lakesink.catalog import iceberg_properties

    data = {**KAFKA, "storage": {"s3": {"endpoint": "http://127.0.0.1:8333"}},
            "catalog": {"iceberg": {"uri": "http://127.0.0.1:8181", "warehouse": "ice",
                                    "properties": {"s3.region": "eu-1"}}}}
    env = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK",
           "LAKESINK_CATALOG__ICEBERG__SECRET_PROPERTIES__CREDENTIAL": "id:pw"}
    cfg = load_config(write(tmp_path, data), env=env)
    assert cfg.catalog.type == "iceberg" and cfg.catalog.iceberg is not None
    props = iceberg_properties(cfg.catalog.iceberg, cfg.storage)
    assert props == {"type": "rest", "uri": "http://127.0.0.1:8181", "warehouse": "ice",
                     "s3.endpoint": "http://127.0.0.1:8333", "s3.region": "eu-1",
                     "s3.access-key-id": "AK", "s3.secret-access-key": "SK",
                     "s3.path-style-access": "true", "credential": "id:pw"}
    assert "id:pw" not in json.dumps(redacted_dict(cfg), default=str)


def test_iceberg_secrets_are_refused_in_plain_properties(tmp_path: Path) -> None:
    data = {**KAFKA, "catalog": {"iceberg": {"uri": "http://c",
                                             "properties": {"token": "abc"}}}}
    with pytest.raises(ConfigError, match="secret_properties") as err:
        load_config(write(tmp_path, data), env={})
    assert "abc" not in str(err.value)
    data = {**KAFKA, "catalog": {"iceberg": {"uri": "http://c"}, "quix": {"url": "http://q"}}}
    with pytest.raises(ConfigError, match="one catalog"):
        load_config(write(tmp_path, data), env={})


def test_validate_shows_no_password_of_a_catalog_database_url(tmp_path: Path) -> None:
    data = {**KAFKA, "catalog": {"iceberg": {
        "kind": "sql", "uri": "postgresql://lake:hunter2@db:5432/cat?password=hunter3"}}}
    cfg = load_config(write(tmp_path, data), env={})
    shown = json.dumps(redacted_dict(cfg))
    assert "hunter2" not in shown and "hunter3" not in shown
    assert "postgresql://lake:**********@db:5432/cat" in shown
    assert cfg.catalog.iceberg is not None and "hunter2" in cfg.catalog.iceberg.uri


def test_a_batch_the_catalog_refuses_is_set_aside_and_ingestion_goes_on() -> None:
    """audit-2 #13: a refusal (a 4xx, not an outage) of one committed batch used to stop
    the run, and every restart, at the same batch. It is recorded and reported; the
    batches after it are registered; the next start tries it again."""
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    catalog.refuse = {1}
    reg = make(fs, catalog, clock)
    reg.start()
    for b in range(3):
        commit(fs, "r2", b)
        reg.committed(b)  # never raises
    assert catalog.batches == [("r2", 0), ("r2", 2)] and reg.pending == []
    assert reg.status()["refused"] == 1 and reg.registered == 2
    record = fs.read_json(reg.refusal("r2", 1))
    assert "413 Payload Too Large" in record["refusal"]
    assert not fs.exists(reg.marks.mark("r2", 1))
    catalog.refuse = set()  # the cause mended (a catalog limit raised)
    again = make(fs, catalog, clock)
    again.start()
    assert catalog.batches[-1] == ("r2", 1) and fs.exists(again.marks.mark("r2", 1))
    assert not fs.exists(again.refusal("r2", 1)) and again.refused == 0


def test_a_batch_whose_files_a_compaction_merged_registers_the_merged_file() -> None:
    """audit-2 #4: a Hive catalog enabled on a compacted table (or down for longer than
    maintenance.min_age_s while cron compacts) read a batch's files where they had been,
    failed forever and held every later batch back. The batch's files are followed
    through the compaction journal to the file that holds their rows now."""
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    seen: list[tuple[int, list[str]]] = []

    class Folders(FakeCatalog):
        def register(self, batch: CommittedBatch) -> None:
            seen.append((batch.batch_id, [f.relative for f in batch.files]))

    for b in range(3):
        commit(fs, "r2", b)
    merged = [f"day=1/part-{b:010d}-r2-0.parquet" for b in (0, 1)]
    fs.write_json(f"{LAYOUT.compactions}/0000000000.json", {
        "id": 0, "output": "day=1/part-c0000000000-00000.parquet",
        "inputs": [{"path": p, "rows": 3, "bytes": 10} for p in merged]})
    fs.write_json(f"{LAYOUT.compactions}/0000000000.outcome.json", {
        "id": 0, "outcome": "done",
        "outputs": [{"path": "day=1/part-c0000000000-00000.parquet", "rows": 6,
                     "bytes": 15}]})
    reg = make(fs, Folders(), clock)
    reg.start()
    assert seen == [(0, ["day=1/part-c0000000000-00000.parquet"]),
                    (1, ["day=1/part-c0000000000-00000.parquet"]),
                    (2, ["day=1/part-0000000002-r2-0.parquet"])]
    assert reg.pending == [] and catalog.batches == []


def test_two_registrars_of_one_batch_append_it_once(tmp_path: Path) -> None:
    """audit-2 #2: two registrars of the same batch both find it not done, then both
    append. pyiceberg retried the loser's commit on top of the winner's snapshot and
    added the same files again (rows twice). Now the loser's commit fails
    (CatalogUnavailable, retried by the outbox), and its next try finds the batch done."""
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakesink.catalog.base import CatalogFile
    from lakesink.catalog.iceberg import IcebergCatalog
    from lakesink.config.catalog import IcebergCatalogConfig
    from lakesink.errors import CatalogUnavailable

    table_dir = tmp_path / "t"
    table_dir.mkdir()
    data = table_dir / "part-0.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64())}), data)
    batch = CommittedBatch(table="t", location=f"file://{table_dir}", app_id="app", run="r",
                           batch_id=7, files=(CatalogFile(f"file://{data}", "part-0.parquet",
                                                          data.stat().st_size, 3),))
    config = IcebergCatalogConfig(kind="sql", uri=f"sqlite:///{tmp_path}/catalog.db",
                                  warehouse=f"file://{tmp_path}/warehouse", namespace="lake")

    def registrar() -> IcebergCatalog:
        from lakesink.catalog import iceberg_properties

        return IcebergCatalog(config, table="t", location=f"file://{table_dir}",
                              partition_by=[], properties=iceberg_properties(config, None))

    first, second = registrar(), registrar()
    first.prepare()
    other = table_dir / "part-6.parquet"
    pq.write_table(pa.table({"id": pa.array([4, 5, 6], pa.int64())}), other)
    first.register(CommittedBatch(table="t", location=batch.location, app_id="app",
                                  run="r", batch_id=6, files=(CatalogFile(
                                      f"file://{other}", "part-6.parquet",
                                      other.stat().st_size, 3),)))  # the table
    both = threading.Barrier(2, timeout=30)
    done = IcebergCatalog._done

    def racing_done(self: IcebergCatalog, table: object, b: CommittedBatch) -> bool:
        found = done(self, table, b)
        both.wait()  # both have looked before either appends
        return found

    outcomes: list[str] = []

    def run(catalog: IcebergCatalog) -> None:
        try:
            catalog.register(batch)
            outcomes.append("registered")
        except CatalogUnavailable:
            outcomes.append("retry later")

    IcebergCatalog._done = racing_done  # type: ignore[method-assign]
    try:
        threads = [threading.Thread(target=run, args=(c,)) for c in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        IcebergCatalog._done = done  # type: ignore[method-assign]
    assert sorted(outcomes) == ["registered", "retry later"], outcomes
    second.register(batch)  # the outbox's next try: already in the snapshot history
    table = first._table()
    assert table is not None
    batches = [s.summary.additional_properties.get("lakesink.batch-id")
               for s in table.snapshots() if s.summary]
    assert batches.count("7") == 1, batches
    assert table.scan().to_arrow().num_rows == 6  # batches 6 and 7, each once


def test_a_batch_whose_files_are_gone_is_set_aside_and_the_backlog_goes_on() -> None:
    """known-open L9: a batch whose files were deleted made the catalog fail reading them
    (as if unavailable), retried forever, holding every later batch back."""
    fs, clock = FakeFS(), Clock()

    class Reads(FakeCatalog):
        def register(self, batch: CommittedBatch) -> None:
            if any(not fs.exists(f.path) for f in batch.files):
                raise CatalogUnavailable(f"reading batch {batch.batch_id}'s footers: "
                                         "FileNotFoundException")
            super().register(batch)

    catalog = Reads()
    for b in range(3):
        commit(fs, "r2", b)
    fs.delete(f"{LAYOUT.table}/day=1/part-{1:010d}-r2-0.parquet")  # by hand
    reg = make(fs, catalog, clock)
    reg.start()
    assert catalog.batches == [("r2", 0), ("r2", 2)] and reg.pending == []
    assert reg.refused == 1 and reg.failures == 0
    refusal = fs.read_json(reg.refusal("r2", 1))
    assert "no longer in the table (day=1/part-0000000001-r2-0.parquet)" in refusal["refusal"]
    # a catalog that is down is still waited for, files or not
    catalog.down = 1
    commit(fs, "r2", 3)
    reg.committed(3)
    assert reg.pending == [("r2", 3)] and reg.failures == 1


def test_a_store_that_cannot_tell_whether_files_are_gone_keeps_the_batch_waiting() -> None:
    """The look for gone files fails too (the store is down): an outage, not a refusal."""
    fs, clock = FakeFS(), Clock()

    class Down(FakeFS):
        def exists(self, path: str) -> bool:
            if "/events/day=" in path:
                raise OSError("store unreachable")
            return super().exists(path)

    class Unreadable(FakeCatalog):
        def register(self, batch: CommittedBatch) -> None:
            raise CatalogUnavailable("reading the batch's footers: store unreachable")

    fs = Down()
    commit(fs, "r2", 0)
    reg = make(fs, Unreadable(), clock)
    reg.start()
    clock.now += 10
    reg.drain()
    assert reg.pending == [("r2", 0)] and reg.refused == 0 and reg.failures == 2


# -- audit-2 #15: the catalog's table is reconciled with the marks ---------------------------

def test_a_catalog_table_made_again_gets_every_batch_again() -> None:
    """audit-2 #15 (a): a catalog table dropped and made again (by hand, by another
    tool) holds none of the batches; their marks kept them out of it for good. Now the
    table's generation is recorded with the marks, and another one queues every batch."""
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    catalog.gen = "g1"
    for b in range(3):
        commit(fs, "r1", b)
    make(fs, catalog, clock).start()
    everything = [("r1", 0), ("r1", 1), ("r1", 2)]
    assert catalog.batches == everything
    make(fs, catalog, clock).start()  # the same table: nothing again
    assert catalog.batches == everything
    catalog.batches, catalog.gen = [], "g2"  # replaced by another table of the name
    reg = make(fs, catalog, clock)
    reg.start()
    assert catalog.batches == everything and reg.pending == []
    assert all(fs.exists(reg.marks.mark(r, b)) for r, b in everything)


def test_a_catalog_table_dropped_during_a_run_gets_every_batch_when_made_again() -> None:
    """audit-2 #15 (a): dropped, not made again: the start cannot tell (no table), so
    the next registration makes it with one batch — and only then is the new generation
    seen and every earlier batch queued again behind it."""
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    catalog.gen = "g1"
    for b in range(2):
        commit(fs, "r1", b)
    make(fs, catalog, clock).start()
    catalog.batches, catalog.gen, catalog.made = [], None, "g3"  # dropped
    reg = make(fs, catalog, clock)
    reg.start()
    assert catalog.batches == []  # all marked, no table to compare
    commit(fs, "r2", 0)
    reg.committed(0)  # makes the table; which one took it is unknown: once more
    assert catalog.batches == [("r2", 0), ("r1", 0), ("r1", 1), ("r2", 0)]
    assert reg.pending == [] and reg.registered == 3  # the first one counted once
    assert fs.read_json(f"{reg.marks.folder}/table.json")["generation"] == "g3"


class ReplacedCatalog(FakeCatalog):
    """A catalog whose table another tool replaces right after batch ``at`` went into
    the old one (before the outbox looks at the generation again)."""

    def __init__(self, at: tuple[str, int]) -> None:
        super().__init__()
        self.at = at
        self.tables: dict[str | None, set[tuple[str, int]]] = {}

    def register(self, batch: CommittedBatch) -> None:
        super().register(batch)
        self.tables.setdefault(self.gen, set()).add((batch.run, batch.batch_id))
        if (batch.run, batch.batch_id) == self.at:
            self.gen = "g2"


@pytest.mark.parametrize(("at", "first", "registered"),
                         [(("r2", 1), "g1", 4), (("r2", 0), None, 3)],
                         ids=["replaced-after-a-registration", "made-by-it-then-replaced"])
def test_a_table_replaced_right_after_a_registration_gets_that_batch_too(
        at, first, registered) -> None:
    """The batch went into the table replaced right after; its mark, written under
    the new table's generation, kept it out of that table for good. A generation that
    changed around a registration now leaves the batch unmarked: queued again. The
    same when there was no table at the start and the first registration made the one
    replaced at once (the generation first recorded was the new table's)."""
    catalog, fs, clock = ReplacedCatalog(at=at), FakeFS(), Clock()
    catalog.gen, catalog.made = first, "g1"
    for b in range(3):
        commit(fs, "r2", b)
    reg = make(fs, catalog, clock)
    reg.start()
    everything = {("r2", 0), ("r2", 1), ("r2", 2)}
    assert catalog.tables["g2"] == everything and reg.pending == []
    assert fs.read_json(f"{reg.marks.folder}/table.json")["generation"] == "g2"
    assert reg.registered == registered  # r2 0 twice when its first mark was dropped


class Killed(BaseException):
    pass


class DyingFS(FakeFS):
    """A store whose recursive delete goes file by file, ``table.json`` first (a local
    folder's listing order is the file system's), and whose process is killed after
    ``budget`` files."""

    budget: int | None = None

    def delete(self, path: str, *, recursive: bool = True) -> bool:
        below = path.rstrip("/") + "/"
        gone = sorted((p for p in self.files
                       if p == path or (recursive and p.startswith(below))),
                      key=lambda p: (not p.endswith("/table.json"), p))
        for p in gone:
            if self.budget is not None:
                if self.budget == 0:
                    raise Killed(p)
                self.budget -= 1
            del self.files[p]
        return bool(gone)


@pytest.mark.parametrize("budget", range(6))
def test_a_kill_while_the_marks_of_a_dropped_table_go_leaves_no_batch_out(budget) -> None:
    """A kill while the marks of a replaced table are deleted: the recorded generation
    must go last, or the next start takes the marks left for the new table's and never
    registers their batches."""
    fs, catalog, clock = DyingFS(), FakeCatalog(), Clock()
    catalog.gen = "g1"
    for run, b in (("r1", 0), ("r1", 1), ("r2", 0), ("r2", 1)):
        commit(fs, run, b)
    make(fs, catalog, clock).start()
    catalog.batches, catalog.gen = [], "g2"  # replaced by another table of the name
    fs.budget = budget
    try:
        make(fs, catalog, clock).start()
    except Killed:
        pass
    fs.budget = None
    make(fs, catalog, clock).start()
    assert sorted(set(catalog.batches)) == [("r1", 0), ("r1", 1), ("r2", 0), ("r2", 1)]
    assert fs.read_json(f"{make(fs, catalog, clock).marks.folder}/table.json")["generation"] == "g2"


class HookedFS(FakeFS):
    """A store that runs a hook just before a path is written (another process's step
    landing in between two of this one's)."""

    def __init__(self) -> None:
        super().__init__()
        self.before_write: dict[str, Callable[[], None]] = {}

    def write_json(self, path: str, data: Any) -> None:  # noqa: ANN401
        hook = self.before_write.pop(path, None)
        if hook is not None:
            hook()
        super().write_json(path, data)


def test_a_mark_another_registrar_writes_for_the_old_table_keeps_no_batch_out() -> None:
    """Two registrars of one table (``lakesink run`` and ``lakesink dlq replay``) while
    the catalog's table is replaced: the replay registered its batch into the old table
    and wrote the mark after the run had dropped the old marks and before it listed them
    again. That mark stood for the new table, and the batch never reached it."""
    fs, clock = HookedFS(), Clock()
    run_catalog, replay_catalog = FakeCatalog(), FakeCatalog()
    run_catalog.gen = replay_catalog.gen = "g1"
    commit(fs, "r1", 0)
    run = make(fs, run_catalog, clock, run="r1")
    run.start()
    replay_fs = HookedFS()
    replay_fs.files = fs.files  # the same store, another process
    replay = make(replay_fs, replay_catalog, clock, run="rp")
    replay.start()  # both on the first table; r1's batch 0 is marked

    def replay_commits() -> None:  # still on the old table (it saw no other yet)
        commit(fs, "rp", 0)
        replay.committed(0)

    fs.before_write[f"{run.marks.folder}/table.json"] = replay_commits
    run_catalog.batches, run_catalog.gen = [], "g2"  # the table is replaced
    commit(fs, "r1", 1)
    run.committed(1)  # sees the new table: drops the marks, replay's mark lands, lists
    run.close()
    assert replay_catalog.batches == [("rp", 0)]  # the old table took it
    make(fs, run_catalog, clock, run="r1").start()
    assert sorted(set(run_catalog.batches)) == [("r1", 0), ("r1", 1), ("rp", 0)]


def _iceberg_lake(tmp_path: Path, batches: range) -> tuple[FakeFS, TableLayout]:
    """Committed batches of real Parquet files (ids 10*b .. 10*b+9, folder day=1)."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    layout = TableLayout(f"file://{tmp_path}/lake", "events")
    fs = FakeFS()
    for b in batches:
        rel = f"day=1/part-{b:010d}-r1-0.parquet"
        path = tmp_path / "lake" / "events" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": pa.array(range(10 * b, 10 * b + 10), pa.int64())}), path)
        fs.write_json(layout.manifest("r1", b), {
            "batch_id": b, "app_id": "app-1", "files": [
                {"path": rel, "bytes": path.stat().st_size, "rows": 10}],
            "committed_at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")})
    return fs, layout


def _iceberg(tmp_path: Path, layout: TableLayout, db: str = "catalog.db") -> Any:  # noqa: ANN401
    from lakesink.catalog import iceberg_properties
    from lakesink.catalog.iceberg import IcebergCatalog
    from lakesink.config.catalog import IcebergCatalogConfig

    config = IcebergCatalogConfig(kind="sql", uri=f"sqlite:///{tmp_path}/{db}",
                                  warehouse=f"file://{tmp_path}/warehouse", namespace="lake")
    return IcebergCatalog(config, table="events", location=layout.table,
                          partition_by=["day"], properties=iceberg_properties(config, None))


def _outbox(fs: FakeFS, catalog: Any, layout: TableLayout) -> Registrar:  # noqa: ANN401
    return Registrar(catalog, fs, layout, run="r1", null_value="__HIVE_DEFAULT_PARTITION__",
                     clock=Clock())


def _iceberg_ids(catalog: Any) -> list[int]:  # noqa: ANN401
    table = catalog._table()
    return sorted(table.scan().to_arrow().column("id").to_pylist()) if table else []


def test_a_new_iceberg_catalog_id_after_expired_snapshots_appends_no_batch_twice(
        tmp_path: Path) -> None:
    """audit-2 #15 (b): another URI form of the same catalog (or another pyiceberg
    catalog name of a REST catalog) is another catalog id, so every batch is queued again; the snapshot history no longer named the
    batches whose snapshots had expired, and they were appended twice. Now a batch
    committed before the oldest snapshot kept is looked for among the table's files."""
    import datetime as dt

    fs, layout = _iceberg_lake(tmp_path, range(3))
    first = _iceberg(tmp_path, layout)
    _outbox(fs, first, layout).start()
    assert _iceberg_ids(first) == list(range(30))
    table = first._table()
    table.maintenance.expire_snapshots().older_than(dt.datetime.now(dt.UTC)).commit()
    assert len(first._table().snapshots()) == 1  # batch 2's only
    renamed = _iceberg(tmp_path, layout, db="./catalog.db")  # the same database
    assert renamed.id != first.id
    reg = _outbox(fs, renamed, layout)
    reg.start()
    assert reg.pending == [] and reg.registered == 3  # marked under the new id
    assert _iceberg_ids(renamed) == list(range(30))  # each row once
    assert len(renamed._table().snapshots()) == 1  # nothing appended


def test_a_dropped_iceberg_table_is_made_again_with_every_batch(tmp_path: Path) -> None:
    """audit-2 #15 (a) with pyiceberg: the table dropped, the next batch makes it again
    (another uuid) and the batches registered before follow it."""
    fs, layout = _iceberg_lake(tmp_path, range(2))
    catalog = _iceberg(tmp_path, layout)
    _outbox(fs, catalog, layout).start()
    assert _iceberg_ids(catalog) == list(range(20))
    catalog.catalog.drop_table(catalog.identifier)
    reg = _outbox(fs, catalog, layout)
    reg.start()
    more, _ = _iceberg_lake(tmp_path, range(2, 3))
    fs.files.update(more.files)
    reg.committed(2)
    assert reg.pending == []
    assert _iceberg_ids(catalog) == list(range(30))


def _untagged(fs: FakeFS, reg: Registrar, run: str, batch: int) -> str:
    path = f"{reg.marks.folder}/{run}/{batch:010d}.json"
    fs.write_json(path, {"batch_id": batch})
    return path


def test_marks_from_before_tags_are_renamed_once_then_an_untagged_one_counts_absent() -> None:
    """Marks written before marks carried a tag hold for the recorded table: the first
    start renames them to carry its tag and says so in table.json. Afterwards, a mark
    without a tag (an older lakesink still running beside, on a table replaced since)
    no longer keeps its batch out."""
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    catalog.gen = "g1"
    for b in range(2):
        commit(fs, "r1", b)
    reg = make(fs, catalog, clock)
    old = [_untagged(fs, reg, "r1", b) for b in range(2)]
    fs.write_json(f"{reg.marks.folder}/table.json", {"generation": "g1"})  # an older lakesink's
    reg.start()
    assert catalog.batches == []  # both held: registered before
    assert not any(fs.exists(p) for p in old)
    assert fs.read_json(f"{reg.marks.folder}/table.json")["tagged"] is True
    assert sorted(i.relative for i in fs.list_files(reg.marks.folder, suffix=".json")) == [
        f"r1/{b:010d}.{generation_tag('g1')}.json" for b in range(2)] + ["table.json"]
    commit(fs, "r1", 2)
    _untagged(fs, reg, "r1", 2)  # an older process's mark, for whatever table it saw
    make(fs, catalog, clock).start()
    assert catalog.batches == [("r1", 2)]


def test_a_process_that_learns_of_the_new_table_late_keeps_the_marks_made_for_it() -> None:
    """Two registrars, the table replaced: the first to see it drops the old marks and
    marks its batches for the new table; the second, seeing it later, dropped those
    marks too (the whole folder), and the first one's batches were registered again.
    It now drops only the marks of other generations."""
    fs, clock = FakeFS(), Clock()
    first_cat, second_cat = FakeCatalog(), FakeCatalog()
    first_cat.gen = second_cat.gen = "g1"
    for b in range(2):
        commit(fs, "r1", b)
    first = make(fs, first_cat, clock, run="r1")
    first.start()
    second = make(fs, second_cat, clock, run="rp")
    second.start()
    first_cat.gen = second_cat.gen = "g2"  # replaced
    first_cat.batches, second_cat.batches = [], []
    commit(fs, "r1", 2)
    first.committed(2)  # drops the g1 marks, registers r1 0..2 to g2
    assert sorted(first_cat.batches) == [("r1", 0), ("r1", 1), ("r1", 2)]
    commit(fs, "rp", 0)
    second.committed(0)  # learns late: the marks for g2 are kept
    assert second_cat.batches == [("rp", 0)]
    assert {(run, b) for run, b, _ in second.marks.listed()} == {
        ("r1", 0), ("r1", 1), ("r1", 2), ("rp", 0)}


def test_a_generation_told_more_precisely_is_the_same_table() -> None:
    """Hive's generation was the table's property alone, then the property and the
    creation time: the marks recorded under the first hold for the same table (every
    batch was registered again at the first start after the upgrade)."""
    fs, catalog, clock = FakeFS(), FakeCatalog(), Clock()
    catalog.gen = "abc"
    for b in range(2):
        commit(fs, "r1", b)
    make(fs, catalog, clock).start()
    catalog.batches, catalog.gen = [], "abc@Sun Dec 06 12:12:46 UTC 2026"
    reg = make(fs, catalog, clock)
    reg.start()
    assert catalog.batches == []
    assert fs.read_json(f"{reg.marks.folder}/table.json")["generation"] == catalog.gen
    commit(fs, "r1", 2)
    make(fs, catalog, clock).start()
    assert catalog.batches == [("r1", 2)]
