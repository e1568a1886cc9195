"""kafka-delta-ingest's `ingest` command line as lakesink's config (no Spark)."""

from __future__ import annotations

import json

import pytest

from lakesink.config import load_config
from lakesink.compat.kdi import parse, takeover_offsets, translate
from lakesink.errors import ConfigError

#: the upstream README's command line (the table local here)
README = ["ingest", "web_requests", "/data/lake/web_requests", "-l", "60",
          "-K", "auto.offset.reset=earliest",
          "-t", "date: substr(meta.producer.timestamp, `0`, `10`)",
          "meta.kafka.offset: kafka.offset", "meta.kafka.partition: kafka.partition",
          "meta.kafka.topic: kafka.topic"]


def config(argv: list[str], env: dict[str, str] | None = None):  # noqa: ANN201
    args, _ = parse(argv, env or {})
    flags, notes = translate(args)
    return load_config(flags=flags, env={}), args, notes


def test_the_upstream_readme_command_line() -> None:
    cfg, args, notes = config(README)
    assert cfg.source.kafka.topics == ["web_requests"]
    assert cfg.source.kafka.bootstrap_servers == "localhost:9092"  # -k default
    assert cfg.source.kafka.group_id == "kafka_delta_ingest"
    assert cfg.source.kafka.starting_offsets == "earliest"  # from -K auto.offset.reset
    assert (cfg.table.format, cfg.table.base_path, cfg.table.name) == (
        "delta", "/data/lake", "web_requests")
    assert cfg.trigger.interval == "60 seconds"
    assert len(cfg.table.transforms) == 4 and args.app_id == "kafka_delta_ingest"
    assert notes == []


def test_the_forks_flags_and_environment_fallbacks() -> None:
    env = {"KAFKA_TOPIC": "t", "TABLE_BASE_URI": "s3://bucket/path/tbl",
           "KAFKA_BROKERS": "b1:9092,b2:9092", "APP_ID": "ingest-1", "ALLOWED_LATENCY": "5",
           "MAX_MESSAGES_PER_BATCH": "5000", "PARTITION_COLUMNS": "date, region",
           "PROMETHEUS_PORT": "9108", "NUM_ARROW_WRITER_THREADS": "8"}
    cfg, args, notes = config(["ingest", "-e", "-c", "--seek_offsets", '{"0": 9, "1": 4}',
                               "-K", "security.protocol=SSL", "--dlq_table_location", "x"],
                              env)
    k = cfg.source.kafka
    assert (k.topics, k.bootstrap_servers, k.max_offsets_per_trigger) == (
        ["t"], "b1:9092,b2:9092", None)  # -m sizes kdi's buffers: no per-trigger cap
    assert k.starting_offsets == "earliest"  # the seek applies with the partitions at start
    assert k.options["security.protocol"] == "SSL"
    # the fork's base: a folder of tables, one per message type (JSON: the topic)
    assert (cfg.table.base_path, cfg.table.name, cfg.table.partition_by) == (
        "s3://bucket/path/tbl", "t", ["date", "region"])
    assert cfg.trigger.until_caught_up and cfg.metrics.port == 9108
    assert cfg.table.delta_checkpoint_interval == 10 and cfg.dlq.format == "delta"
    assert args.app_id == "ingest-1"
    assert any(n.startswith("--num_arrow_writer_threads") for n in notes)
    assert any(n.startswith("--max_messages_per_batch") for n in notes)
    assert any(n.startswith("--dlq_table_location") for n in notes)


def test_boolean_variables_read_as_clap_reads_them() -> None:
    off = {"TURN_OFF_AT_KAFKA_TOPIC_END": "false", "WRITE_CHECKPOINTS": "0"}
    cfg, _, _ = config(["ingest", "t", "/x/t"], off)
    assert not cfg.trigger.until_caught_up
    assert cfg.table.delta_checkpoint_interval != 10
    cfg, _, _ = config(["ingest", "t", "/x/t"], {"TURN_OFF_AT_KAFKA_TOPIC_END": "true"})
    assert cfg.trigger.until_caught_up


def test_flags_between_the_positionals_and_o_over_k() -> None:
    cfg, _, _ = config(["ingest", "t", "-l", "7", "/x/t", "-o", "latest",
                        "-K", "auto.offset.reset=earliest"])
    assert (cfg.table.name, cfg.trigger.interval) == ("t", "7 seconds")
    assert cfg.source.kafka.starting_offsets == "latest"  # -o decides, as in kdi


def test_a_bad_number_in_the_environment_is_named() -> None:
    with pytest.raises(ConfigError) as refused:
        config(["ingest", "t", "/x/t"], {"ALLOWED_LATENCY": "soon"})
    assert refused.value.key == "ALLOWED_LATENCY"


def test_avro_with_a_registry() -> None:
    cfg, _, _ = config(["ingest", "t", "/x/t", "--avro", "http://registry:8081"])
    assert cfg.decode.format == "avro"
    assert cfg.decode.avro.registry.url == "http://registry:8081"


