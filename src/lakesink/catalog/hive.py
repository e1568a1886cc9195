"""A Hive metastore, through Spark's own Hive support (``catalog.type: hive``).

Spark is the metastore client: the session runs with ``spark.sql.catalogImplementation
hive`` (set by :func:`spark_conf` when lakesink builds the session, with the metastore's
``thrift://`` URI), so what lakesink registers is what Spark SQL, Hive and Trino find
by name, created the way a Spark job creates it.

**Parquet** (through the outbox, :mod:`lakesink.catalog.outbox`): the table is an
external data-source table ``USING parquet`` over the lake's table folder, made at the
first batch with the columns of the batch's files and the partition columns as
``STRING`` (the folders' text; the null folder is ``NULL``). For each batch, in order:

* columns its files hold that the table lacks, and columns it widened (``int`` ->
  ``bigint``, :func:`~lakesink.decode.evolution.can_widen`): the table's data schema is
  replaced in place through Spark's session catalog (``alterTableDataSchema``; the entry
  and its partitions stay);
* the partition folders it wrote that the table lacks: ``ALTER TABLE … ADD IF NOT EXISTS
  PARTITION (…) LOCATION '…'``.

Every step is idempotent, so a batch registered again after a crash (fault point
``after_registration``) changes nothing, and a crash between the steps is repaired when
the batch is registered again. Partitions come only from the batches' manifests (a lake
the catalog is new to registers every committed batch: the outbox's backlog), never from
listing folders. A Hive table's partitions are folders: the files of a registered
partition are read from the folder, so a later batch's files there are visible from
their publication (just before the batch's commit).

**Delta** (:class:`DeltaRegistrar`): the table ``USING delta LOCATION '…'`` once, after
the first commit (Delta needs its log to exist); the log holds the schema, partitions
and files, so Spark SQL by name reads exactly what the log commits.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakesink.catalog.base import Catalog, CommittedBatch
from lakesink.catalog.outbox import Registrar
from lakesink.errors import CatalogError, CatalogUnavailable, ConfigError, LayoutError, one_line
from lakesink.tables.formats import table_format

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql import types as T

    from lakesink.config.catalog import CatalogConfig, HiveCatalogConfig

logger = logging.getLogger(__name__)

#: the table property that names a Parquet table lakesink made (its generation)
GENERATION_PROPERTY = "lakesink.generation"
#: how a metastore that cannot be reached shows in Spark's errors
_UNREACHABLE = ("TTransportException", "Could not connect to meta store", "Connection refused",
                "Unable to instantiate", "SocketTimeoutException", "SocketException",
                "connect timed out", "Read timed out", "Timeout when executing method",
                "Communications link failure", "javax.jdo", "JDOException",
                "AlreadyExistsException")  # a race with another process: try again


def hive_name(name: str) -> str:
    """A Hive table name for a lake table's (letters, digits and ``_``; Hive keeps names
    in lower case): ``user-events`` -> ``user_events``."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def spark_conf(config: CatalogConfig) -> dict[str, str]:
    """The Spark settings a Hive catalog needs, set before the session starts (the
    user's ``spark.conf`` still wins)."""
    if config.type != "hive" or config.hive is None:
        return {}
    conf = {"spark.sql.catalogImplementation": "hive",
            # Hive's default waits 600 s on a metastore that accepted and went silent
            "spark.hadoop.hive.metastore.client.socket.timeout": "30s",
            "spark.hadoop.hive.metastore.connect.retries": "1",
            # partition values and column names come from the records: no ${...}
            # expansion in the statements lakesink writes
            "spark.sql.variable.substitute": "false"}
    if config.hive.uri:
        conf["spark.hadoop.hive.metastore.uris"] = config.hive.uri
    return conf


