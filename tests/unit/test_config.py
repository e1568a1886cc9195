"""Config precedence, validation errors naming the key, and secrets handling (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lakesink.config import load_config, redacted_dict
from lakesink.errors import ConfigError

BASE = {"source": {"kafka": {"bootstrap_servers": "b:9092", "topics": ["events"]}}}


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "lakesink.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def with_table(**table: object) -> dict:
    return {**BASE, "table": table}


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE), env={})
    assert cfg.table.base_path == "./lake"
    assert cfg.table.name == "events"  # the single topic
    assert cfg.table.compression == "snappy"
    assert cfg.table.format == "parquet"
    assert cfg.source.kafka.fail_on_data_loss is True
    assert cfg.source.kafka.starting_offsets == "earliest"
    assert cfg.spark.master == "local[*]"
    assert cfg.table.schema_evolution == "add_columns"
    assert cfg.table.target_file_size == 128 * 1024 * 1024


@pytest.mark.parametrize(("table", "widening"), [
    ({}, True),
    ({"format": "delta"}, False),        # delta-rs cannot read Delta's typeWidening
    ({"schema_evolution": "strict"}, False),
    ({"format": "delta", "type_widening": True}, True),
])
def test_type_widening_default_depends_on_format_and_policy(
        tmp_path: Path, table: dict, widening: bool) -> None:
    cfg = load_config(write(tmp_path, with_table(**table)), env={})
    assert cfg.table.widening is widening


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, with_table(compression="gzip", base_path="/file"))
    assert load_config(path, env={}).table.compression == "gzip"
    env = {"LAKESINK_TABLE__COMPRESSION": "zstd"}
    cfg = load_config(path, env=env)
    assert cfg.table.compression == "zstd"
    assert cfg.table.base_path == "/file"  # untouched keys keep the file's value
    cfg = load_config(path, env=env, overrides=["table.compression=lz4"])
    assert cfg.table.compression == "lz4"
    cfg = load_config(path, env=env, overrides=["table.compression=lz4"],
                      flags={"table.compression": "none"})
    assert cfg.table.compression == "none"


def test_env_lists_and_maps(tmp_path: Path) -> None:
    env = {
        "LAKESINK_TABLE__PARTITION_BY": "location,year",
        "LAKESINK_SOURCE__KAFKA__TOPICS": '["a", "b"]',
        "LAKESINK_SOURCE__KAFKA__OPTIONS__SECURITY.PROTOCOL": "SSL",
        "LAKESINK_TABLE__NAME": "t",
    }
    cfg = load_config(write(tmp_path, BASE), env=env)
    assert cfg.table.partition_by == ["location", "year"]
    assert cfg.source.kafka.topics == ["a", "b"]
    assert cfg.source.kafka.options == {"security.protocol": "SSL"}


def test_set_understands_map_keys_with_dots(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE), env={}, overrides=[
        "spark.conf.spark.sql.shuffle.partitions=8",
        "source.kafka.options.ssl.endpoint.identification.algorithm=https",
        "table.partition_by=[a, b]",
        "source.kafka.max_offsets_per_trigger=5000",
    ])
    assert cfg.spark.conf == {"spark.sql.shuffle.partitions": "8"}
    assert cfg.source.kafka.options == {"ssl.endpoint.identification.algorithm": "https"}
    assert cfg.table.partition_by == ["a", "b"]
    assert cfg.source.kafka.max_offsets_per_trigger == 5000


@pytest.mark.parametrize(
    ("data", "overrides", "env", "key"),
    [
        (with_table(compresion="zstd"), [], {}, "table.compresion"),
        (with_table(compression="brotli"), [], {}, "table.compression"),
        (BASE, ["source.kafka.max_offsets_per_trigger=lots"], {},
         "source.kafka.max_offsets_per_trigger"),
        ({"source": {"kafka": {"topics": ["x"]}}}, [], {}, "source.kafka.bootstrap_servers"),
        (BASE, [], {"LAKESINK_TABEL__NAME": "x"}, "LAKESINK_TABEL__NAME"),
        (BASE, [], {"LAKESINK_TABLE__NAMEX": "x"}, "table.namex"),
        (BASE, ["source.kafka.starting_offsets=somewhere"], {}, "source.kafka.starting_offsets"),
        (BASE, ["trigger.interval=soon"], {}, "trigger.interval"),
        (with_table(partition_by=["a", "a"]), [], {}, "table.partition_by"),
        (with_table(partition_by=["a/b"]), [], {}, "table.partition_by"),
        (with_table(name="../escape"), [], {}, "table.name"),
        (BASE, ["spark.conf.shuffle=1"], {}, "spark.conf"),
        (with_table(unknown_fields="reject"), [], {}, "table.unknown_fields"),
        (with_table(schema_evolution="loose"), [], {}, "table.schema_evolution"),
        (with_table(target_file_size="10KB"), [], {}, "table.target_file_size"),
        (with_table(target_file_size="huge"), [], {}, "table.target_file_size"),
        ({"source": {"kafka": {"bootstrap_servers": "b:1", "topics": ["a", "b"]}}}, [], {},
         "table.name"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, data: dict, overrides: list[str],
                             env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, data), overrides=overrides, env=env)
    assert info.value.key == key, str(info.value)


@pytest.mark.parametrize(
    ("text", "spark_form"),
    [("10 seconds", "10 seconds"), ("500ms", "500 milliseconds"), ("1 MINUTE", "1 minutes"),
     ("2.5 s", "2.5 seconds"), ("1h", "1 hours")],
)
def test_trigger_interval_is_normalised_for_spark(tmp_path: Path, text: str,
                                                  spark_form: str) -> None:
    cfg = load_config(write(tmp_path, BASE), env={}, overrides=[f"trigger.interval={text}"])
    assert cfg.trigger.interval == spark_form


def test_exactly_one_subscription(tmp_path: Path) -> None:
    data = {"source": {"kafka": {"bootstrap_servers": "b:1", "topics": ["a"],
                                 "topic_pattern": "a.*"}}}
    with pytest.raises(ConfigError, match="exactly one of 'topics' or 'topic_pattern'"):
        load_config(write(tmp_path, data), env={})


def test_per_partition_starting_offsets(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE), env={},
                      overrides=['source.kafka.starting_offsets={"events": {"0": 5, "1": -2}}'])
    assert cfg.source.kafka.starting_offsets == '{"events": {"0": 5, "1": -2}}'


def test_secret_refused_in_file_and_cli(tmp_path: Path) -> None:
    data = {"source": {"kafka": {**BASE["source"]["kafka"],
                                 "sasl": {"username": "u", "password": "hunter2"}}}}
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, data), env={})
    assert info.value.key == "source.kafka.sasl.password"
    assert "LAKESINK_SOURCE__KAFKA__SASL__PASSWORD" in str(info.value)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError, match="secret"):
        load_config(write(tmp_path, BASE), env={},
                    overrides=["source.kafka.secret_options.sasl.jaas.config=x"])


def test_secret_from_env_and_file_is_redacted(tmp_path: Path) -> None:
    secret_file = tmp_path / "jaas"
    secret_file.write_text("jaas-secret-value\n")
    env = {
        "LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": "hunter2",
        "LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS__SSL.KEY.PASSWORD_FILE": str(secret_file),
    }
    cfg = load_config(write(tmp_path, BASE), env=env,
                      overrides=["source.kafka.sasl.username=alice"])
    kafka = cfg.source.kafka
    assert kafka.sasl is not None and kafka.sasl.password is not None
    assert kafka.sasl.password.get_secret_value() == "hunter2"
    assert kafka.secret_options["ssl.key.password"].get_secret_value() == "jaas-secret-value"
    dumped = yaml.safe_dump(redacted_dict(cfg)) + repr(cfg) + str(cfg)
    assert "hunter2" not in dumped and "jaas-secret-value" not in dumped
    assert "**********" in dumped


def test_secret_file_missing_names_the_key(tmp_path: Path) -> None:
    env = {"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD_FILE": str(tmp_path / "nope")}
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, BASE), env=env)
    assert info.value.key == "source.kafka.sasl.password"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml", env={})


def test_a_weakened_redaction_regex_is_refused(tmp_path: Path) -> None:
    """Spark writes every setting its redaction regex misses to the event log and plans:
    a user's regex must still cover lakesink's secrets (known-open S1)."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, BASE), env={},
                    overrides=["spark.conf.spark.redaction.regex=nomatch"])
    assert info.value.key == "spark.conf", str(info.value)
    assert "fs.s3a.secret.key" in str(info.value) and "kafka.sasl.jaas.config" in str(info.value)
    wider = "(?i)secret|password|token|access[.]?key|jaas|mycompany"
    cfg = load_config(write(tmp_path, BASE), env={},
                      overrides=[f"spark.conf.spark.redaction.regex={wider}"])
    assert cfg.spark.conf["spark.redaction.regex"] == wider


@pytest.mark.parametrize(("override", "key", "hint"), [
    ("table.partiton_by=[day]", "table.partiton_by", "did you mean 'partition_by'?"),
    ("source.kafka.bootstrap_server=x:1", "source.kafka.bootstrap_server",
     "did you mean 'bootstrap_servers'?"),
    ("trigger.intervall=5s", "trigger.intervall", "did you mean 'interval'?"),
    ("table.zzz=1", "table.zzz", None),
])
def test_an_unknown_key_says_which_key_was_meant(tmp_path: Path, override: str, key: str,
                                                 hint: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, BASE), env={}, overrides=[override])
    assert info.value.key == key
    assert ("did you mean" in str(info.value)) == (hint is not None), str(info.value)
    if hint:
        assert hint in str(info.value)
