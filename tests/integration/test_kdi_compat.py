"""``lakesink kdi``: kafka-delta-ingest's command lines, into Delta tables read back by
delta-rs. The README's command line and the take-over run as users run them (a separate
process: exit codes, refusals); the fork's repair, message-type tables and secured
setups run the same configuration in this process."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lakesink.local.services import produce
from tests.fixtures.services import driver_java_options, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

#: the upstream README's transforms, as-is
README_TRANSFORMS = ["date: substr(meta.producer.timestamp, `0`, `10`)",
                     "meta.kafka.offset: kafka.offset", "meta.kafka.partition: kafka.partition",
                     "meta.kafka.topic: kafka.topic"]


def jvm_env() -> dict[str, str]:
    """The tests' JVM options for a command line's run (speed only), as a user's spark
    settings reach it: the environment (the command line has no config file)."""
    return {"LAKESINK_SPARK__CONF": json.dumps(driver_java_options())}


def run_in_process(spark: Any, *argv: str, env: dict[str, str] | None = None) -> Any:  # noqa: ANN401
    """``lakesink kdi <argv>`` in this process (the shared SparkSession): the same
    config the command runs, where the process boundary is not what is tested."""
    from lakesink.app import Pipeline
    from lakesink.kdi import ingest_config

    cfg, _ = ingest_config(list(argv), env or {})
    return Pipeline.build(cfg, spark).run(until_caught_up=True)


def test_the_readme_command_line_runs_as_is(kafka_broker, topic, tmp_path) -> None:
    from deltalake import DeltaTable

    n = 300
    produce(kafka_broker.bootstrap_servers, topic, [
        (f"k{i}".encode(), json.dumps({"id": i, "meta": {"producer": {
            "timestamp": f"2026-11-{1 + i % 28:02d}T08:00:00Z"}}}).encode())
        for i in range(n)])
    table = tmp_path / "lake" / "web_requests"
    result = run_cli("kdi", "ingest", topic, str(table), "-l", "60",
                     "-K", "auto.offset.reset=earliest", "-t", *README_TRANSFORMS,
                     "-k", kafka_broker.bootstrap_servers, "-e",
                     "--num_arrow_writer_threads", "4", env=jvm_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--num_arrow_writer_threads" in result.stderr  # reported as ignored
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    print(f"kdi readme: {len(rows)} rows, e.g. {rows[0]}")
    assert sorted(r["id"] for r in rows) == list(range(n))
    by_id = {r["id"]: r for r in rows}
    assert by_id[3]["date"] == "2026-11-04"
    assert by_id[3]["meta"]["kafka"]["topic"] == topic
    assert len({(r["meta"]["kafka"]["partition"], r["meta"]["kafka"]["offset"])
                for r in rows}) == n


def test_taking_over_a_table_kafka_delta_ingest_wrote(spark, kafka_broker, tmp_path) -> None:
    """kafka-delta-ingest (app id ``kdi``) wrote offsets 0-29 of partition 0 and nothing
    of partition 1, its position in ``txn`` ``kdi-0`` = 29: lakesink starts after it, so
    the table ends with every record once. Refused first: without the old ``-a`` (the
    table has files and no ``txn`` of the default app id), and while a consumer is still
    in kafka-delta-ingest's group (it still runs). ``--print-config`` prints the config
    the command runs, take-over included; that config with ``earliest`` instead (what
    the printed file said before) is refused by ``lakesink run``, and so is the printed
    file once kafka-delta-ingest has written past its start."""
    import pyarrow as pa
    from confluent_kafka import Consumer, Producer
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    topic = f"kdi-takeover-{tmp_path.name}"[:80]
    kafka_broker.create_topic(topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for i in range(100):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=0 if i < 60 else 1)
    assert producer.flush(30) == 0
    table = tmp_path / "lake" / topic  # the fork's <table_base_uri>/<type>: the topic
    write_deltalake(str(table), pa.table({"id": pa.array(range(30), pa.int64())}),
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id="kdi-0", version=29)]))
    flags = ["kdi", "ingest", "--topic", topic, "--table_base_uri", str(table.parent),
             "-k", kafka_broker.bootstrap_servers, "-g", f"g-{topic}", "-e", "-l", "1"]
    no_app_id = run_cli(*flags, env=jvm_env())  # the old deployment's -a forgotten: txn kafka_delta_ingest-*
    assert no_app_id.returncode == 2, no_app_id.stderr[-3000:]
    assert "-a: the table has 1 file(s) but no kafka-delta-ingest offsets" in no_app_id.stderr
    still_running = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers,
                              "group.id": f"g-{topic}", "client.id": "old-kdi",
                              "enable.auto.commit": False})
    still_running.subscribe([topic])
    while not still_running.assignment():  # a member of the group, as kdi is while it runs
        still_running.poll(0.5)
    refused = run_cli(*flags, "-a", "kdi", env=jvm_env())
    still_running.close()  # leaves the group
    print(f"kdi take-over refusals: {no_app_id.stderr.strip().splitlines()[-1]!r}; "
          f"{refused.stderr.strip().splitlines()[-1]!r}")
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert f"has 1 active member(s) reading {topic} (old-kdi on" in refused.stderr
    printed = run_cli(*flags, "-a", "kdi", "--print-config")
    assert printed.returncode == 0, printed.stderr[-3000:]
    (tmp_path / "kdi.yaml").write_text(printed.stdout)
    from lakesink.app import Pipeline
    from lakesink.config import load_config
    from lakesink.kdi import ingest_config
    from lakesink.errors import ConfigError

    file_cfg = load_config(tmp_path / "kdi.yaml")
    runs, _ = ingest_config([*flags[1:], "-a", "kdi"], {})
    assert file_cfg.source.kafka.starting_offsets == json.dumps({topic: {"0": 30, "1": -2}})
    assert file_cfg.model_dump() == runs.model_dump()  # the file runs the same as kdi
    plain = load_config(tmp_path / "kdi.yaml",
                        overrides=["source.kafka.starting_offsets=earliest"])
    with pytest.raises(ConfigError) as duplicates:  # a new checkpoint from earliest
        Pipeline.build(plain, spark).processor.close()
    print(f"kdi printed config with earliest: {duplicates.value}")
    assert duplicates.value.key == "source.kafka.starting_offsets"
    assert "other writers' positions (txn kdi-0=29)" in str(duplicates.value)
    # kafka-delta-ingest ran again after the print (offsets 30-49, txn kdi-0 = 49): the
    # printed start (30) is stale, and the file is refused instead of writing 30-49 twice
    write_deltalake(str(table), pa.table({"id": pa.array(range(30, 50), pa.int64())}),
                    mode="append", commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id="kdi-0", version=49)]))
    with pytest.raises(ConfigError) as stale:
        Pipeline.build(file_cfg, spark).processor.close()
    assert "partition 0 would start at 30, but the table holds offsets up to 49" in str(
        stale.value)
    result = run_cli(*flags, "-a", "kdi", env=jvm_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "taking over from kafka-delta-ingest's offsets" in result.stderr
    ids = DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    print(f"kdi take-over: txn kdi-0=29; table {len(ids)} rows, "
          f"{len(ids) - len(set(ids))} twice")
    assert sorted(ids) == list(range(100))


def test_the_forks_repair_command_runs_as_is(spark, tmp_path) -> None:
    """The fork's ``repair`` (``TABLE_URL`` from the environment, as its Helm charts set
    it), what ``lakesink kdi repair`` runs, in this process: a file an S3 lifecycle rule
    purged leaves the log, then only the partition named is compacted. delta-rs reads
    every remaining row once."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    table = tmp_path / "lake" / "events"
    for i in range(6):  # six small commits, two partitions
        write_deltalake(str(table), pa.table({"id": list(range(i * 10, i * 10 + 10)),
                                              "p": ["a" if i % 2 == 0 else "b"] * 10}),
                        mode="append", partition_by=["p"])
    before = DeltaTable(str(table))
    purged = next(u for u in before.file_uris() if "/p=b/" in u)
    lost = set(pq.read_table(purged.removeprefix("file://")).column("id").to_pylist())
    (table / purged.split("/events/", 1)[1]).unlink()
    from lakesink import maintenance
    from lakesink.config import load_config
    from lakesink.config.plan import TableSpec
    from lakesink.compat.kdi import parse_repair, repair_flags

    args = parse_repair(["repair", "--optimize_partition", "p",
                         "--optimize_partition_predicate", "a"], {"TABLE_URL": str(table)})
    cfg = load_config(flags=repair_flags(args), env={}, compat="off")
    fsck = maintenance.repair(TableSpec(cfg), spark, apply=True)  # what `lakesink kdi repair` runs
    optimize = maintenance.compact(TableSpec(cfg), spark, partition=args.partition,
                                   target_file_size=args.optimize_target_size)
    after = DeltaTable(str(table))
    files = after.file_uris()
    ids = after.to_pyarrow_table().column("id").to_pylist()
    print(f"kdi repair: {len(before.file_uris())} files before, one purged; after: "
          f"{sum('/p=a/' in f for f in files)} in p=a, {sum('/p=b/' in f for f in files)} "
          f"in p=b; rows {len(ids)} (lost with the purged file: {len(lost)})")
    assert purged not in files
    assert sum("/p=a/" in f for f in files) == 1  # compacted
    assert sum("/p=b/" in f for f in files) == 2  # not named: left as is
    assert sorted(ids) == sorted(set(range(60)) - lost)
    assert fsck["operation"] == "FSCK" and fsck["missing"] and fsck["applied"]
    assert optimize["operation"] == "OPTIMIZE WHERE `p` = 'a'"


