"""A table's resolved pieces (:class:`TableParts`): its layout, its first schema (declared,
stored, from a registry, or inferred from a sample), its evolution policy, the decoder
and partition spec of a schema, its key and metadata columns and transforms — and, from
them, its batch function (:meth:`TableParts.processor`: the writer, the dead letters,
the catalog registrar). What the query (:mod:`lakesink.app`) and a dead-letter replay
(:mod:`lakesink.dlq`) build a table's batches with.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import types as T

from lakesink import catalog, sources
from lakesink.config.plan import TableSpec
from lakesink.decode import Decoder, fixed_decoder, json_decoder
from lakesink.decode.avro_registry import RegistryAvroDecoder
from lakesink.decode.protobuf_registry import RegistryProtobufDecoder
from lakesink.decode.registered import RegistryDecoder, loose
from lakesink.decode.evolution import EvolutionPolicy, evolve, reconcile_declared, schema_record
from lakesink.decode.registry import SchemaRegistry
from lakesink.decode.json import infer_schema
from lakesink.decode.schema import declared_schema
from lakesink.errors import ConfigError, SourceError
from lakesink.pipeline.batch import BatchFunction
from lakesink.pipeline.evolver import SchemaStore
from lakesink.pipeline.marker import Rebuild
from lakesink.pipeline.columns import PartitionSpec, SourceColumns
from lakesink.config.transform_text import parse_transforms
from lakesink.pipeline.transforms import Transforms
from lakesink.runtime import storage
from lakesink.tables.base import check_layout
from lakesink.tables.fs import HadoopFS
from lakesink.tables.identity import run_tag
from lakesink.tables.formats import WriterOptions, open_writer, table_format
from lakesink.tables.layout import TableLayout
from lakesink.tables.rejected import RejectedWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def evolution_policy(spec: TableSpec) -> EvolutionPolicy:
    if not spec.decode.evolves:  # the format fixes the columns
        return EvolutionPolicy(mode="strict", unknown_fields="drop", type_widening=False)
    return EvolutionPolicy(mode=spec.table.schema_evolution,
                           unknown_fields=spec.table.unknown_fields,
                           type_widening=spec.table.widening,
                           max_columns=spec.table.max_columns)


def resolve_schema(spark: SparkSession, spec: TableSpec, fs: HadoopFS,
                   layout: TableLayout, fixed: Decoder | None = None,
                   samples: Callable[[], list[str]] | None = None,
                   registry: RegistryDecoder | None = None) -> T.StructType:
    """The schema to start with, stored in ``schema.json`` with its history.

    A format with its own columns (``fixed``): its schema, which must equal a stored
    one (the format or its schema file changed under an existing table otherwise).
    Declared: reconciled with the stored one (widened or added columns are kept, an
    incompatible type is refused). Else the stored schema. With a schema registry: the
    schema file's, or the latest of the registry subjects (:func:`first_registry_schema`).
    Else inferred from a topic sample (or from ``samples()``: one message type's
    records) and stored.
    """
    stored = fs.read_json(layout.schema_file)
    stored_schema = T.StructType.fromJson(stored["schema"]) if stored else None
    if fixed is not None:
        if stored_schema is not None and stored_schema != fixed.schema:
            raise ConfigError(
                "decode.format",
                f"the {spec.decode.format} format gives columns {fixed.schema.simpleString()}, "
                f"but the table has {stored_schema.simpleString()} ({layout.schema_file})")
        if stored_schema is None:
            fs.write_json(layout.schema_file, schema_record(
                fixed.schema, source=f"format {spec.decode.format}", declared=None,
                previous=None, changes=[f"format {spec.decode.format}"]))
        return fixed.schema
    if spec.decode.schema_ is not None:
        declared = declared_schema(spec.decode.schema_)
        schema, changes = reconcile_declared(declared, stored_schema, evolution_policy(spec))
        record = schema_record(schema, source="declared", declared=json.loads(declared.json()),
                               previous=stored, changes=changes or ["declared"])
        if stored != record:
            fs.write_json(layout.schema_file, record)
        return schema
    if stored_schema is not None:
        logger.info("using the schema stored with the table (%s)", layout.schema_file)
        return stored_schema
    if registry is not None:
        schema, source = first_registry_schema(spark, spec, registry, samples)
        fs.write_json(layout.schema_file, schema_record(
            schema, source=source, declared=None, previous=None, changes=[source]))
        logger.info("schema %s: %s", source, schema.simpleString())
        return schema
    if samples is not None:
        values = samples()
    else:
        values = sources.sample_values(spark, spec.source,
                                       limit=spec.decode.infer_sample_size,
                                       wait_s=spec.decode.infer_wait_s)
    if not values:
        raise SourceError(
            f"no records to infer a schema from after {spec.decode.infer_wait_s:.0f}s; "
            "declare decode.schema or produce a record first"
        )
    schema = infer_schema(spark, values)
    if not schema.fields:
        raise SourceError("none of the sampled records is a JSON object; declare decode.schema")
    fs.write_json(layout.schema_file, schema_record(
        schema, source=f"inferred from {len(values)} record(s)", declared=None, previous=None,
        changes=["inferred"]))
    logger.info("inferred schema from %d record(s): %s", len(values), schema.simpleString())
    return schema


def first_registry_schema(spark: SparkSession, spec: TableSpec, decoder: RegistryDecoder,
                          samples: Callable[[], list[str]] | None = None
                          ) -> tuple[T.StructType, str]:
    """A new registry-decoded table's first schema and where it came from: the schema
    (or descriptor) file if one is given, else the latest versions of the subjects
    (default ``<topic>-value``, the serializers' default naming), merged. A record-name
    route's table: the writer schemas ``samples()`` gives (that record's, Avro JSON).
    ``decoder``: one of the table's format (any schema), for the writers' structs."""
    from lakesink.decode.avro_registry import avro_struct

    def merged(structs: list[T.StructType | str]) -> T.StructType:
        schema = T.StructType([])
        for struct in structs:
            if isinstance(struct, T.StructType):
                schema, _ = evolve(schema, new_fields=loose(struct))  # type: ignore[arg-type]
        return schema

    fmt = spec.decode.format
    if samples is not None:  # a record-name route's table: that record's writers
        texts = samples()
        return (merged([avro_struct(spark, t) for t in texts]),
                f"the {len(texts)} writer schema(s) seen of this record")
    if fmt == "avro" and spec.decode.avro.schema_file:
        from lakesink.decode.avro import AvroDecoder, read_schema_file

        file = AvroDecoder(spark, read_schema_file(spec.decode.avro.schema_file))
        return merged([file.schema]), f"schema file {spec.decode.avro.schema_file}"
    if fmt == "protobuf" and spec.decode.protobuf.descriptor_file:
        from lakesink.decode.protobuf import load_descriptor, spark_schema

        assert spec.decode.protobuf.message is not None  # checked by the config model
        _, desc = load_descriptor(spec.decode.protobuf.descriptor_file,
                                  spec.decode.protobuf.message)
        return (merged([spark_schema(desc)]),
                f"descriptor file {spec.decode.protobuf.descriptor_file}")
    registry = decoder.registry
    subjects = registry.subjects or [f"{t}-value" for t in spec.source.names]
    structs, used = [], []
    for subject in subjects:
        writer = registry.latest(subject)
        struct = decoder.struct_of(writer) if writer is not None else None
        if isinstance(struct, T.StructType):
            structs.append(struct)
            used.append(f"{subject} (id {writer.id})")  # type: ignore[union-attr]
    if not used:
        what = "an Avro record" if fmt == "avro" else "a Protobuf schema with the message"
        raise ConfigError(
            f"decode.{fmt}.registry.subjects",
            f"none of {subjects} is {what} subject in the registry {registry.url}, so the "
            "new table has no first schema",
            fix="name the subjects, register the schema first, or give "
            + ("decode.avro.schema_file" if fmt == "avro" else "decode.protobuf.descriptor_file"))
    return merged(structs), "registry subject(s) " + ", ".join(used)


def writer_options(spec: TableSpec, app_id: str = "") -> WriterOptions:
    """What the table's writer is opened with, keyed by ``app_id`` (the checkpoint's, or
    the dead-letter replay's; none needed to decide what to load at start)."""
    table = spec.table
    return WriterOptions(
        app_id=app_id, partition_by=tuple(table.partition_by),
        compression=table.compression, files_per_partition=table.files_per_partition,
        target_file_size=table.target_file_size, null_value=table.null_partition_value,
        **storage.lease_options(spec.storage, table),
        checkpoint_interval=table.delta_checkpoint_interval,
        merge_schema=table.schema_evolution == "add_columns",
        type_widening=table.widening,
        task_filesystem=storage.delta_task_filesystem(
            spec.storage, TableLayout.of(table.base_path, spec.name).base),
        arrow_records=(table.engine != "spark" and spec.decode.format == "json"
                       and not table.transforms))


