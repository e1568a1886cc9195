"""How a new Delta table is made before its first batch, and Delta's JVM classes
loaded ahead.

A table whose batches delta-rs commits is made by delta-rs (:func:`create_by_delta_rs`):
no JVM class of Delta's is loaded. Otherwise Delta's Scala table builder makes it from
the driver (:func:`build_table`), its classes loaded on a thread of their own while the
start does other things (:func:`load_classes`). Either way the table's first log entry
holds the protocol and metadata Spark's first append of the same zero rows would commit
(tested by ``test_a_table_created_from_the_driver_is_the_one_spark_s_first_append_makes``),
and two writers making it at once leave one table: the log's version 0 is written once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lakesink.errors import one_line
from lakesink.tables.delta_files import delta_rs_location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


#: the column types (Spark's JSON names) of a table delta-rs makes as Spark's first
#: append would (protocol 1/2, no table feature); ``decimal(p,s)`` too
_PLAIN_TYPES = frozenset({"string", "long", "integer", "short", "byte", "float", "double",
                          "boolean", "binary", "date", "timestamp"})


#: characters Delta refuses in a column name without column mapping
_NAME_REFUSED = frozenset(" ,;{}()\n\t=")
#: the session settings Delta applies to every new table (delta-rs does not read them)
TABLE_DEFAULTS = "spark.databricks.delta.properties.defaults."


def spark_table_defaults(spark: SparkSession) -> list[str]:
    """The session's defaults for new Delta tables' properties (``TABLE_DEFAULTS``*):
    Delta's builder and Spark's first append apply them, delta-rs would not."""
    return sorted(k for k in spark.conf.getAll if k.startswith(TABLE_DEFAULTS))


def plain_nullable(data_type: Any) -> Any:  # noqa: ANN401
    """Spark's JSON of a (struct) type with every field, element and value made
    nullable, as Spark's append stores a new table's columns; None when a type needs a
    table feature or carries column metadata (``timestamp_ntz``, ``variant``, char and
    varchar, …), or a struct has a column name Delta refuses (one of `` ,;{}()=``, a
    tab or newline; two names equal but for case): such a table is left to Delta's own
    builder, which refuses the names at start as before."""
    if isinstance(data_type, str):
        return data_type if (data_type in _PLAIN_TYPES
                             or data_type.startswith("decimal(")) else None
    kind = data_type.get("type")
    if kind == "struct":
        fields = []
        names = [str(field["name"]) for field in data_type["fields"]]
        if any(_NAME_REFUSED.intersection(name) for name in names) \
                or len({name.lower() for name in names}) != len(names):
            return None
        for field in data_type["fields"]:
            inner = plain_nullable(field["type"])
            if inner is None or field.get("metadata"):
                return None
            fields.append({"name": field["name"], "type": inner, "nullable": True,
                           "metadata": {}})
        return {"type": "struct", "fields": fields}
    if kind == "array":
        element = plain_nullable(data_type["elementType"])
        return None if element is None else {"type": "array", "elementType": element,
                                             "containsNull": True}
    if kind == "map":
        key, value = plain_nullable(data_type["keyType"]), plain_nullable(data_type["valueType"])
        return None if key is None or value is None else {
            "type": "map", "keyType": key, "valueType": value, "valueContainsNull": True}
    return None


def create_by_delta_rs(filesystem: tuple[str, dict[str, Any]], uri: str,
                       schema_json: str, partition_by: Sequence[str],
                       properties: dict[str, str]) -> Any:  # noqa: ANN401
    """Make the Delta table at ``uri`` if it has no commit (``createIfNotExists``) with
    delta-rs, with the columns of ``schema_json`` made nullable: protocol 1/2, the
    metadata Spark's first append would commit. Returns delta-rs' handle of it, or
    None when its types need Delta's builder (:func:`plain_nullable`). Raises what
    delta-rs raises (a second maker's version 0 is refused: create-if-absent on local
    disk, a conditional put on S3 and Azure)."""
    columns = plain_nullable(json.loads(schema_json))
    if columns is None:
        return None
    from deltalake import DeltaTable, Schema

    location, options = delta_rs_location(filesystem, uri)
    return DeltaTable.create(location, Schema.from_json(json.dumps(columns)), mode="ignore",
                             partition_by=list(partition_by) or None,
                             configuration=properties, storage_options=options)


def builder_usable(spark: SparkSession) -> bool:
    """Whether Delta's table builder may make a table here: not with Hive support (it
    looks the path up in the metastore first, and a metastore that is down would hold
    the start up; Spark's writer does not)."""
    return spark.conf.get("spark.sql.catalogImplementation", "in-memory") != "hive"


def build_table(spark: SparkSession, table: str, schema_json: str,
                partition_by: Sequence[str], properties: dict[str, str]) -> None:
    """Delta's Scala table builder over py4j (the jars have it; the delta-spark wheel
    is not used): ``createIfNotExists`` at ``table``, the columns nullable."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    nullable = jvm.org.apache.spark.sql.types.DataType.fromJson(schema_json).asNullable()
    # the location as Hadoop spells it (file:/…): Delta compares it with the table
    # identifier's, and file:///… would be "two different locations"
    location = jvm.org.apache.hadoop.fs.Path(table).toString()
    builder = (jvm.io.delta.tables.DeltaTable.createIfNotExists(spark._jsparkSession)
               .location(location).addColumns(nullable))
    if partition_by:
        columns = spark.sparkContext._gateway.new_array(jvm.java.lang.String,
                                                        len(partition_by))
        for i, column in enumerate(partition_by):
            columns[i] = column
        builder = builder.partitionedBy(columns)
    for key, value in properties.items():
        builder = builder.property(key, value)
    builder.execute()


_LOADED: set[int] = set()  #: the JVMs (by gateway) whose Delta classes are loaded


def load_classes(spark: SparkSession) -> threading.Thread | None:
    """Load Delta's classes on a thread of its own, while the start does other things
    (the Kafka checks, the checkpoint): the first Delta operation in a fresh JVM spends
    about 2.6 s loading classes (bench/results/startup-2026-12-06.md). It makes and
    removes a one-column table in a temporary local folder; once per JVM, never raises."""
    key = id(spark.sparkContext._gateway)
    if key in _LOADED or not builder_usable(spark):
        return None
    _LOADED.add(key)

    def load() -> None:
        import shutil
        import tempfile
        import time

        started = time.monotonic()
        folder = None
        try:
            folder = tempfile.mkdtemp(prefix="lakesink-delta-classes-")
            build_table(spark, f"file:{folder}", '{"type":"struct","fields":[{"name":"x",'
                        '"type":"long","nullable":true,"metadata":{}}]}', [], {})
        except Exception as exc:  # noqa: BLE001 - only a head start for the first table
            logger.info("loading Delta's classes ahead failed: %s", one_line(exc))
        else:
            logger.info("Delta's classes loaded ahead in %.1fs", time.monotonic() - started)
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    thread = threading.Thread(target=load, name="lakesink-delta-classes", daemon=True)
    thread.start()
    return thread