def test_the_forks_message_type_tables_by_avro_record_name(spark, kafka_broker, topic,
                                                           schema_registry, tmp_path) -> None:
    """The fork's ``--table_base_uri`` with ``--avro <registry>``: a Delta table per
    record name (without its namespace, as the fork names them), the whitelist a regex
    search. A type it leaves out is kept as an unrouted dead letter (the fork drops it
    silently)."""
    from deltalake import DeltaTable

    from tests.integration.test_routing import _unrouted
    from tests.integration.test_schema_registry import produce_two_record_types

    produce_two_record_types(kafka_broker, topic, schema_registry.url)
    base = tmp_path / "lake"
    run_in_process(spark, "ingest", "--topic", topic, "--table_base_uri", str(base),
                   "--avro", schema_registry.url, "--message_type_whitelist", "ead",
                   "-k", kafka_broker.bootstrap_servers, "-e", "-l", "1")
    ids = DeltaTable(str(base / "Reading")).to_pyarrow_table(columns=["id"]).column(
        "id").to_pylist()
    unrouted = _unrouted(base)
    print(f"kdi message types: tables {sorted(p.name for p in base.iterdir())}; Reading "
          f"{len(ids)} rows; unrouted {len(unrouted)}, e.g. {unrouted[0][3]!r}")
    assert sorted(ids) == [i for i in range(30) if i % 3]
    assert not (base / "Alert").exists() and len(unrouted) == 10
    assert "not allowed" in unrouted[0][3]