def schema_store(fs: HadoopFS, layout: TableLayout) -> SchemaStore:
    """Record an evolved schema (a new version in ``schema.json``) before it is used."""
    def store(schema: T.StructType, changes: list[str], batch_id: int) -> None:
        previous = fs.read_json(layout.schema_file) or {}
        fs.write_json(layout.schema_file, schema_record(
            schema, source=previous.get("source", "evolved"), declared=previous.get("declared"),
            previous=previous, changes=changes, batch_id=batch_id))
    return store


@dataclass
class TableParts:
    """One table's resolved pieces (layout, schema, policy, decoder factory, extra
    columns): what a batch function needs besides its app id."""

    spec: TableSpec
    spark: SparkSession
    layout: TableLayout
    fs: HadoopFS
    schema: T.StructType
    policy: EvolutionPolicy
    rebuild: Rebuild
    source_columns: SourceColumns
    transforms: Transforms

    @classmethod
    def resolve(cls, spec: TableSpec, spark: SparkSession,
                samples: Callable[[], list[str]] | None = None) -> TableParts:
        """``samples``: where a schema to infer comes from, when not from the topic."""
        table, decode = spec.table, spec.decode
        layout = TableLayout.of(table.base_path, spec.name)
        fs = HadoopFS(spark, layout.base)
        check_layout(fs, layout, table.format, table.partition_by,
                     null_value=table.null_partition_value)
        fixed = fixed_decoder(spark, decode)
        policy = evolution_policy(spec)
        registry = (SchemaRegistry(decode.registry,
                                   key=f"decode.{decode.format}.registry")
                    if decode.registry is not None else None)

        def registry_decoder(current: T.StructType) -> RegistryDecoder:
            assert registry is not None
            if decode.format == "protobuf":
                assert decode.protobuf.message is not None  # checked by the model
                return RegistryProtobufDecoder(current, registry, decode.protobuf.message,
                                               policy)
            return RegistryAvroDecoder(spark, current, registry, policy)

        schema = resolve_schema(spark, spec, fs, layout, fixed, samples,
                                registry_decoder(T.StructType([])) if registry else None)
        transforms = Transforms(parse_transforms(table.transforms))

        def rebuild(current: T.StructType) -> tuple[Decoder, PartitionSpec, T.StructType]:
            """The decoder, the partition spec and the payload columns (the record's
            fields after the transforms) of a schema."""
            columns = transforms.output_schema(spark, current) if transforms else current
            spec = PartitionSpec.build(
                columns=table.partition_by, schema=columns,
                timestamp_column=table.timestamp_column,
                timestamp_fallback=table.timestamp_fallback,
                null_value=table.null_partition_value,
                ascii_folders=table_format(table.format).ascii_folders,
            )
            if registry is not None:
                decoder: Decoder = registry_decoder(current)
            else:
                decoder = fixed or json_decoder(current, reject_unknown=policy.rejects_unknown,
                                                spark=spark)
            return decoder, spec, columns

        # partition and timestamp columns resolve before data moves
        _, _, columns = rebuild(schema)
        source_columns = SourceColumns(table.key_column, table.key_format,
                                       table.metadata_column)
        source_columns.check(columns)
        return cls(spec, spark, layout, fs, schema, policy, rebuild, source_columns, transforms)

    def processor(self, app_id: str) -> BatchFunction:
        """The batch function with its table and rejected writers, keyed by ``app_id``
        (the checkpoint's, or the dead-letter replay's)."""
        table, spark, layout = self.spec.table, self.spark, self.layout
        writer = open_writer(table.format, spark, layout, writer_options(self.spec, app_id))
        writer.prepare()
        try:
            registrar = catalog.registrar(self.spec.catalog, table, self.fs, layout,
                                          run=run_tag(app_id), storage=self.spec.storage,
                                          spark=spark)
            if registrar is not None:
                registrar.start()
            rejected = RejectedWriter(
                self.fs, layout, app_id=app_id, fmt=self.spec.dlq.format, spark=spark,
                lease=storage.lease_options(self.spec.storage, self.spec.table,
                                            self.spec.dlq.format))
        except BaseException:
            writer.close()  # a refused start (a catalog's, the dead-letter table's)
            raise           # holds no writer lease
        return BatchFunction(
            schema=self.schema, policy=self.policy, rebuild=self.rebuild,
            store_schema=schema_store(self.fs, layout), writer=writer,
            rejected=rejected,
            app_id=app_id,
            source_columns=self.source_columns, transforms=self.transforms,
            engine=table.engine,
            task_filesystem=storage.task_filesystem(self.spec.storage, layout.base),
            registrar=registrar,
        )
