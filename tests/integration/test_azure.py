"""The lake on Azure: Azurite (the Azure Blob emulator, on 127.0.0.1; Azure itself cannot
run here) reached as ``abfs://container@account.dfs.core.windows.net/…``. Spark writes
and reads through hadoop-azure's ABFS (its Blob-endpoint client: Azurite serves no DFS
API), the Arrow path through pyarrow's AzureFileSystem and delta-rs. Read back by DuckDB
(its ``azure`` extension), delta-rs (its own query engine) and Spark."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest

from lakesink.local.services import produce
from tests.fixtures.runs import run_once
from tests.fixtures.services import ENGINE, config_dict, json_events

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark,
              pytest.mark.azure]

_prefix = itertools.count()


def run_azure(spark, data: dict[str, Any], server: Any) -> Any:  # noqa: ANN001, ANN401
    return run_once(spark, data, server.env())


def delta_rs_ids(server: Any, table: str) -> tuple[list[int], Any]:  # noqa: ANN401
    """The ids delta-rs reads (its own engine: no pyarrow dataset), and its handle."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(table, storage_options=server.delta_rs_options())
    rows = QueryBuilder().register("t", dt).execute("SELECT id FROM t").read_all()
    return pa.table(rows).column("id").to_pylist(), dt


@pytest.mark.parametrize(("fmt", "engine"), [
    pytest.param("parquet", "auto", id="parquet-arrow"),
    pytest.param("delta", "auto", id="delta-arrow"),
    pytest.param("delta", "spark", id="delta-spark"),
])
def test_azure_end_to_end(spark, kafka_broker, azure_server, topic, tmp_path, caplog, fmt,
                          engine) -> None:
    if engine == "auto" and ENGINE == "spark":
        pytest.skip("the Arrow path's case; LAKESINK_TEST_ENGINE=spark runs Spark's")
    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(300)) + [(b"k", b"not json")])
    base = azure_server.base(f"e2e-{next(_prefix)}-{fmt}-{engine}")
    data = config_dict(kafka_broker, topic, tmp_path, format=fmt, engine=engine)
    data["table"]["base_path"] = base
    data["storage"] = {"azure": azure_server.storage()}
    with caplog.at_level("INFO", logger="lakesink.pipeline.batch"):
        stats = run_azure(spark, data, azure_server)
    assert (stats.written, stats.rejected) == (300, 1)
    # the Spark path's choice is said only when the Arrow path was possible (engine auto)
    assert (f"{base}/events: Arrow data path" in caplog.text) == (engine == "auto")

    table = f"{base}/events"
    az = f"az://{azure_server.container}/{table.split('/', 3)[3]}"
    duck = azure_server.duckdb()
    spark_reader = spark.read.format("delta") if fmt == "delta" else spark.read
    if fmt == "delta":
        ids, dt = delta_rs_ids(azure_server, table)
        by_delta_rs = sum(int(h.get("lakesink.rows", 0)) for h in dt.history())
        # the Arrow path commits with delta-rs (conditional puts), Spark's with its log store
        assert by_delta_rs == (300 if engine == "auto" else 0)
    else:
        ids = [r[0] for r in duck.sql(
            f"SELECT id FROM read_parquet('{az}/**/*.parquet', hive_partitioning=true)"
        ).fetchall()]
    assert sorted(ids) == list(range(300))
    assert sorted(r[0] for r in spark_reader.load(table).select("id").collect()) == \
        list(range(300))
    bad = duck.sql(f"SELECT reason FROM read_parquet('{az.rsplit('/', 1)[0]}/_rejected/"
                   "events/*.parquet')").fetchall()
    assert bad == [("malformed_json",)]

    # a second run appends only what is new (the checkpoint is on Azure too)
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(300, 350)))
    assert run_azure(spark, data, azure_server).written == 50
    if fmt == "delta":
        ids, _ = delta_rs_ids(azure_server, table)
    else:
        ids = [r[0] for r in duck.sql(f"SELECT id FROM read_parquet('{az}/**/*.parquet')"
                                      ).fetchall()]
    assert sorted(ids) == list(range(350))

    # the commands that read without Spark read Azure too
    shown = _cli(azure_server, tmp_path, data, "status", "--json")
    (summary,) = json.loads(shown)
    assert (summary["rows"], summary["format"]) == (350, fmt), summary
    listed = [line for line in _cli(azure_server, tmp_path, data, "files").splitlines()
              if line.endswith(".parquet")]
    assert listed
    (letters,) = json.loads(_cli(azure_server, tmp_path, data, "dlq", "show", "--json"))
    assert letters["by_reason"] == {"malformed_json": 1}, letters
    assert letters["sample"][0]["value"] == "not json"
    repaired = json.loads(_cli(azure_server, tmp_path, data, "repair", "--json"))
    print(repaired)
    assert repaired
    if fmt == "parquet":  # a compaction's replaced files deleted without Spark
        (compacted,) = json.loads(_cli(azure_server, tmp_path, data, "compact", "--json",
                                       "--set", "maintenance.min_age_s=0"))
        assert compacted["files_merged"] > 0, compacted
        (vacuumed,) = json.loads(_cli(azure_server, tmp_path, data, "vacuum", "--force",
                                      "--json", spark_free=True))
        assert vacuumed["files_deleted"] == compacted["files_merged"], vacuumed
        import pyarrow.fs as pafs

        from lakesink.config.storage import AzureStorage, StorageConfig
        from lakesink.runtime.arrow_fs import ArrowFS
        from lakesink.tables.fs import azure_path

        lake = ArrowFS.open(StorageConfig(azure=AzureStorage(
            **azure_server.storage(), account_key=azure_server.key)), base)
        assert lake is not None
        replaced = azure_path(f"{base}/.lakesink/events/replaced")  # raw: markers too
        left = lake.fs.get_file_info(pafs.FileSelector(replaced, recursive=True,
                                                       allow_not_found=True))
        # hadoop-azure's folder markers (0-byte blobs named like a folder) went too
        assert [i.path for i in left if i.type == pafs.FileType.File] == [], left
        ids = [r[0] for r in duck.sql(f"SELECT id FROM read_parquet('{az}/**/*.parquet')"
                                      ).fetchall()]
        assert sorted(ids) == list(range(350))