@pytest.mark.parametrize(("argv", "key"), [
    (["ingest"], "topic"),
    (["ingest", "t"], "table_location"),
    (["ingest", "t", "/x/t", "--message_type_whitelist", "a"], "--message_type_whitelist"),
    (["ingest", "t", "/x/t", "--json", "http://r"], "--json"),
    (["ingest", "t", "/x/t", "--seek_offsets", "nope"], "--seek_offsets"),
    (["ingest", "t", "/x/t", "-o", "middle"], "--auto_offset_reset"),
    (["ingest", "t", "/x/t", "--bogus"], "kdi ingest"),
    (["serve"], "kdi"),
])
def test_a_bad_command_line_is_named(argv: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        config(argv)
    assert refused.value.key == key


def test_takeover_starts_after_each_partitions_txn_version() -> None:
    start = takeover_offsets({0: 29, 1: None, 2: None}, topic="t", seek={"2": 7},
                             reset="latest")
    assert json.loads(start) == {"t": {"0": 30, "1": -1, "2": 8}}
    assert takeover_offsets({0: None, 1: None}, topic="t", seek={}, reset="earliest") is None
    # a seek for some partitions only: every partition named (Spark wants them all)
    start = takeover_offsets({0: None, 1: None}, topic="t", seek={"1": 4}, reset="earliest")
    assert json.loads(start) == {"t": {"0": -2, "1": 5}}


def test_the_forks_repair_flags_and_variables() -> None:
    from lakesink.compat.kdi import parse_repair, repair_flags

    a = parse_repair(["repair", "--table_url", "s3://b/lake/web", "--optimize_target_size",
                      "5000000", "--optimize_partition", "date",
                      "--optimize_partition_predicate", "2026-11-01"], {})
    assert (a.table_url, a.optimize_target_size, a.partition, a.partial_filter) == (
        "s3://b/lake/web", 5_000_000, ("date", "2026-11-01"), None)
    assert repair_flags(a)["table.base_path"] == "s3://b/lake"
    env = parse_repair(["repair"], {"TABLE_URL": "/data/t", "OPTIMIZE_PARTITION": "date"})
    assert (env.optimize_target_size, env.partition, env.partial_filter) == (
        100_000_000, None, "--optimize_partition")  # the fork optimizes the whole table
    with pytest.raises(ConfigError) as missing:
        parse_repair(["repair"], {})
    assert missing.value.key == "--table_url"
    with pytest.raises(ConfigError) as bad:
        parse_repair(["repair", "--table_url", "/t"], {"OPTIMIZE_TARGET_SIZE": "big"})
    assert bad.value.key == "OPTIMIZE_TARGET_SIZE"


def test_a_table_with_files_and_no_txn_of_the_app_id_is_refused() -> None:
    from lakesink.compat.kdi import refuse_unknown_app_id

    with pytest.raises(ConfigError) as refused:
        refuse_unknown_app_id({0: None, 1: None}, 3, app_id="kafka_delta_ingest", seek={})
    assert refused.value.key == "-a" and "--no_takeover" in str(refused.value)
    refuse_unknown_app_id({0: None}, 0, app_id="a", seek={})  # no table yet: nothing to skip
    refuse_unknown_app_id({0: None}, 3, app_id="a", seek={"0": 5})  # told where to start
    refuse_unknown_app_id({0: 29, 1: None}, 3, app_id="a", seek={})  # its offsets found


def test_its_security_variables_and_librdkafka_names() -> None:
    from lakesink.compat.kdi import secret_env

    env = {"KAFKA_DELTA_INGEST_CA": "CA-PEM", "KAFKA_DELTA_INGEST_CERT": "CERT-PEM",
           "KAFKA_DELTA_INGEST_KEY": "KEY-PEM",
           "KAFKA_DELTA_INGEST_SCRAM_JSON": '{"username": "u", "password": "pw-9"}'}
    a, _ = parse(["ingest", "t", "/data/t", "-K", "security.protocol=SASL_SSL",
                  "sasl.mechanisms=scram-sha-256", "ssl.endpoint.identification.algorithm=none"],
                 env)
    flags, _ = translate(a)
    assert flags["source.kafka.sasl.username"] == "u"
    assert flags["source.kafka.sasl.mechanism"] == "SCRAM-SHA-256"
    assert flags["source.kafka.options"] == {
        "security.protocol": "SASL_SSL", "ssl.endpoint.identification.algorithm": "",
        "ssl.truststore.type": "PEM", "ssl.truststore.certificates": "CA-PEM",
        "ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "CERT-PEM"}
    assert "pw-9" not in json.dumps(flags) and "KEY-PEM" not in json.dumps(flags)
    assert secret_env(a, {"LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS":
                          '{"ssl.key.password": "kp"}'}) == {"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": "pw-9",
                             "LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS":
                             '{"ssl.key.password": "kp", "ssl.keystore.key": "KEY-PEM"}'}
    with pytest.raises(ConfigError) as bad:
        parse(["ingest", "t", "/d/t"], {"KAFKA_DELTA_INGEST_SCRAM_JSON": "{}"})
    assert bad.value.key == "KAFKA_DELTA_INGEST_SCRAM_JSON"


def test_the_forks_whitelist_searches_as_a_java_whole_match() -> None:
    from lakesink.compat.kdi import search_pattern

    assert search_pattern("ead") == ".*(?:ead).*"
    assert search_pattern("(?i)^read") == "(?i).*(?:^read).*"
    assert search_pattern("(?P<t>Alert)|Reading") == ".*(?:(?<t>Alert)|Reading).*"
    with pytest.raises(ConfigError):
        search_pattern("[[:upper:]]x")


def test_a_seek_behind_the_tables_offset_is_refused_as_kdi_does() -> None:
    with pytest.raises(ConfigError) as refused:
        takeover_offsets({0: 29}, topic="t", seek={"0": 40}, reset="earliest")
    assert refused.value.key == "--seek_offsets"


def test_librdkafka_only_settings_are_refused_with_what_to_do() -> None:
    a, _ = parse(["ingest", "t", "/d/t", "-K", "ssl.key.location=/k.pem"], {})
    with pytest.raises(ConfigError) as refused:
        translate(a)
    assert "KAFKA_DELTA_INGEST_KEY" in str(refused.value)


def test_a_take_over_after_lakesink_wrote_last_is_refused(tmp_path) -> None:  # noqa: ANN001
    """audit-2 #16: lakesink took over, wrote, then its checkpoint was lost; a new
    checkpoint took over again from kafka-delta-ingest's (old) txn offsets and wrote
    everything since a second time. The table's newest data commit is lakesink's (its
    commitInfo says so): refused. After kafka-delta-ingest wrote again, allowed."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from lakesink.kdi import lakesink_wrote_last, refuse_after_lakesink

    table = str(tmp_path / "lake" / "web")
    rows = pa.table({"id": [1]})
    write_deltalake(table, rows, commit_properties=CommitProperties(
        app_transactions=[Transaction("kdi-0", 9)]))  # kafka-delta-ingest's commit
    cfg = load_config(flags={"source.kafka.bootstrap_servers": "h:1",
                             "source.kafka.topics": ["web"], "table.format": "delta",
                             "table.name": "web", "table.base_path": str(tmp_path / "lake")},
                      env={})
    refuse_after_lakesink(cfg, "kdi")  # only kafka-delta-ingest wrote: a take-over is right
    write_deltalake(table, rows, mode="append", commit_properties=CommitProperties(
        custom_metadata={"lakesink.app_id": "ls1", "lakesink.batch_id": "0"}))
    with pytest.raises(ConfigError, match="newer than kafka-delta-ingest's") as refused:
        refuse_after_lakesink(cfg, "kdi")
    assert refused.value.key == "checkpoint"
    write_deltalake(table, rows, mode="append", commit_properties=CommitProperties(
        app_transactions=[Transaction("kdi-0", 10)]))  # kafka-delta-ingest back
    refuse_after_lakesink(cfg, "kdi")
    # a lakesink of before (its Spark path said nothing in commitInfo): its own txn
    write_deltalake(table, rows, mode="append", commit_properties=CommitProperties(
        app_transactions=[Transaction("3f2a9c1e-lakesink", 4)]))
    with pytest.raises(ConfigError, match="app id 3f2a9c1e-lakesink"):
        refuse_after_lakesink(cfg, "kdi")
    # the Spark path's commits say it in userMetadata; maintenance commits are passed over
    spark_commit = {"operation": "STREAMING UPDATE", "version": 7,
                    "userMetadata": json.dumps({"lakesink.app_id": "ls2",
                                                "lakesink.batch_id": 3})}
    assert lakesink_wrote_last([{"operation": "OPTIMIZE"}, spark_commit])["version"] == 7
    assert lakesink_wrote_last([{"operation": "WRITE"}, spark_commit]) is None


def test_a_restart_keeps_the_start_the_take_over_recorded(tmp_path) -> None:
    """A ``kdi ingest`` restart after its take-over started (Spark's source log) but
    before its first commit: the checkpoint's recorded start (the take-over's offsets)
    stays the config's; the flags' own ``earliest`` would be a changed start setting,
    refused at start."""
    from lakesink.config.plan import plan
    from lakesink.kdi import ingest_config
    from lakesink.tables.identity import IDENTITY_FILE

    argv = ["ingest", "--topic", "web", "--table_base_uri", str(tmp_path / "lake"), "-k",
            "127.0.0.1:1", "-g", "g", "-a", "kdi", "-e"]
    checkpoint = tmp_path / "lake" / ".lakesink" / "web" / "checkpoint"
    (checkpoint / "sources" / "0").mkdir(parents=True)
    (checkpoint / "sources" / "0" / "0").write_text("v1\n{}")
    took_over = json.dumps({"web": {"0": 30, "1": -2}})
    (checkpoint / IDENTITY_FILE).write_text(json.dumps({
        "app_id": "a" * 32, "start": {"source.kafka.starting_offsets": took_over}}))
    cfg, _ = ingest_config(argv, {})
    assert cfg.source.kafka.starting_offsets == took_over
    assert plan(cfg).checkpoint_uri().endswith("/lake/.lakesink/web/checkpoint")
