"""Schema registry lookups and writer-schema verdicts, without Spark or a network: the
registry client is a stand-in raising what ``confluent_kafka``'s client raises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import types as T
from typer.testing import CliRunner

from lakesink.config import load_config
from lakesink.config.decode import RegistryConfig
from lakesink.decode import registry as registry_mod
from lakesink.decode.avro_registry import avro_type, loose, reader_schema
from lakesink.decode.registered import INCOMPATIBLE_SCHEMA, compare
from lakesink.decode.registry import MISSING, SchemaRegistry, WriterSchema
from lakesink.errors import ConfigError, RegistryUnavailable
from lakesink.config.plan import plan


class _HttpError(Exception):
    def __init__(self, status: int, code: int = -1) -> None:
        super().__init__(f"HTTP {status}")
        self.http_status_code = status
        self.error_code = code


NOT_FOUND = _HttpError(404, 40403)


class _Schema:
    def __init__(self, text: str, schema_type: str = "AVRO") -> None:
        self.schema_str, self.schema_type = text, schema_type


class FakeClient:
    """Answers ``get_schema`` from a script: a schema text, or an exception, per call."""

    def __init__(self, answers: dict[int, list[Any]]) -> None:
        self.answers = answers
        self.calls: list[int] = []

    def get_schema(self, schema_id: int) -> _Schema:
        self.calls.append(schema_id)
        answer = self.answers[schema_id].pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return _Schema(answer)


RECORD = json.dumps({"type": "record", "name": "R", "namespace": "a",
                     "fields": [{"name": "id", "type": "long"}]})


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_mod, "MISS_RECHECK_S", 0)


def _registry(client: FakeClient) -> SchemaRegistry:
    return SchemaRegistry(RegistryConfig(url="http://r:8081"), client=client)


def test_ids_are_looked_up_once_and_misses_asked_twice() -> None:
    client = FakeClient({1: [RECORD], 2: [NOT_FOUND, NOT_FOUND], 3: [NOT_FOUND, RECORD]})
    reg = _registry(client)
    found = reg.lookup([1, 2, 3, 1])
    assert found[2] == MISSING
    assert isinstance(found[1], WriterSchema) and found[1].record_name == "a.R"
    assert isinstance(found[3], WriterSchema)  # a lagging replica: found on the 2nd ask
    assert reg.lookup([1, 2, 3]) == {}  # known for the run: not asked again
    assert sorted(client.calls) == [1, 2, 2, 3, 3]


def test_a_registry_that_fails_decides_nothing() -> None:
    # a bare 404 (no not-found code) is a wrong URL or a proxy, not the registry's answer
    for error in (_HttpError(500), _HttpError(404), ConnectionError("refused"),
                  TimeoutError("slow")):
        reg = _registry(FakeClient({7: [error]}))
        with pytest.raises(RegistryUnavailable, match="schema id 7"):
            reg.lookup([7])
        assert reg.known == {}


def test_refused_credentials_are_a_configuration_error() -> None:
    reg = _registry(FakeClient({7: [_HttpError(401)]}))
    with pytest.raises(ConfigError, match="decode.avro.registry"):
        reg.lookup([7])


TABLE = T.StructType([T.StructField("id", T.LongType()), T.StructField("n", T.DoubleType()),
                      T.StructField("s", T.StructType([T.StructField("a", T.IntegerType())]))])


def _writer(fields: list[dict[str, Any]]) -> WriterSchema:
    return WriterSchema(5, "AVRO", json.dumps({"type": "record", "name": "R", "fields": fields}))


def test_verdict_promotes_narrower_fields_and_fills_missing_columns() -> None:
    writer = _writer([{"name": "id", "type": ["null", "int"]}, {"name": "x", "type": "string"}])
    struct = T.StructType([T.StructField("id", T.IntegerType()),
                           T.StructField("x", T.StringType())])
    verdict = compare(writer.id, struct, TABLE)
    assert verdict.reason is None and verdict.extra == ["x"]
    assert verdict.promoted == {"id": (T.IntegerType(), T.LongType())}
    reader = json.loads(reader_schema(writer, verdict, TABLE))
    assert [f["name"] for f in reader["fields"]] == ["id", "n", "s", "_lakesink_ok"]
    assert reader["fields"][0]["type"] == ["null", "long"]  # int promoted to the column's long
    assert reader["fields"][1] == {"name": "n", "default": None, "type": ["null", "double"]}
    assert reader["fields"][3] == {"name": "_lakesink_ok", "type": "boolean", "default": True}
    assert reader["fields"][2]["type"][1]["namespace"] == "lakesink.missing"


def test_verdict_names_the_field_of_an_incompatible_schema() -> None:
    writer = _writer([{"name": "n", "type": "string"}])
    verdict = compare(writer.id, T.StructType([T.StructField("n", T.StringType())]), TABLE)
    assert verdict.reason == INCOMPATIBLE_SCHEMA
    assert verdict.detail == "schema id 5: field 'n' is string, the table's column is double"
    nested = _writer([{"name": "s", "type": {"type": "record", "name": "S", "fields": [
        {"name": "b", "type": "int"}]}}])
    struct = T.StructType([T.StructField("s", T.StructType([T.StructField("b",
                                                                          T.IntegerType())]))])
    assert compare(nested.id, struct, TABLE).reason == INCOMPATIBLE_SCHEMA
    assert compare(6, "a PROTOBUF schema, not an Avro record", TABLE).reason == \
        INCOMPATIBLE_SCHEMA


def test_avro_types_of_missing_columns() -> None:
    assert avro_type(T.TimestampType(), "x") == {"type": "long",
                                                 "logicalType": "timestamp-micros"}
    assert avro_type(T.DecimalType(20, 2), "x")["precision"] == 20
    assert avro_type(T.ArrayType(T.LongType()), "x") == {"type": "array",
                                                         "items": ["null", "long"]}
    assert loose(T.ArrayType(T.LongType(), False)) == T.ArrayType(T.LongType(), True)


BASE = {"source": {"kafka": {"bootstrap_servers": "b:9092", "topics": ["events"]}},
        "decode": {"format": "avro", "avro": {"registry": {"url": "http://r:8081/"}}}}


def _load(tmp_path: Path, data: dict[str, Any], env: dict[str, str] | None = None) -> Any:  # noqa: ANN401
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path, env=env or {})


def test_registry_config(tmp_path: Path) -> None:
    cfg = _load(tmp_path, BASE)
    assert cfg.decode.avro.wire == "confluent"  # implied by a registry
    assert cfg.decode.registry.url == "http://r:8081"
    assert cfg.decode.evolves  # the table follows the writers
    plain = json.loads(json.dumps(BASE))
    plain["decode"]["avro"]["wire"] = "plain"
    with pytest.raises(ConfigError, match="decode.avro.wire"):
        _load(tmp_path, plain)
    for url in ("http://u:pw@r:8081", "http://a:8081,http://u:pw@b:8081"):
        inline = json.loads(json.dumps(BASE))
        inline["decode"]["avro"]["registry"]["url"] = url
        with pytest.raises(ConfigError, match="credentials in the URL") as err:
            _load(tmp_path, inline)
        assert "pw" not in str(err.value).replace("password", "")
    routed = json.loads(json.dumps(BASE))
    routed["routes"] = [{"topics": ["events"], "table": {"name": "t"},
                         "decode": {"avro": {"registry": {"url": "http://r:1",
                                                          "password": "hunter2"}}}}]
    with pytest.raises(ConfigError, match="routes.0.decode.avro.registry.password") as err:
        _load(tmp_path, routed)
    assert "hunter2" not in str(err.value)
    # a route's decode sections merge into the top level's: the registry is inherited
    routed["routes"][0]["decode"] = {"avro": {"schema_file": "x.avsc"}}
    cfg = _load(tmp_path, routed)
    assert plan(cfg).route(0).config.decode.registry.url == "http://r:8081"


def test_registry_password_never_printed(tmp_path: Path) -> None:
    from lakesink.cli import app

    data = json.loads(json.dumps(BASE))
    data["decode"]["avro"]["registry"]["username"] = "svc"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(
        app, ["validate", "-c", str(path), "--offline", "--set",
              f"table.base_path={tmp_path}"],
        env={"LAKESINK_DECODE__AVRO__REGISTRY__PASSWORD": "s3cr3t-marker"})
    assert result.exit_code == 0, result.output
    assert "s3cr3t-marker" not in result.output
    assert "each record's writer schema from the registry http://r:8081" in result.output


def test_reader_schema_defines_each_named_type_at_its_first_use() -> None:
    """The reader's fields follow the table's order and leave fields out: a named type
    the writer defines in a later (or dropped) field is written out where the reader
    first uses it, and referenced after; missing columns' records never clash."""
    import fastavro

    point = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "int"}]}
    writer = _writer([{"name": "dropped", "type": point},
                      {"name": "b", "type": "Point"},
                      {"name": "a", "type": ["null", "a.Point"], "default": None}])
    writer = WriterSchema(5, "AVRO", json.dumps({**json.loads(writer.text), "namespace": "a"}))
    struct_point = T.StructType([T.StructField("x", T.IntegerType())])
    table = T.StructType([T.StructField("a", struct_point), T.StructField("b", struct_point),
                          T.StructField("m", T.ArrayType(struct_point)),
                          T.StructField("m_e", struct_point)])
    verdict = compare(writer.id, T.StructType([T.StructField("dropped", struct_point),
                                               T.StructField("b", struct_point),
                                               T.StructField("a", struct_point)]), table)
    assert verdict.reason is None and verdict.extra == ["dropped"]
    reader = json.loads(reader_schema(writer, verdict, table))
    fastavro.parse_schema(reader)  # every name defined once, before it is referenced
    assert reader["fields"][0]["type"][1]["name"] == "Point"  # defined at its first use
    assert reader["fields"][1]["type"] == "a.Point"


