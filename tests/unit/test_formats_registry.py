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
