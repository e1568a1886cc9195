"""Decode format settings: checked before Spark starts, errors name the key."""

from __future__ import annotations

import json

import pytest

from lakesink.app import preflight
from lakesink.config import load_config
from lakesink.errors import ConfigError

BASE = {"source.kafka.bootstrap_servers": "127.0.0.1:9", "source.kafka.topics": ["t"]}


def test_avro_schema_file_problems_are_config_errors(tmp_path) -> None:
    base = {**BASE, "decode.format": "avro"}
    with pytest.raises(ConfigError) as missing:
        load_config(flags=base, env={})
    assert missing.value.key == "decode.avro.schema_file"
    enum_schema = tmp_path / "e.avsc"
    enum_schema.write_text(json.dumps({"type": "enum", "name": "E", "symbols": ["A"]}))
    cfg = load_config(flags={**base, "decode.avro.schema_file": str(enum_schema)}, env={})
    with pytest.raises(ConfigError, match="must be a record") as not_record:
        preflight(cfg)
    assert not_record.value.key == "decode.avro.schema_file"
    missing_file = load_config(flags={**base, "decode.avro.schema_file": str(tmp_path / "no")},
                               env={})
    with pytest.raises(ConfigError, match="cannot read") as unreadable:
        preflight(missing_file)
    assert unreadable.value.key == "decode.avro.schema_file"


def test_schema_is_only_for_json() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(flags={**BASE, "decode.format": "string",
                           "decode.schema": [{"name": "a", "type": "Int64"}]}, env={})
    assert err.value.key == "decode.schema"


@pytest.mark.parametrize(("fmt", "columns"), [("string", ["data"]), ("int64", ["value"]),
                                              ("bytes", ["data", "size"])])
def test_raw_formats_define_their_columns(fmt, columns) -> None:
    cfg = load_config(flags={**BASE, "decode.format": fmt, "table.partition_by": columns[:1]},
                      env={})
    done = preflight(cfg)
    assert any(f"format {fmt}" in line for line in done)
    with pytest.raises(ConfigError) as err:
        preflight(load_config(flags={**BASE, "decode.format": fmt,
                                     "table.partition_by": ["nope"]}, env={}))
    assert err.value.key == "table.partition_by"


@pytest.mark.parametrize(("flags", "key"), [
    ({"table.key_column": "bad name"}, "table.key_column"),
    ({"table.key_column": "k", "table.metadata_column": "k"}, "table.metadata_column"),
    ({"table.key_column": "k", "table.partition_by": ["k"]}, "table.partition_by"),
])
def test_key_and_metadata_column_errors(flags, key) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(flags={**BASE, **flags}, env={})
    assert err.value.key == key


def test_key_column_may_not_shadow_a_payload_field() -> None:
    from pyspark.sql import types as T

    from lakesink.pipeline.columns import SourceColumns

    schema = T.StructType([T.StructField("Key", T.StringType())])
    with pytest.raises(ConfigError) as err:
        SourceColumns(key_column="key").check(schema)
    assert err.value.key == "table.key_column"
    SourceColumns(key_column="__key", metadata_column="_kafka").check(schema)
