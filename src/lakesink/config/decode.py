"""The ``decode`` section: the payload format, its schema (declared, a schema file, a registry), inference."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from lakesink.config.base import Section, StrList


class FieldSpec(Section):
    """One declared field: an Arrow type name (Utf8, Int64, …) or Spark DDL type."""

    name: str
    type: str
    nullable: bool = True


class RegistryConfig(Section):
    """``decode.avro.registry``: a Confluent-API schema registry (Confluent Schema
    Registry, Apicurio's ``/apis/ccompat/v7``, Karapace, Redpanda) that resolves each
    record's schema id; see ``docs/schema-registry.md``."""

    url: str = Field(description="the registry's base URL (http(s)://host:8081, or "
                     "Apicurio's http://host:8080/apis/ccompat/v7)")
    subjects: StrList = Field(default_factory=list, description="subjects whose latest "
                              "version gives a new table its first schema; default: "
                              "<topic>-value for each topic")
    username: str | None = Field(default=None, description="HTTP basic auth user")
    password: SecretStr | None = Field(default=None, description="env or secret file only")
    timeout_s: float = Field(default=10.0, gt=0, description="the longest wait for one "
                             "answer (then the batch fails and the query restarts with "
                             "backoff)")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        urls = [u.strip() for u in value.split(",")]  # the client takes several
        for url in urls:
            if "@" in url.partition("://")[2].partition("/")[0]:
                raise ValueError("credentials in the URL: set username, and password from "
                                 "the environment or a secret file")
            if not re.match(r"^https?://[^/\s]+", url):
                raise ValueError(f"{url!r} is not an http(s):// URL")
        return ",".join(u.rstrip("/") for u in urls)


def _confluent_with_registry(section: Any) -> Any:  # noqa: ANN401 - Avro/ProtobufConfig
    """A registry reads the schema id of the Confluent framing: ``wire`` defaults to
    ``confluent`` with one, and ``plain`` is refused."""
    if section.registry is not None:
        if "wire" in section.model_fields_set and section.wire != "confluent":
            fmt = "avro" if isinstance(section, AvroConfig) else "protobuf"
            raise ValueError(f"decode.{fmt}.wire: a registry resolves the schema id of the "
                             "Confluent framing; use wire: confluent (the default with a "
                             "registry)")
        section.wire = "confluent"
    return section


class AvroConfig(Section):
    """``decode.format: avro``: the writer schema and how values are framed."""

    schema_file: str | None = Field(default=None, description="Avro schema (.avsc, JSON); "
                                    "with a registry: optional, the first schema of a "
                                    "new table")
    wire: Literal["plain", "confluent"] = Field(
        default="plain",
        description="'confluent': a magic byte 0 and a 4-byte schema id precede the datum "
        "(the default with a registry)",
    )
    registry: RegistryConfig | None = Field(
        default=None, description="resolve each record's schema id in a schema registry "
        "(the table's schema follows the writers' schemas)")
    check_length: bool = Field(
        default=True,
        description="a value with bytes after its datum is a dead letter (malformed_avro): "
        "the datum's length is its re-encoding's; false for a writer that splits arrays or "
        "maps into several blocks (the schema file's decoder only)")

    _registry_wire = model_validator(mode="after")(_confluent_with_registry)


class ProtobufConfig(Section):
    """``decode.format: protobuf``: the descriptor set and the message of each value."""

    descriptor_file: str | None = Field(
        default=None, description="descriptor set: protoc --descriptor_set_out=F "
        "--include_imports; with a registry: optional, a new table's first schema")
    message: str | None = Field(default=None, description="full message name (pkg.Msg)")
    wire: Literal["plain", "confluent"] = Field(
        default="plain", description="'confluent': magic byte 0, a 4-byte schema id and "
        "the message-index path precede the message (the default with a registry)")
    registry: RegistryConfig | None = Field(
        default=None, description="resolve each record's schema id in a schema registry "
        "(the .proto text is compiled; the table's schema follows the writers')")

    _registry_wire = model_validator(mode="after")(_confluent_with_registry)


class DecodeConfig(Section):
    format: Literal["json", "avro", "protobuf", "arrow_ipc", "string", "int64", "bytes"] = Field(
        default="json",
        description="json; avro (schema from decode.avro); protobuf (decode.protobuf); "
        "arrow_ipc (an IPC stream per value, columns from decode.schema); "
        "string -> data, int64 (8 bytes big-endian) -> value, bytes -> data (base64) + size",
    )
    avro: AvroConfig = Field(default_factory=AvroConfig)
    protobuf: ProtobufConfig = Field(default_factory=ProtobufConfig)
    schema_: list[FieldSpec] | str | None = Field(
        default=None,
        alias="schema",
        description="declared fields, or a Spark DDL string; none = infer from the topic",
    )
    infer_sample_size: int = Field(default=1000, gt=0)
    infer_wait_s: float = Field(default=60.0, ge=0)

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True)

    @model_validator(mode="after")
    def _format_settings(self) -> DecodeConfig:
        if self.format not in ("json", "arrow_ipc") and self.schema_ is not None:
            raise ValueError(f"decode.schema: only for formats json and arrow_ipc; the "
                             f"{self.format} format defines the columns itself")
        if self.format == "arrow_ipc" and self.schema_ is None:
            raise ValueError("decode.schema: required for format arrow_ipc (the table's "
                             "columns; each stream's columns are cast to them)")
        if self.format == "avro" and not self.avro.schema_file and self.avro.registry is None:
            raise ValueError("decode.avro.schema_file: required for format avro (or "
                             "decode.avro.registry)")
        if self.format == "protobuf":
            needed = ("message",) if self.protobuf.registry else ("descriptor_file", "message")
            for key in needed:
                if not getattr(self.protobuf, key):
                    raise ValueError(f"decode.protobuf.{key}: required for format protobuf")
        return self

    @property
    def evolves(self) -> bool:
        """Whether records can carry fields the schema lacks (JSON, and Avro whose
        writer schemas come from a registry)."""
        return self.format == "json" or self.registry is not None

    @property
    def registry(self) -> RegistryConfig | None:
        """The schema registry that resolves the records' schema ids, if any."""
        if self.format == "avro":
            return self.avro.registry
        return self.protobuf.registry if self.format == "protobuf" else None
