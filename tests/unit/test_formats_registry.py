"""The table formats, looked up by name (no Spark): one object per format says what
differs, and one factory opens every writer."""

from __future__ import annotations

import pytest

from lakesink.errors import ConfigError
from lakesink.tables.formats import FORMATS, WriterOptions, table_format


def test_each_format_says_what_differs() -> None:
    parquet, delta = FORMATS["parquet"], FORMATS["delta"]
    assert (parquet.has_log, parquet.widens_by_default, parquet.one_driver_on_s3) == (
        False, True, False)
    assert (delta.has_log, delta.widens_by_default, delta.one_driver_on_s3) == (
        True, False, True)


def test_a_name_no_format_has_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError) as refused:
        table_format("iceberg", key="dlq.format")
    assert str(refused.value) == ("dlq.format: 'iceberg' is not a table format (one of: "
                                  "parquet, delta)")


def test_writer_options_give_every_writer_the_same_keywords() -> None:
    options = WriterOptions(app_id="a1", partition_by=("day",), lease_s=60.0,
                            checkpoint_interval=10)
    assert options.common() == {
        "app_id": "a1", "partition_by": ["day"], "compression": "snappy",
        "files_per_partition": 1, "target_file_size": None, "null_value": None,
        "lease_s": 60.0, "lease_per_table": False}


@pytest.mark.parametrize(("changes", "loads"), [
    ({}, False),  # JSON, engine auto, local disk: delta-rs makes and commits the table
    ({"table": {"engine": "spark"}}, True),
    ({"table": {"type_widening": True}}, True),
    ({"table": {"transforms": ["next_id: id + 1"]}}, True),
    ({"decode": {"format": "avro", "avro": {"schema_file": "e.avsc"}}}, True),
    ({"table": {"base_path": "hdfs://127.0.0.1:9000/lake"}}, True),
])
def test_delta_s_jvm_classes_are_loaded_ahead_only_for_tables_spark_s_writer_takes(
        tmp_path, monkeypatch, changes, loads) -> None:
    """A Delta table whose batches delta-rs commits (and whose start delta-rs makes)
    loads none of Delta's JVM classes at start; one Spark's writer takes does."""
    import yaml

    from lakesink.config import load_config
    from lakesink.config.plan import TableSpec
    from lakesink.table_parts import writer_options
    from lakesink.tables import delta_create

    raw = {"source": {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["events"]}},
           "decode": {"format": "json", "schema": [{"name": "id", "type": "Int64"}]},
           "table": {"name": "events", "format": "delta",
                     "base_path": str(tmp_path / "lake")}}
    for section, values in changes.items():
        raw[section] = {**raw[section], **values}
    if raw["decode"]["format"] != "json":
        del raw["decode"]["schema"]
    (tmp_path / "e.avsc").write_text(
        '{"type": "record", "name": "E", "fields": [{"name": "id", "type": "long"}]}')
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    spec = TableSpec(load_config(path, env={}))
    started = []
    monkeypatch.setattr(delta_create, "load_classes",
                        lambda spark: started.append(spark) or "t")
    thread = FORMATS["delta"].load_classes("session", [writer_options(spec)])
    assert (thread == "t", started == ["session"]) == (loads, loads)
