"""Protobuf records whose writer schema is named by id in a schema registry.

The rules every registry decoder follows are in :mod:`lakesink.decode.registered`.
Protobuf's part: a registry holds ``.proto`` text (and the files it imports, as
references); each writer schema is compiled once, on the driver, to a descriptor set
with ``protoc`` (``grpcio-tools``, in process; Google's well-known types come with it).
The records are of ``decode.protobuf.message`` (the Confluent message-index path after
the schema id must point at it, else ``malformed_protobuf``), and its fields are the
columns, typed as in :mod:`lakesink.decode.protobuf`. Decoding runs in one Arrow UDF per
batch, as for a descriptor file; each record is parsed with the message class of its
writer schema and its fields are put into the table's columns (a column the writer lacks
is NULL; an int32 field fills a bigint column).
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.protobuf import (
    ERROR_FIELD,
    MALFORMED_PROTOBUF,
    _message_descriptor,
    _strip_confluent,
    converted,
    message_index_path,
    spark_schema,
    to_python,
)
from lakesink.decode.registered import RegistryDecoder
from lakesink.decode.registry import SchemaRegistry, WriterSchema
from lakesink.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column

    from lakesink.decode.evolution import EvolutionPolicy


def serialized_descriptor(text: str) -> Any:  # noqa: ANN401 - a FileDescriptorProto
    """A schema text that is a base64 ``FileDescriptorProto`` (what Confluent's
    serializers register, and what some registries, Apicurio's among them, return as is)
    parsed; None for ``.proto`` text."""
    from google.protobuf import descriptor_pb2

    stripped = text.strip()
    if not stripped or any(c in stripped for c in " ;{\n"):
        return None
    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(
            base64.b64decode(stripped, validate=True))
    except Exception:  # noqa: BLE001 - not a serialized descriptor
        return None
    return proto if proto.message_type or proto.name else None


def compile_proto(writer: WriterSchema) -> bytes | str:
    """The descriptor set (``--include_imports``) of a Protobuf writer schema, or why
    it does not compile. The schema and its references may each be ``.proto`` text or
    a serialized descriptor; Google's well-known types come with ``grpcio-tools``."""
    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    given = descriptor_pb2.FileDescriptorSet()
    with tempfile.TemporaryDirectory(prefix="lakesink-proto-") as folder:
        root = Path(folder) / "src"
        root.mkdir()
        for name, text in writer.references:
            proto = serialized_descriptor(text)
            if proto is not None:
                proto.name = name
                given.file.append(proto)
                continue
            path = (root / name).resolve()
            if not path.is_relative_to(root.resolve()):
                return f"reference name {name!r} leaves the import root"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        main = serialized_descriptor(writer.text)
        if main is not None:
            main.name = main.name or f"lakesink_schema_{writer.id}.proto"
            given.file.append(main)
            main_name = main.name
        else:
            main_name = f"lakesink_schema_{writer.id}.proto"
            (root / main_name).write_text(writer.text)
        args = ["protoc", f"-I{root}", f"-I{include}", "--include_imports"]
        if given.file:
            given_path = Path(folder) / "given.desc"
            given_path.write_bytes(given.SerializeToString())
            args.append(f"--descriptor_set_in={given_path}")
        out = Path(folder) / "set.desc"
        code = protoc.main([*args, f"--descriptor_set_out={out}", main_name])
        if code != 0 or not out.exists():
            return f"its .proto does not compile (protoc exit code {code})"
        return out.read_bytes()


class _Converter:
    """The UDF body: per schema id, the message class (built once per worker)."""

    def __init__(self, sets: dict[int, bytes], message: str, schema: T.StructType) -> None:
        self.sets = sets
        self.message = message
        self.schema = schema
        self._classes: dict[int, tuple[Any, list[int]]] = {}
        self._arrow: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_classes": {}, "_arrow": None}

    def _cls(self, sid: int) -> tuple[Any, list[int]]:
        if sid not in self._classes:
            from google.protobuf import message_factory

            desc = _message_descriptor(self.sets[sid], self.message)
            self._classes[sid] = (message_factory.GetMessageClass(desc),
                                  message_index_path(desc))
        return self._classes[sid]

    def __call__(self, values: pa.Array) -> pa.Array:
        from pyspark.sql.pandas.types import to_arrow_type

        if self._arrow is None:
            self._arrow = to_arrow_type(T.StructType(
                [*self.schema.fields, T.StructField(ERROR_FIELD, T.StringType())]),
                timezone="UTC")
        names = self.schema.fieldNames()
        rows: list[dict[str, Any] | None] = []
        for data in values.to_pylist():
            sid = int.from_bytes(data[1:5], "big") if data and len(data) >= 5 else None
            if sid is None or data[0] != 0 or sid not in self.sets:
                rows.append(None)  # failure() names the reason
                continue
            try:
                cls, expected = self._cls(sid)
                parsed = to_python(cls.FromString(_strip_confluent(data, expected)))
                row: dict[str, Any] = {n: parsed.get(n) for n in names}
                row[ERROR_FIELD] = None
            except Exception as exc:  # noqa: BLE001 - any parse error is the record's
                row = {ERROR_FIELD: f"{type(exc).__name__}: {exc}"[:500]}
            rows.append(row)
        return pa.array(rows, type=self._arrow)


class RegistryProtobufDecoder(RegistryDecoder):
    malformed = MALFORMED_PROTOBUF

    def __init__(self, schema: T.StructType, registry: SchemaRegistry, message: str,
                 policy: EvolutionPolicy) -> None:
        self.message = message
        super().__init__(schema, registry, policy)

    def _descriptor_set(self, writer: WriterSchema) -> bytes | str:
        cache = self.registry.descriptor_sets
        if writer.id not in cache:
            cache[writer.id] = (compile_proto(writer) if writer.schema_type == "PROTOBUF"
                                else f"a {writer.schema_type} schema, not Protobuf")
        return cache[writer.id]

    def struct_of(self, writer: WriterSchema) -> T.StructType | str:
        cache = self.registry.spark_types
        if writer.id not in cache:
            compiled = self._descriptor_set(writer)
            if isinstance(compiled, str):
                cache[writer.id] = compiled
            else:
                try:
                    cache[writer.id] = spark_schema(_message_descriptor(compiled, self.message))
                except KeyError:
                    cache[writer.id] = f"it has no message {self.message}"
                except ConfigError as exc:  # a recursive message
                    cache[writer.id] = exc.message
        return cache[writer.id]

    def unreadable(self, parsed: Column) -> Column:
        return parsed.isNull() | parsed[ERROR_FIELD].isNotNull()

    def unreadable_detail(self, value: Column, parsed: Column, sid: Column) -> Column:
        return F.concat(F.lit(f"cannot read the value as {self.message} with writer schema id "),
                        sid.cast("string"), F.lit(" ("), F.length(value).cast("string"),
                        F.lit(" bytes): "), F.coalesce(parsed[ERROR_FIELD], F.lit("?")))

    def parse(self, value: Column) -> Column:
        sets = {i: self._descriptor_set(self.registry.known[i])  # type: ignore[arg-type]
                for i in self.readable}
        converter = _Converter({i: s for i, s in sets.items() if isinstance(s, bytes)},
                               self.message, self.schema)
        return converted(converter, self.schema, value)