def quote(name: str) -> str:
    """A Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def literal(value: str | None) -> str:
    """A Spark SQL string literal (NULL for the null partition)."""
    if value is None:
        return "NULL"
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: how the metastore keeps a NULL partition value
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def same_location(a: str, b: str) -> bool:
    """``file:/x`` (how the metastore keeps it), ``file:///x/`` and ``file:///x`` agree;
    so do ``hdfs:///x`` and ``hdfs://nn:8020/x`` (the metastore qualifies a location
    with the default file system's authority)."""
    def norm(uri: str) -> tuple[str, str, str]:
        uri = re.sub(r"^file:/+", "file:///", uri.rstrip("/"))
        scheme, sep, rest = uri.partition("://")
        if not sep:
            return "", "", uri
        authority, _, path = rest.partition("/")
        return scheme, authority, path
    (sa, aa, pa), (sb, ab, pb) = norm(a), norm(b)
    return sa == sb and pa == pb and (aa == ab or not aa or not ab)


def _session_metastore(spark: SparkSession) -> str:
    """The metastore a session without ``catalog.hive.uri`` talks to."""
    try:
        uris = spark.sparkContext._jsc.hadoopConfiguration().get("hive.metastore.uris")
    except Exception:  # noqa: BLE001 - no JVM configuration to ask
        uris = None
    return str(uris or "embedded")