@pytest.mark.parametrize("listener", ["sasl_ssl", "mtls"])
def test_its_tls_and_scram_variables_reach_a_secured_broker(spark, kafka_broker, topic,
                                                            tmp_path, listener) -> None:
    """kafka-delta-ingest's own secured setup, as its deployments give it: the CA, the
    client certificate and key as PEM text in KAFKA_DELTA_INGEST_CA / _CERT / _KEY, the
    SCRAM user in KAFKA_DELTA_INGEST_SCRAM_JSON, librdkafka's names in -K. The topic has
    ACLs (only alice and the certificate's user may read). In this process: the
    planted-secrets test checks a separate process's output for secrets."""
    from deltalake import DeltaTable

    from tests.fixtures.services import produce_events

    sec = kafka_broker.security
    kafka_broker.grant(topic, "User:alice", "READ", "DESCRIBE")
    kafka_broker.grant(topic, "User:lakesink-client", "READ", "DESCRIBE")
    produce_events(kafka_broker, topic, range(50))
    env = {"KAFKA_DELTA_INGEST_CA": sec.ca_pem.read_text()}
    if listener == "sasl_ssl":
        servers, protocol = kafka_broker.sasl_bootstrap_servers, "SASL_SSL"
        env["KAFKA_DELTA_INGEST_SCRAM_JSON"] = json.dumps(
            {"username": "alice", "password": sec.users["alice"]})
        extra = ["-K", "sasl.mechanisms=SCRAM-SHA-512"]
    else:
        servers, protocol = kafka_broker.tls_bootstrap_servers, "SSL"
        env["KAFKA_DELTA_INGEST_CERT"] = (sec.folder / "client.pem").read_text()
        env["KAFKA_DELTA_INGEST_KEY"] = (sec.folder / "client.key").read_text()
        extra = []
    table = tmp_path / "lake" / "events"
    stats = run_in_process(spark, "ingest", topic, str(table), "-k", servers, "-e", "-l",
                           "1", "-K", f"security.protocol={protocol}", *extra, env=env)
    ids = DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    print(f"kdi over {listener}: {len(ids)} rows read back")
    assert sorted(ids) == list(range(50)) and stats.written == 50