def _cli(server: Any, tmp_path: Any, data: dict[str, Any], *args: str,  # noqa: ANN401
         spark_free: bool = False) -> str:
    """``lakesink <args> -c <data>`` in this process, the key from the environment;
    ``spark_free``: the command fails if it asks for a Spark session."""
    import contextlib
    from unittest import mock

    from typer.testing import CliRunner

    from lakesink.cli import app
    from tests.fixtures.services import write_config

    config = write_config(tmp_path / "azure.yaml", data)
    with mock.patch("lakesink.cli_tables.session_of", side_effect=AssertionError(
            "the command started Spark")) if spark_free else contextlib.nullcontext():
        result = CliRunner().invoke(app, [*args, "-c", str(config)], env=server.env())
    assert result.exit_code == 0, result.output
    return result.stdout  # logs (a Spark session's start) go to stderr


def test_write_once_on_azure_is_one_conditional_put(spark, azure_server) -> None:
    """lakesink's create-if-absent (the lease's and the manifests' primitive) on Azure:
    of writers racing for one name exactly one wins, and the file is never seen empty.
    (hadoop-azure's own ``create(overwrite=false)`` asks first, then PUTs: several win.)"""
    from lakesink.runtime.storage import azure_options
    from lakesink.config.storage import AzureStorage
    from lakesink.tables.fs import HadoopFS

    conf = spark.sparkContext._jsc.hadoopConfiguration()
    root = azure_server.base(f"once-{next(_prefix)}")
    for key, value in azure_options(AzureStorage(**azure_server.storage(), account_key=azure_server.key), [root]).items():
        conf.set(key, value)
    fs = HadoopFS(spark, root)
    assert fs.write_once(f"{root}/m/1.json", "first") is True
    assert fs.write_once(f"{root}/m/1.json", "second") is False
    assert fs.read_text(f"{root}/m/1.json") == "first"

    seen: list[str | None] = []
    for n in range(5):
        path = f"{root}/race/{n}.json"
        start, won, done = threading.Barrier(7), [], threading.Event()

        def writer(i: int, path: str = path, start: threading.Barrier = start) -> None:
            start.wait()
            if fs.write_once(path, f"writer {i}"):
                won.append(i)

        def reader(path: str = path, start: threading.Barrier = start,
                   done: threading.Event = done) -> None:
            start.wait()
            while not done.is_set():
                seen.append(fs.read_text(path))

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
        watcher = threading.Thread(target=reader)
        for t in [*threads, watcher]:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        assert len(won) == 1, f"race {n}: winners {won}"
        assert fs.read_text(path) == f"writer {won[0]}"
    assert "" not in seen, "a reader saw a file empty"
    assert any(seen), "the reader never overlapped a write"
    # a listing names each file once (hadoop-azure lists a file once per folder marker)
    fs.mkdirs(f"{root}/m/sub")
    fs.write_text(f"{root}/m/sub/2.json", "x")
    assert [f.relative for f in fs.list_files(f"{root}/m")] == ["1.json", "sub/2.json"]