def partition_clause(values: dict[str, str | None], columns: list[str], folder: str) -> str:
    spec = ", ".join(f"{quote(c)} = {literal(values.get(c))}" for c in columns)
    return f"PARTITION ({spec}) LOCATION {literal(folder)}"


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def utc_created(millis: int) -> str:
    """A metastore creation time (ms since the epoch; Hive keeps seconds) as Java's
    ``Date.toString`` writes it in UTC: ``Sun Dec 06 12:12:46 UTC 2026``."""
    import datetime as dt

    t = dt.datetime.fromtimestamp(millis // 1000, tz=dt.timezone.utc)
    return (f"{_DAYS[t.weekday()]} {_MONTHS[t.month - 1]} {t.day:02d} "
            f"{t:%H:%M:%S} UTC {t.year}")


def sorted_error(exc: Exception, what: str) -> CatalogError:
    """A metastore that cannot be reached waits (:class:`CatalogUnavailable`); anything
    else it answered is a refusal (:class:`CatalogError`, the run stops)."""
    text = str(exc)
    first = (text.strip().splitlines() or [type(exc).__name__])[0][:400]
    if any(m in text for m in _UNREACHABLE):
        return CatalogUnavailable(f"{what}: the metastore cannot be reached ({first})")
    return CatalogError(f"{what}: {first}")


@dataclass(frozen=True)
class HeldTable:
    """A table as the metastore holds it (what :meth:`HiveCatalog._check` compares)."""

    provider: str
    location: str
    partition_by: tuple[str, ...]
    generation: str | None


class HiveCatalog(Catalog):
    """One lake table in a Hive metastore; Parquet through the outbox, or Delta."""

    def __init__(self, config: HiveCatalogConfig, spark: SparkSession, *, table: str,
                 location: str, partition_by: list[str], fmt: str) -> None:
        self.spark = spark
        self.database = config.database
        self.table = config.table or hive_name(table)
        self.location = location
        self.partition_by = partition_by
        self.format = fmt
        self.fq = f"{quote(self.database)}.{quote(self.table)}"
        # the marks are per metastore: another metastore (or the embedded one of a run
        # without a URI) has none of the registrations
        import hashlib

        where = config.uri or _session_metastore(spark)
        key = "|".join((where, self.database, self.table))
        self.id = f"hive-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
        self._parts = {p.lower() for p in partition_by}
        self.known = False  #: the table is in the metastore (Delta registers once)
        self._created: str | None = None  #: the Parquet table's generation, as seen

    def describe(self) -> str:
        return f"hive {self.database}.{self.table}"

    # -- Spark as the client ---------------------------------------------------------

    def _sql(self, statement: str, what: str) -> Any:
        try:
            return self.spark.sql(statement)
        except Exception as exc:  # noqa: BLE001 - sorted: wait or stop
            raise sorted_error(exc, what) from None

    def _exists(self) -> bool:
        """Whether the metastore holds the table: its entry only (Spark's
        ``catalog.tableExists`` also opens a Delta table's log, and fails when it is
        gone)."""
        try:
            return bool(self._jcatalog().tableExists(self._ident()))
        except Exception as exc:  # noqa: BLE001
            raise sorted_error(exc, "looking the table up") from None

    def _jcatalog(self) -> Any:  # noqa: ANN401
        """Spark's session catalog (the JVM's), for what SQL does not say."""
        return self.spark._jsparkSession.sessionState().catalog()

    def _ident(self) -> Any:  # noqa: ANN401
        """The table's ``TableIdentifier`` in the JVM."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        return jvm.org.apache.spark.sql.catalyst.TableIdentifier(
            self.table, jvm.scala.Option.apply(self.database))

    # -- the contract ----------------------------------------------------------------

    def prepare(self) -> None:
        conf = self.spark.conf
        if conf.get("spark.sql.catalogImplementation", "in-memory") != "hive":
            raise ConfigError("catalog.hive", "the Spark session runs without Hive support",
                              fix="lakesink run sets it; a session of your own needs "
                              "spark.sql.catalogImplementation=hive")
        conf.set("spark.sql.variable.substitute", "false")  # values from the records
        escaped = "spark.sql.parser.escapedStringLiterals"
        if conf.get(escaped, "false") == "true":
            raise ConfigError(f"spark.conf.{escaped}", "the Hive catalog's statements "
                              "quote values as Spark does by default",
                              fix=f"remove spark.conf.{escaped}")
        self._sql(f"CREATE DATABASE IF NOT EXISTS {quote(self.database)}",
                  "creating the database")
        if self._exists():
            held = self._held()
            self._check(held)
            if table_format(self.format).has_log:
                self._check_log()
            else:  # Parquet's generation (Delta is registered whole, by its log)
                self._created = held.generation
            self.known = True

    def generation(self) -> str | None:
        """The Parquet table's incarnation as :meth:`prepare` or :meth:`register` last
        saw it: a table lakesink made carries a random ``lakesink.generation`` property,
        told with its creation time (a table made again from ``SHOW CREATE TABLE``'s
        statement copies the property); another one by its creation time alone (to the
        second, as the metastore keeps it). A table dropped and made again is another
        one, without the partitions registered before. (A Delta table is registered
        whole, by its log: its registrar has no marks to reconcile.)"""
        return self._created

    def _generation_now(self) -> str | None:
        """The table's generation as the metastore holds it now (see :meth:`generation`)."""
        return self._held().generation

    def _held(self) -> HeldTable:
        """The table as the metastore holds it now, in one read (its ``CatalogTable``).

        The generation's creation time is the metastore's instant written in UTC as
        ``DESCRIBE``'s ``Created Time`` shows it in a UTC JVM (``Sun Dec 06 12:12:46 UTC
        2026``), not ``DESCRIBE``'s own text, which is in the JVM's default time zone: a
        restart in another time zone would take the same table for another one and
        register every batch again."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        try:
            meta = self._jcatalog().getTableMetadata(self._ident())
            made = meta.properties().get(GENERATION_PROPERTY)
            made = str(made.get()) if made.isDefined() else None
            created = utc_created(int(meta.createTime()))
            provider = meta.provider()
            where = meta.storage().locationUri()
            return HeldTable(
                # what DESCRIBE's "Provider" and "Location" print (Location: the path
                # decoded, so "x y", not "x%20y"); a Delta table's come from its log there
                provider=str(provider.get()).lower() if provider.isDefined() else "hive",
                location=str(jvm.org.apache.spark.sql.catalyst.catalog.CatalogUtils
                             .URIToString(where.get())) if where.isDefined() else "",
                partition_by=tuple(str(c) for c in meta.partitionSchema().fieldNames()),
                generation=(f"{made}@{created}" if made and re.fullmatch("[0-9a-f]{32}", made)
                            else created))
        except Exception as exc:  # noqa: BLE001
            # gone meanwhile, or its database (DESCRIBE said TABLE_OR_VIEW_NOT_FOUND for
            # both): register's retry makes it again
            if any(m in str(exc) for m in ("TABLE_OR_VIEW_NOT_FOUND", "SCHEMA_NOT_FOUND",
                                           "NoSuchTableException", "NoSuchDatabaseException")):
                raise CatalogError(f"describing the table: [TABLE_OR_VIEW_NOT_FOUND] "
                                   f"{self.database}.{self.table}") from None
            raise sorted_error(exc, "describing the table") from None

    def _check(self, held: HeldTable) -> None:
        """An existing table must be this lake table: same provider, folder and
        partition columns (else the start is refused, naming the key)."""
        if held.provider != self.format:
            raise LayoutError("catalog.hive.table", f"{self.database}.{self.table} exists as "
                              f"a {held.provider} table; this table is {self.format}",
                              fix="name another table (catalog.hive.table) or drop it")
        if not same_location(held.location, self.location):
            raise LayoutError("catalog.hive.table", f"{self.database}.{self.table} exists "
                              f"at {held.location}, not at {self.location}",
                              fix="name another table (catalog.hive.table) or drop it")
        # a Parquet table's partitions are the metastore's
        if not table_format(self.format).has_log and (
                [p.lower() for p in held.partition_by]
                != [p.lower() for p in self.partition_by]):
            raise LayoutError("table.partition_by", f"{self.database}.{self.table} is "
                              f"partitioned by {list(held.partition_by)}, the configuration by "
                              f"{self.partition_by}")

    def _check_log(self) -> None:
        """A registered Delta table must still have its log: one deleted (or moved)
        would be made again, empty, by the next commit, and served by this name without
        the rows it held. The start stops instead, saying what to do."""
        from py4j.protocol import Py4JJavaError

        from lakesink.tables.delta import has_commit
        from lakesink.tables.fs import HadoopFS

        try:
            committed = has_commit(HadoopFS(self.spark, self.location), self.location)
        except (Py4JJavaError, OSError) as exc:  # a store that does not answer: wait
            raise CatalogUnavailable(f"listing {self.location}/_delta_log: "
                                     f"{one_line(exc, name=False)}") from None
        if not committed:
            raise CatalogError(
                f"{self.database}.{self.table} is registered as the Delta table at "
                f"{self.location}, but its _delta_log has no commit (deleted or moved?): "
                "restore the log to keep the table's rows; or, to start the table afresh "
                f"without them, DROP TABLE {self.fq} (the data files stay, unreferenced) "
                "and the run registers the new table after its first commit")

    def register(self, batch: CommittedBatch) -> None:
        if table_format(self.format).has_log:  # the table, by its log, once
            self.register_table()
            return
        if not batch.files:
            return
        try:
            schema = (self.spark.read.option("mergeSchema", "true")
                      .parquet(*[f.path for f in batch.files]).schema)
        except Exception as exc:  # noqa: BLE001 - the lake's storage, not the catalog
            raise CatalogUnavailable(f"reading batch {batch.batch_id}'s footers: "
                                     f"{one_line(exc, name=False)}") from None
        fields = [f for f in schema.fields if f.name.lower() not in self._parts]
        try:
            if not self._exists():
                self._create(fields)
            else:
                self._evolve(fields)
            self._add_partitions(batch)
            # which table took the batch: one dropped and made again by another process
            # since the last look is another generation (the outbox registers every
            # batch to it)
            self._created = self._generation_now()
        except CatalogError as exc:
            if "TABLE_OR_VIEW_NOT_FOUND" not in str(exc):
                raise
            self._created = None  # dropped meanwhile: the next try makes it again
            raise CatalogUnavailable(f"the table was dropped while batch {batch.batch_id} "
                                     "was registered; it is registered again") from None

    def register_table(self) -> None:
        """Delta: the table by name, over its log."""
        self._sql(f"CREATE TABLE IF NOT EXISTS {self.fq} USING delta LOCATION "
                  f"{literal(self.location)}", "creating the table")
        self.known = True

    # -- Parquet ---------------------------------------------------------------------

    def _ddl(self, fields: list[T.StructField]) -> str:
        """Column definitions in Spark's own DDL (nested types, odd names quoted)."""
        from pyspark.sql import types as T

        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        struct = jvm.org.apache.spark.sql.types.DataType.fromJson(T.StructType(fields).json())
        return str(struct.toDDL())

    def _create(self, fields: list[T.StructField]) -> None:
        columns = self._ddl(fields)
        if self.partition_by:
            columns += ", " + ", ".join(f"{quote(c)} STRING" for c in self.partition_by)
        partitioned = (f" PARTITIONED BY ({', '.join(quote(c) for c in self.partition_by)})"
                       if self.partition_by else "")
        made = uuid.uuid4().hex  # tells this table from one made again in the same second
        self._sql(f"CREATE TABLE IF NOT EXISTS {self.fq} ({columns}) USING parquet"
                  f"{partitioned} LOCATION {literal(self.location)} TBLPROPERTIES "
                  f"({literal(GENERATION_PROPERTY)} = {literal(made)})", "creating the table")
        logger.info("catalog %s: table created at %s", self.describe(), self.location)

    def _evolve(self, fields: list[T.StructField]) -> None:
        """New columns are appended, widened ones widened, in place: the table's data
        schema is replaced through Spark's session catalog (which refuses to drop a
        column), so the entry and its partitions stay."""
        from pyspark.sql import types as T

        from lakesink.decode.evolution import can_widen

        table = self._sql(f"SELECT * FROM {self.fq}", "reading the table's schema").schema
        data = [f for f in table.fields if f.name.lower() not in self._parts]
        known = {f.name.lower(): f for f in table.fields}
        missing = [f for f in fields if f.name.lower() not in known]
        wider = {f.name.lower(): f for f in fields if f.name.lower() in known
                 and can_widen(known[f.name.lower()].dataType, f.dataType)}
        if not missing and not wider:
            return
        new = [T.StructField(f.name, wider[f.name.lower()].dataType, True)
               if f.name.lower() in wider else f for f in data]
        new += [T.StructField(f.name, f.dataType, True) for f in missing]
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        schema = jvm.org.apache.spark.sql.types.DataType.fromJson(T.StructType(new).json())
        try:
            self._jcatalog().alterTableDataSchema(self._ident(), schema)
        except Exception as exc:  # noqa: BLE001 - sorted: wait or stop
            raise sorted_error(exc, "altering the table's columns") from None
        logger.info("catalog %s: column(s) %s added, %s widened", self.describe(),
                    [f.name for f in missing], [f.name for f in wider.values()])

    def _add_partitions(self, batch: CommittedBatch) -> None:
        if not self.partition_by:
            return
        folders: dict[str, dict[str, str | None]] = {}
        for f in batch.files:
            folders.setdefault(f.path.rsplit("/", 1)[0], f.partition)
        # one clause per partition value: two folders with the same values (the null
        # folder and a literal __HIVE_DEFAULT_PARTITION__, which the metastore keeps for
        # NULL) would make the metastore refuse the whole statement, every time
        specs: dict[tuple[str | None, ...], str] = {}
        for folder, values in sorted(folders.items()):
            spec = tuple(None if values.get(c) == HIVE_NULL else values.get(c)
                         for c in self.partition_by)
            if spec in specs:
                logger.warning("catalog %s: folders %s and %s have the same partition "
                               "values for the metastore; only the first is registered",
                               self.describe(), specs[spec], folder)
                continue
            specs[spec] = folder
        clauses = " ".join(partition_clause(dict(zip(self.partition_by, spec, strict=True)),
                                            self.partition_by, folder)
                           for spec, folder in specs.items())
        self._sql(f"ALTER TABLE {self.fq} ADD IF NOT EXISTS {clauses}", "adding partitions")


class DeltaRegistrar(Registrar):
    """A Delta table in the metastore: registered once, after its first commit (the log
    must exist); it has no outbox, nothing per batch to register. Waits and backs off
    like the outbox while the metastore cannot be reached."""

    catalog: HiveCatalog

    def start(self) -> None:
        log = self.layout.table.rstrip("/") + "/_delta_log"
        if any(  # a commit (a staged one is not)
                "/" not in f.relative and f.relative.endswith((".json", ".checkpoint.parquet"))
                for f in self.fs.list_files(log)):
            self.pending = [(self.run, -1)]
        self.drain()

    def committed(self, batch_id: int) -> None:
        if not self.catalog.known:
            self.pending = [(self.run, batch_id)]
        self.drain()

    def _reconcile(self) -> None:
        """No marks to reconcile: the table is registered whole, once."""

    def _register(self, run: str, batch_id: int) -> None:
        if self.catalog.known:  # prepare found it
            return
        self.catalog.register_table()
        logger.info("catalog %s: the Delta table is registered", self.catalog.describe())