class _Probe:
    """A session whose probe of a writer schema fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def range(self, _n: int) -> None:
        raise self.error


def test_only_the_schemas_own_error_is_a_verdict() -> None:
    """known-open L14: any failure of Spark's probe of a writer schema was cached as the
    schema's verdict for the run (its records then went to the dead letters); a JVM that
    could not be reached is raised instead, so the batch is retried."""
    from py4j.protocol import Py4JNetworkError

    from lakesink.decode.avro_registry import avro_struct

    with pytest.raises(Py4JNetworkError):
        avro_struct(_Probe(Py4JNetworkError("Answer from Java side is empty")), "{}")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        avro_struct(_Probe(RuntimeError("java.lang.OutOfMemoryError: Java heap space")), "{}")  # type: ignore[arg-type]
    class JavaError(Exception):
        """As py4j raises a JVM exception: ``java_exception`` is the Java object."""

        def __init__(self, java_class: str, message: str) -> None:
            super().__init__(f"An error occurred while calling o67.select. : {java_class}: "
                             f"{message} at org.apache.spark.sql.avro.SchemaConverters")
            self.java_exception = type("J", (), {"getClass": lambda _: type(
                "C", (), {"getName": lambda _: java_class})()})()

    said = avro_struct(_Probe(JavaError(  # type: ignore[arg-type]
        "org.apache.spark.sql.avro.IncompatibleSchemaException",
        "Found recursive reference in Avro schema")), "{}")
    assert isinstance(said, str) and said.startswith("Spark cannot read it: ")
    assert "recursive reference" in said
    assert isinstance(avro_struct(_Probe(JavaError(  # type: ignore[arg-type]
        "org.apache.avro.SchemaParseException", "Undefined name: Nope")), "{}"), str)
    # thrown inside spark-avro, but the JVM's own trouble: not the schema's verdict
    with pytest.raises(JavaError):
        avro_struct(_Probe(JavaError("java.lang.OutOfMemoryError",  # type: ignore[arg-type]
                                     "Java heap space")), "{}")
