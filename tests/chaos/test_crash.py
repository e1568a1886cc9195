"""Crash tests: SIGKILL the whole process at each fault point, restart, count every id.

Scale the loop with ``CHAOS_ROUNDS`` (default 1 round per point). The killed run is a
process of its own; its restart mostly runs in the tests' process
(:func:`~tests.fixtures.services.kill_then_restart`): it has only what the killed one
left in the lake, the checkpoint and the source.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from lakesink.faults import CATALOG_POINTS, COMMON_POINTS, DELTA_POINTS, PARQUET_POINTS
from lakesink.local.services import produce
from tests.fixtures import hive_client
from tests.fixtures.quix_catalog import QuixCatalogDouble
from tests.fixtures.services import (
    ENGINE,
    config_dict,
    full_only,
    kill_then_restart,
    produce_events,
    read_ids,
    run_cli,
    write_config,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
N = 1500  # three batches of a third (the first kill is in batch 1)


#: (format, point, catalog): Parquet runs register their batches in a catalog too. Every
#: fault point runs once; each catalog at each catalog fault point (after the commit,
#: after the registration) and the repeats in the other format with CHAOS_FULL=1.
CORE = [("parquet", "after_staging", "quix"), ("parquet", "after_publish", "quix"),
        ("parquet", "after_manifest", "hive"), ("parquet", "after_registration", "iceberg")]
REPEATS = [("delta", "after_delta_commit", None),  # in CI: the delta-rs kill test below
           # in CI: the S3 and Azure kills (a publish there is a copy and a delete) and
           # the cluster's driver kill
           ("parquet", "mid_publish", "quix"),
           # in CI: the kill while a registry schema evolves (test below)
           ("parquet", "after_schema_evolved", "quix"),
           ("parquet", "after_manifest", "iceberg"), ("parquet", "after_manifest", "quix"),
           ("parquet", "after_registration", "quix"),
           ("parquet", "after_registration", "hive"), ("delta", "after_schema_evolved", None),
           ("delta", "after_delta_commit", "hive")]
#: the points other tests of this module kill at in CI: the delta-rs commit, the S3 and
#: Azure lakes' publish, the registry schema's evolution
DELTA_RS_POINT, STORE_POINT, REGISTRY_POINT = ("after_delta_commit", "mid_publish",
                                               "after_schema_evolved")
assert {p for _, p, _ in CORE} | {DELTA_RS_POINT, STORE_POINT, REGISTRY_POINT} == set(
    PARQUET_POINTS + CATALOG_POINTS + DELTA_POINTS + COMMON_POINTS)


def case_id(fmt: str, point: str, catalog: str | None) -> str:
    return f"{fmt}-{point}" + (f"-{catalog}" if catalog else "")


CASES = ([pytest.param(*c, id=case_id(*c)) for c in CORE]
         + [full_only(*c, id=case_id(*c)) for c in REPEATS])
BAD = [(b"k", b"not json %d" % i) for i in range(7)]


def crash_then_recover(kafka_broker, topic: str, tmp_path: Path, fmt: str, point: str,
                       catalog: dict[str, object] | None = None, restart_in=None,  # noqa: ANN001
                       ) -> tuple[list[int], int]:
    """Returns the ids the table holds and the number of rejected rows (``restart_in``:
    see :func:`kill_then_restart`).

    Batch 1 (the one killed) is also the batch where a new field first appears, so every
    case crosses a schema evolution too. With ``catalog``, each batch is registered there.
    """
    lake = tmp_path / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    data = config_dict(kafka_broker, topic, lake, format=fmt)
    data["source"]["kafka"]["max_offsets_per_trigger"] = N // 3
    if catalog is not None:
        data["catalog"] = catalog
    cfg = write_config(tmp_path / "c.yaml", data)
    kill_then_restart(cfg, point, restart_in=restart_in)
    import duckdb

    rejected = duckdb.sql(f"SELECT count(*) FROM read_parquet('{lake}/_rejected/events/*.parquet')"
                          ).fetchone()
    return read_ids(lake / "events", fmt), rejected[0] if rejected else 0


@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize(("fmt", "point", "catalog"), CASES)
def test_kill_at_fault_point_then_restart(spark, kafka_broker, topic, tmp_path, fmt, point,
                                          catalog, round_, request) -> None:
    """Parquet runs register every batch in a catalog (the Quix protocol double,
    pyiceberg's SQL catalog or a Hive metastore): after the restart the catalog lists each
    table file once. A kill between the catalog's answer and the outbox's mark
    (``after_registration``) sends that batch again: the Quix catalog keeps one entry per
    file path (and only that batch is re-sent); Iceberg finds the batch in its snapshot
    history; Hive's steps are idempotent. Read by name through the metastore (Spark SQL),
    Hive tables hold exactly the produced rows. The restart runs in the tests' process
    (a Hive catalog's in a process of its own: the tests' session has no Hive support)."""
    produce_events(kafka_broker, topic, range(N // 2))
    produce(kafka_broker.bootstrap_servers, topic, BAD)  # rejected rows must survive too
    produce_events(kafka_broker, topic, range(N // 2, N), firmware="2.0")  # a new field
    quix = QuixCatalogDouble().start() if catalog == "quix" else None
    iceberg = {"kind": "sql", "uri": f"sqlite:///{tmp_path}/iceberg.db",
               "warehouse": f"file://{tmp_path}/warehouse"}
    hms = request.getfixturevalue("hive_metastore") if catalog == "hive" else None
    database = f"crash_{fmt}_{point}"
    section = ({"quix": {"url": quix.url}} if quix
               else {"hive": {"uri": hms.uri, "database": database}} if hms
               else {"iceberg": iceberg} if catalog else None)
    try:
        ids, rejected = crash_then_recover(kafka_broker, topic, tmp_path, fmt, point, section,
                                           restart_in=None if hms else spark)
        table = tmp_path / "lake" / "events"
        if quix is not None:
            check_registered(quix.registered_files("events"), table, point, catalog)
            sent = quix.sent_paths("events")
            again = {p for p in sent if "/part-0000000001-" in p}
            resent = len(sent) - len(set(sent))
            print(f"crash-matrix point={point} catalog=quix files_sent_twice={resent}")
            # only the batch killed between the catalog's answer and the mark is re-sent
            assert resent == (len(again) if point == "after_registration" else 0)
        elif catalog == "iceberg":
            check_registered(iceberg_files(iceberg["uri"]), table, point, catalog)
        elif hms is not None:
            check_hive(hms.uri, f"{database}.events", table, fmt)
    finally:
        if quix is not None:
            quix.stop()
    rows, distinct = len(ids), len(set(ids))
    print(f"crash-matrix point={point} format={fmt} restarts=1 produced={N} "
          f"lost={N - distinct} duplicated={rows - distinct} rejected={rejected}/{len(BAD)}")
    assert (rows, distinct) == (N, N), f"{point}: lost {N - distinct}, duplicated {rows - distinct}"
    assert sorted(ids) == list(range(N))
    assert rejected == len(BAD), "rejected records lost or duplicated"
    firmware = column_by_id(tmp_path / "lake" / "events", fmt, "firmware")
    assert {i for i, v in firmware.items() if v == "2.0"} == set(range(N // 2, N))


def iceberg_files(uri: str) -> list[dict[str, object]]:
    """The files of the Iceberg table as pyiceberg plans a scan, with their rows."""
    from pyiceberg.catalog import load_catalog

    table = load_catalog("default", type="sql", uri=uri).load_table(("default", "events"))
    assert len(table.scan().to_arrow()) == N  # pyiceberg's own read
    return [{"file_path": t.file.file_path, "row_count": t.file.record_count}
            for t in table.scan().plan_files()]


def check_hive(uri: str, name: str, table: Path, fmt: str) -> None:
    """Spark SQL by table name, through the metastore: exactly the produced rows, and
    (Parquet) the table's partition folders, each registered."""
    out = hive_client.run("read", uri, name)
    print(f"crash-matrix catalog=hive table={name} rows={len(out['ids'])} "
          f"distinct={len(set(out['ids']))} partitions={len(out.get('partitions', []))}")
    assert sorted(out["ids"]) == list(range(N))
    assert out["provider"] == fmt
    if fmt == "parquet":  # partitions come only from registered batches' manifests
        folders = {str(p.parent.relative_to(table)) for p in table.rglob("*.parquet")}
        assert sorted(out["partitions"]) == sorted(folders)
        meta = table.parent / ".lakesink" / table.name
        marks = list((meta / "registered").glob("*/*/*.json"))  # <catalog>/<run>/<batch>
        manifests = list((meta / "manifests").rglob("*.json"))
        assert len(marks) == len(manifests) > 0


def check_registered(registered: list[dict[str, object]], table: Path, point: str,
                     catalog: str) -> None:
    files = sorted(f"file://{p}" for p in table.rglob("*.parquet"))
    listed = sorted(str(f["file_path"]) for f in registered)
    print(f"crash-matrix point={point} catalog={catalog} table_files={len(files)} "
          f"registered={len(listed)} twice={len(listed) - len(set(listed))}")
    assert listed == files
    rows = {f["file_path"]: f["row_count"] for f in registered}
    assert sum(rows.values()) == N  # what a reader through the catalog counts


def column_by_id(table: Path, fmt: str, column: str) -> dict[int, object]:
    if fmt == "delta":
        from deltalake import DeltaTable

        rows = DeltaTable(str(table)).to_pyarrow_table(columns=["id", column]).to_pylist()
        return {r["id"]: r[column] for r in rows}
    import duckdb

    return dict(duckdb.sql(f"SELECT id, {column} FROM read_parquet('{table}/**/*.parquet', "
                           "hive_partitioning=true, union_by_name=true)").fetchall())


# the state an after_manifest / after_delta_commit kill leaves (the table holds the batch,
# Spark's commit log does not): those kills run in CI, this case with CHAOS_FULL=1
@pytest.mark.parametrize("fmt", [full_only("parquet", id="parquet"),
                                 full_only("delta", id="delta")])
def test_lost_checkpoint_commit_replays_without_duplicates(kafka_broker, topic, tmp_path, fmt
                                                           ) -> None:
    """The crash window Spark itself has: a batch's data is committed but its entry in
    ``checkpoint/commits`` is missing. Delete the newest one and restart."""
    produce_events(kafka_broker, topic, range(N))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt)
    data["source"]["kafka"]["max_offsets_per_trigger"] = N // 3
    cfg = write_config(tmp_path / "c.yaml", data)
    first = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert first.returncode == 0, first.stderr[-3000:]
    commits = lake / ".lakesink/events/checkpoint/commits"
    newest = max((p for p in commits.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    newest.unlink()
    (commits / f".{newest.name}.crc").unlink(missing_ok=True)
    produce_events(kafka_broker, topic, range(N, N + 10))
    again = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skipped (already committed)" in again.stderr
    ids = read_ids(lake / "events", fmt)
    print(f"crash-matrix point=lost_checkpoint_commit format={fmt} restarts=1 "
          f"produced={N + 10} lost={N + 10 - len(set(ids))} duplicated={len(ids) - len(set(ids))}")
    assert sorted(ids) == list(range(N + 10))


@pytest.mark.parametrize("point", ["after_manifest",
                                   full_only("after_delta_commit", id="after_delta_commit")])
def test_routed_crash_between_tables_then_restart(spark, kafka_broker, topic, tmp_path, point
                                                  ) -> None:
    """Two routes (Parquet first, Delta second) and unrouted records. The kill comes after
    the first table committed batch 1 (``after_manifest``) or after the second did
    (``after_delta_commit``, before the unrouted dead letters): the restart completes the
    batch in the tables that lack it, and each table holds every id once."""
    import duckdb

    names = {k: f"{topic}-{k}" for k in ("a", "b", "other")}
    for name in names.values():
        kafka_broker.create_topic(name, partitions=2)
    produce_events(kafka_broker, names["a"], range(N))
    produce_events(kafka_broker, names["b"], range(N, 2 * N))
    other = [(b"k", b"other %d" % i) for i in range(300)]
    produce(kafka_broker.bootstrap_servers, names["other"], other)
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake)
    data["table"].pop("name")
    data["source"]["kafka"].update(topics=list(names.values()), max_offsets_per_trigger=2000)
    data["routes"] = [{"topics": [names["a"]], "table": {"name": "a"}},
                      {"topics": [names["b"]], "table": {"name": "b", "format": "delta"}}]
    cfg = write_config(tmp_path / "c.yaml", data)
    kill_then_restart(cfg, point, restart_in=spark)
    a, b = read_ids(lake / "a", "parquet"), read_ids(lake / "b", "delta")
    unrouted = duckdb.sql(f"SELECT value FROM read_parquet('{lake}/_rejected/_unrouted/*.parquet')"
                          ).fetchall()
    print(f"crash-matrix point=routed-{point} restarts=1 produced={2 * N}+{len(other)} "
          f"a={len(a)}/{len(set(a))} b={len(b)}/{len(set(b))} unrouted={len(unrouted)}")
    assert sorted(a) == list(range(N))
    assert sorted(b) == list(range(N, 2 * N))
    assert sorted(bytes(r[0]) for r in unrouted) == sorted(v for _, v in other)


S3_CASES = [pytest.param("parquet", STORE_POINT, id="parquet-mid_publish"),
            full_only("parquet", "after_manifest", id="parquet-after_manifest"),
            full_only("delta", "after_staging", id="delta-after_staging"),
            full_only("delta", "after_delta_commit", id="delta-after_delta_commit")]


@pytest.mark.s3
@pytest.mark.parametrize(("fmt", "point"), S3_CASES)
def test_kill_on_s3_then_restart(kafka_broker, s3_server, topic, tmp_path, fmt, point) -> None:
    """The same kill-and-restart on a lake in S3 (SeaweedFS): table, checkpoint and
    dead letters all on S3, configured by the AWS/Quix variables."""
    from deltalake import DeltaTable

    from tests.fixtures.services import delta_rs_s3_options, duckdb_s3

    if fmt == "delta" and ENGINE == "spark":
        pytest.skip("the delta-rs commit and its staged files are the Arrow path's")
    produce_events(kafka_broker, topic, range(N))
    produce(kafka_broker.bootstrap_servers, topic, BAD)
    prefix = f"chaos-{topic}"
    data = config_dict(kafka_broker, topic, tmp_path / "unused", format=fmt)
    data["table"].pop("base_path")
    data["source"]["kafka"]["max_offsets_per_trigger"] = N // 3
    cfg = write_config(tmp_path / "c.yaml", data)
    env = {**s3_server.env(), "S3_BUCKET": s3_server.bucket, "S3_PREFIX": prefix}
    logs = kill_then_restart(cfg, point, env=env)
    assert s3_server.secret_key not in logs
    table = f"s3://lake/{prefix}/events"
    duck = duckdb_s3(s3_server)
    if fmt == "delta":
        delta = DeltaTable(table, storage_options=delta_rs_s3_options(s3_server))
        ids = delta.to_pyarrow_table(columns=["id"]).column("id").to_pylist()
        # the killed batch was committed by the Arrow path (delta-rs, conditional put)
        assert "1" in {str(h.get("lakesink.batch_id")) for h in delta.history()}
        # the killed attempt's files stay in the partition folders, in no log entry:
        # invisible to Delta readers, seen by a reader that globs the files (until VACUUM)
        in_log = {u.rsplit("/", 1)[1] for u in delta.file_uris()}
        found = {r[0].rsplit("/", 1)[1] for r in duck.sql(
            f"SELECT file FROM glob('{table}/**/*.parquet')").fetchall()
            if "/_delta_log/" not in r[0]}
        orphans = found - in_log
        print(f"s3 delta kill at {point}: {len(orphans)} file(s) of the killed attempt "
              "outside the log")
        assert bool(orphans) == (point == "after_staging")
    else:
        ids = [r[0] for r in duck.sql(f"SELECT id FROM read_parquet('{table}/**/*.parquet')"
                                      ).fetchall()]
    rejected = duck.sql(f"SELECT count(*) FROM read_parquet('s3://lake/{prefix}/_rejected/"
                        "events/*.parquet')").fetchone()
    print(f"crash-matrix backend=s3 point={point} format={fmt} restarts=1 produced={N} "
          f"lost={N - len(set(ids))} duplicated={len(ids) - len(set(ids))}")
    assert sorted(ids) == list(range(N))
    assert rejected is not None and rejected[0] == len(BAD)


AZURE_CASES = [pytest.param("parquet", STORE_POINT, id="parquet-mid_publish"),
               full_only("delta", "after_delta_commit", id="delta-after_delta_commit")]


@pytest.mark.azure
@pytest.mark.parametrize(("fmt", "point"), AZURE_CASES)
def test_kill_on_azure_then_restart(kafka_broker, azure_server, topic, tmp_path, fmt,
                                    point) -> None:
    """The same kill-and-restart on a lake in Azure (Azurite): table, checkpoint and dead
    letters all there, the account key from the environment."""
    from tests.integration.test_azure import delta_rs_ids

    if fmt == "delta" and ENGINE == "spark":
        pytest.skip("the delta-rs commit is the Arrow path's")
    produce_events(kafka_broker, topic, range(N))
    produce(kafka_broker.bootstrap_servers, topic, BAD)
    base = azure_server.base(f"chaos-{topic}")
    data = config_dict(kafka_broker, topic, tmp_path / "unused", format=fmt)
    data["table"]["base_path"] = base
    data["storage"] = {"azure": azure_server.storage()}
    data["source"]["kafka"]["max_offsets_per_trigger"] = N // 3
    cfg = write_config(tmp_path / "c.yaml", data)
    logs = kill_then_restart(cfg, point, env=azure_server.env())
    assert azure_server.key not in logs
    duck = azure_server.duckdb()
    az = f"az://{azure_server.container}/chaos-{topic}"
    if fmt == "delta":
        ids, delta = delta_rs_ids(azure_server, f"{base}/events")
        assert "1" in {str(h.get("lakesink.batch_id")) for h in delta.history()}
    else:
        ids = [r[0] for r in duck.sql(f"SELECT id FROM read_parquet('{az}/events/**/*.parquet')"
                                      ).fetchall()]
    rejected = duck.sql(f"SELECT count(*) FROM read_parquet('{az}/_rejected/events/*.parquet')"
                        ).fetchone()
    print(f"crash-matrix backend=azure point={point} format={fmt} restarts=1 produced={N} "
          f"lost={N - len(set(ids))} duplicated={len(ids) - len(set(ids))}")
    assert sorted(ids) == list(range(N))
    assert rejected is not None and rejected[0] == len(BAD)


HDFS_CASES = [full_only("parquet", "mid_publish", id="parquet-mid_publish"),
              full_only("delta", "after_delta_commit", id="delta-after_delta_commit")]


@pytest.mark.hdfs
@pytest.mark.parametrize(("fmt", "point"), HDFS_CASES)
def test_kill_on_hdfs_then_restart(kafka_broker, hdfs, topic, tmp_path, fmt, point) -> None:
    """Kill and restart with the lake (and the checkpoint) on HDFS."""
    from tests.fixtures.services import HDFS_CLIENT_CONF
    from tests.integration.test_hdfs import hdfs_parquet_ids

    produce_events(kafka_broker, topic, range(N))
    produce(kafka_broker.bootstrap_servers, topic, BAD)
    base = f"{hdfs.uri}/chaos-{topic}"
    data = config_dict(kafka_broker, topic, tmp_path, format=fmt)
    data["table"]["base_path"] = base
    data["source"]["kafka"]["max_offsets_per_trigger"] = N // 3
    data["spark"]["conf"] = HDFS_CLIENT_CONF
    cfg = write_config(tmp_path / "c.yaml", data)
    kill_then_restart(cfg, point)
    table = f"{base}/events"
    if fmt == "delta":
        from deltalake import DeltaTable

        ids = DeltaTable(table).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    else:
        ids = hdfs_parquet_ids(hdfs, table.split(hdfs.uri)[1], tmp_path / "fetched")
    import duckdb

    rejected_files = [hdfs.download(f, tmp_path / "rejected" / f.rsplit("/", 1)[1])
                      for f in hdfs.list_files(f"/chaos-{topic}/_rejected/events")
                      if f.endswith(".parquet")]
    rejected = duckdb.sql(f"SELECT count(*) FROM read_parquet("
                          f"{[str(p) for p in rejected_files]})").fetchone()[0]
    print(f"crash-matrix backend=hdfs point={point} format={fmt} restarts=1 produced={N} "
          f"lost={N - len(set(ids))} duplicated={len(ids) - len(set(ids))}")
    assert sorted(ids) == list(range(N))
    assert rejected == len(BAD), "rejected records lost or duplicated"


def test_kill_after_a_delta_rs_commit_then_restart(spark, kafka_broker, topic, tmp_path
                                                   ) -> None:
    """The Arrow path's Delta commit (delta-rs) of batch 2 is durable, then the process
    is killed; delta-rs has written checkpoints (every 2 commits). The restart reads the
    batch's txn back (delta-rs' view of the log, checkpoint included) and skips it: every
    id once as delta-rs and Spark read the table, the dead letters once, and no staged
    rows left behind."""
    import duckdb

    produce_events(kafka_broker, topic, range(N))
    produce(kafka_broker.bootstrap_servers, topic, BAD)
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format="delta", delta_checkpoint_interval=2)
    data["source"]["kafka"]["max_offsets_per_trigger"] = N // 3
    logs = kill_then_restart(write_config(tmp_path / "c.yaml", data), DELTA_RS_POINT,
                             batch=2, restart_in=spark)
    assert "batch 2: skipped (already committed)" in logs
    log = lake / "events" / "_delta_log"
    infos = [json.loads(line).get("commitInfo") or {} for entry in sorted(log.glob("*.json"))
             for line in entry.read_text().splitlines()]
    by_delta_rs = [i["lakesink.batch_id"] for i in infos if "lakesink.batch_id" in i]
    assert by_delta_rs == [0, 1, 2, 3], by_delta_rs  # every batch took the Arrow path
    assert list(log.glob("*.checkpoint.parquet")), "delta-rs wrote no checkpoint"
    ids = read_ids(lake / "events", "delta")
    by_spark = [r.id for r in spark.read.format("delta").load(str(lake / "events"))
                .select("id").collect()]
    rejected = duckdb.sql(f"SELECT count(*) FROM read_parquet('{lake}/_rejected/events/"
                          "*.parquet')").fetchone()
    print(f"crash-matrix point=after_delta_commit(delta-rs) format=delta restarts=1 "
          f"produced={N} lost={N - len(set(ids))} duplicated={len(ids) - len(set(ids))}")
    assert sorted(ids) == sorted(by_spark) == list(range(N))
    assert rejected is not None and rejected[0] == len(BAD)
    # batch 2's rows staged for the merge (Arrow IPC, outside the table) went with the
    # restart's skip of the committed batch: a kill there leaves disk, never for good
    staged = list((lake / ".lakesink" / "events" / "staging").rglob("*.arrow"))
    assert not staged, staged


