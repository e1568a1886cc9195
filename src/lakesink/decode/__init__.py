"""Payload decoding: one :class:`~lakesink.decode.base.Decoder` per ``decode.format``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakesink.decode.base import Decoder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql import types as T

    from lakesink.config.decode import DecodeConfig


def fixed_decoder(spark: SparkSession | None, cfg: DecodeConfig) -> Decoder | None:
    """The decoder of a format that defines its own columns (None for JSON, whose
    schema is declared, stored or inferred). Avro needs ``spark`` for its type mapping."""
    from lakesink.decode import raw

    if cfg.format == "string":
        return raw.StringDecoder()
    if cfg.format == "int64":
        return raw.Int64Decoder()
    if cfg.format == "bytes":
        return raw.BytesDecoder()
    if cfg.format == "arrow_ipc":
        from lakesink.decode.arrow_ipc import ArrowIpcDecoder
        from lakesink.decode.schema import declared_schema

        assert cfg.schema_ is not None  # checked by the config model
        return ArrowIpcDecoder(declared_schema(cfg.schema_))
    if cfg.registry is not None:  # columns follow the writers' schemas
        return None
    if cfg.format == "protobuf":
        from lakesink.decode.protobuf import ProtobufDecoder

        assert cfg.protobuf.descriptor_file and cfg.protobuf.message  # checked by the model
        return ProtobufDecoder(cfg.protobuf.descriptor_file, cfg.protobuf.message,
                               wire=cfg.protobuf.wire)
    if cfg.format == "avro":
        from lakesink.decode.avro import AvroDecoder, read_schema_file

        assert cfg.avro.schema_file is not None  # checked by the config model
        text = read_schema_file(cfg.avro.schema_file)
        if spark is None:
            return None
        return AvroDecoder(spark, text, wire=cfg.avro.wire,
                           check_length=cfg.avro.check_length)
    return None


def json_decoder(schema: T.StructType, *, reject_unknown: bool,
                 spark: SparkSession | None = None) -> Decoder:
    """The JSON decoder; with ``spark``, it uses lakesink's Java colon counter when the
    session has it (:data:`lakesink.runtime.spark.JVM_FUNCTIONS`)."""
    from lakesink.decode.json import COUNT_COLONS, JsonDecoder
    from lakesink.runtime.spark import has_function

    return JsonDecoder(schema, reject_unknown=reject_unknown,
                       count_colons=has_function(spark, COUNT_COLONS))


__all__ = ["Decoder", "fixed_decoder", "json_decoder"]
