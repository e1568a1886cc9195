"""Transform parsing and kafka-delta-ingest translation: pure Python, no Spark."""

from __future__ import annotations

import pytest

from lakesink.errors import ConfigError
from lakesink.config.transform_text import is_kdi, parse_transforms, translate_kdi


def test_name_and_expression_split_on_the_first_colon() -> None:
    (t,) = parse_transforms(["ts_text: date_format(ts, 'HH:mm')"])
    assert t.target == ("ts_text",)
    assert t.expression == "date_format(ts, 'HH:mm')"
    assert not t.kdi


def test_dotted_names_are_nested_targets() -> None:
    (t,) = parse_transforms(["meta.kafka.offset: kafka.offset"])
    assert t.target == ("meta", "kafka", "offset") and t.name == "meta.kafka.offset"


@pytest.mark.parametrize("text, message", [
    ("no colon here", "is not 'name: expression'"),
    ("name:", "is not 'name: expression'"),
    (": 1", "is not 'name: expression'"),
    ("bad name: 1", "is not a column name"),
    ("a..b: 1", "is not a column name"),
    ("kafka.x: 1", "reserved"),
    ("_lakesink_x: 1", "reserved"),
    ("d: substr(x, `0`)", "substr takes 3 argument(s), got 2"),
    ("d: substr(x, `0`, `1`) | upper(@)", "has no translation"),
    ("d: items[*].id || `1`", "has no translation"),
    ("d: epoch_seconds_to_iso8601(`{\"a\": 1}`)", "only scalar JSON literals"),
    ("d: substr(x, `0`, `1`", "unclosed '('"),
])
def test_bad_transforms_name_their_index(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_transforms(["ok: 1", text])
    assert err.value.key == "table.transforms.1"
    assert message in err.value.message


@pytest.mark.parametrize("expr, kdi", [
    ("substr(modified, `0`, `10`)", True),
    ("epoch_seconds_to_iso8601(ts)", True),
    ("`\"x\"`", True),
    ("substr(modified, 0, 10)", False),  # Spark's substr
    ("`my column` + 1", False),  # a quoted Spark column name
    ("kafka.offset", False),
])
def test_kdi_detection(expr: str, kdi: bool) -> None:
    assert is_kdi(expr) is kdi


@pytest.mark.parametrize("kdi, spark", [
    ("substr(modified, `0`, `10`)", "substring(modified, (0) + 1, 10)"),
    ("substr(meta.producer.timestamp, `0`, `10`)",
     "substring(meta.producer.timestamp, (0) + 1, 10)"),
    ("substr(substr(a, `2`, `5`), `1`, `2`)",
     "substring(substring(a, (2) + 1, 5), (1) + 1, 2)"),
    ("epoch_millis_to_micro(ts)", "(cast(ts AS BIGINT) * 1000)"),
    ('"my field"', "`my field`"),
    ("`\"it's\"`", "'it\\'s'"),
    ("`true`", "true"),
    ("`null`", "NULL"),
    ("`1.5`", "1.5"),
    ("'raw'", "'raw'"),
])
def test_kdi_translation(kdi: str, spark: str) -> None:
    assert translate_kdi(kdi) == spark


def test_epoch_seconds_translation_formats_utc_iso8601() -> None:
    sql = translate_kdi("epoch_seconds_to_iso8601(ts)")
    assert sql == ("date_format(timestamp_seconds(cast(ts AS BIGINT)), "
                   "\"yyyy-MM-dd'T'HH:mm:ss'Z'\")")


def test_config_rejects_a_bad_transform_with_its_key() -> None:
    from lakesink.config.loader import load_config

    with pytest.raises(ConfigError) as err:
        load_config(overrides=["source.kafka.bootstrap_servers=a:1", "source.kafka.topics=t"],
                    flags={"table.transforms": ["a: 1", "b c: 2"]}, env={})
    assert err.value.key == "table.transforms.1"
    assert "not a column name" in err.value.message