def test_kill_while_a_registry_schema_evolves_then_restart(spark, kafka_broker, topic,
                                                           tmp_path, schema_registry) -> None:
    """Avro through a real schema registry: batch 1 brings a newer writer schema (a new
    field, a widened one); the process is killed right after the evolved schema is stored,
    before the batch commits. The restart looks the ids up again and writes every record
    once, with the evolved columns."""
    from tests.integration.test_schema_registry import V1, V2, _serializer, _v1, _v2, _value

    s1, s2 = _serializer(schema_registry.url, V1), _serializer(schema_registry.url, V2)
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", _value(s1, topic, _v1(i))) for i in range(N // 2)]
            + [(b"k", b"\x00\x00\x0f\x42\x3f" + b"x") for _ in range(3)]  # an unknown id
            + [(b"k", _value(s2, topic, _v2(i))) for i in range(N // 2, N)])
    lake = tmp_path / "lake"
    schema_file = tmp_path / "v1.avsc"
    schema_file.write_text(json.dumps(V1))
    data = config_dict(kafka_broker, topic, lake, partition_by=["location"],
                       timestamp_column=None)
    data["decode"] = {"format": "avro", "avro": {"schema_file": str(schema_file),
                                                 "registry": {"url": schema_registry.url}}}
    data["source"]["kafka"]["max_offsets_per_trigger"] = N // 3
    kill_then_restart(write_config(tmp_path / "c.yaml", data), REGISTRY_POINT,
                      restart_in=spark)
    import duckdb

    rows = duckdb.sql(f"SELECT id, amount, note FROM read_parquet('{lake}/events/**/*.parquet',"
                      " hive_partitioning=true, union_by_name=true)").fetchall()
    ids = [r[0] for r in rows]
    reasons = duckdb.sql(f"SELECT reason FROM read_parquet('{lake}/_rejected/events/*.parquet')"
                         ).fetchall()
    print(f"crash-matrix point=after_schema_evolved registry=apicurio produced={N} "
          f"lost={N - len(set(ids))} duplicated={len(ids) - len(set(ids))} "
          f"rejected={len(reasons)}/3")
    assert sorted(ids) == list(range(N))
    assert reasons == [("unknown_schema_id",)] * 3
    for id_, amount, note in rows:
        want = _v1(id_) if id_ < N // 2 else _v2(id_)
        assert (amount, note) == (want["amount"], want.get("note"))


def test_kill_after_a_capped_schema_evolution_then_restart(spark, kafka_broker, topic,
                                                           tmp_path) -> None:
    """known-open T8: a kill right after a schema evolution that ``table.max_columns``
    capped (3 new fields, room for 2). The redo finds the stored schema full and must
    reach the first attempt's outcome: the same two columns, the same records written
    and the same dead letters (``too_many_fields``), each once."""
    from tests.fixtures.services import duckdb_ids
    from tests.integration.test_evolution import NARROW_SCHEMA, event, rejected, table_rows

    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, partition_by=[], max_columns=7)
    data["decode"] = {"schema": NARROW_SCHEMA}  # 5 fields: room for 2
    produce(kafka_broker.bootstrap_servers, topic,
            [event(0), event(1, a_new=1), event(2, b_new=2, c_new=3), event(3)])
    kill_then_restart(write_config(tmp_path / "c.yaml", data), "after_schema_evolved",
                      batch=0, restart_in=spark)
    rows = table_rows(lake / "events", "parquet", ["a_new", "b_new"])
    dead = rejected(lake)
    print(f"crash-matrix point=after_schema_evolved max_columns=7 written={sorted(rows)} "
          f"rejected={[(r, json.loads(v)['id']) for r, _, v in dead]}")
    assert sorted(rows) == [0, 1, 3] and rows[1]["a_new"] == 1
    assert [(r, json.loads(v)["id"]) for r, _, v in dead] == [("too_many_fields", 2)]
    assert len(duckdb_ids(lake / "events")) == 3
