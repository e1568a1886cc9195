"""The one place a SparkSession is built.

Embedded (``local[*]``) by default; ``spark.master`` or ``spark-submit`` puts the same
code on a cluster. The connector jars fetched by the set-up step go on the classpath,
Python workers use the running interpreter, and local mode gets confs that suit a
small machine (and the throughput garbage collector). User ``spark.conf`` entries win
over every default here.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lakesink.errors import one_line
from lakesink.runtime.jars import connector_jars, unused_storage_artifacts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

#: lakesink's defaults (sized for a small machine); every one can be overridden by
#: ``spark.conf``. Only settings that differ from Spark's own defaults are listed.
DEFAULTS: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.sql.streaming.minBatchesToRetain": "100",
    # Delta Lake (the jars come from jvm/pom.xml)
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # rebuilding a Delta snapshot's state is a shuffle: 50 partitions by default
    "spark.databricks.delta.snapshotPartitions": "4",
    # Delta's VACUUM lists the table in this many tasks (and Spark lists more than 32
    # paths so): Spark's default, 10,000, made a VACUUM of a near-empty table take 24 s
    # instead of 5 on 2 cores
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
    # the Python workers' Arrow memory from malloc, not jemalloc: jemalloc kept each
    # worker's freed chunks; 1 M events (bench/run.py): 90 MiB less peak RSS per worker,
    # no slower (bench/results/memory-2026-12-06.md)
    "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "system",
    # and malloc's blocks of 4 MiB and more mapped on their own, returned when freed
    # (glibc raises this threshold as big blocks are freed, up to 32 MiB, and keeps
    # what falls below it): 5 M events, 80 MiB less peak RSS, no slower within noise
    "spark.executorEnv.MALLOC_MMAP_THRESHOLD_": "4194304",
    # PySpark 4 wraps every Column function in a call-site capture for DataFrame error
    # context (an inspect.stack() and five py4j calls each; a batch's plans make
    # hundreds): off, building a when/col/lit column and its plan takes half the time
    # (9 ms instead of 18 on 2 cores); an error names the expression, not the line
    # of lakesink that built it
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Spark redacts matching keys/values in its UI, event log and plan strings.
    "spark.redaction.regex": "(?i)secret|password|token|access[.]?key|jaas",
}


#: lakesink's own Java functions (``jvm/udf``, compiled by ``scripts/setup.sh`` into
#: ``jvm/jars/lakesink-udf.jar``): SQL name -> (class, return type). Each has a Spark
#: expression fallback where it is used, so a session without the jar still works.
JVM_FUNCTIONS: dict[str, tuple[str, str]] = {
    "lakesink_count_colons": ("dev.lakesink.udf.CountColons", "int"),
}


def register_jvm_functions(spark: SparkSession) -> list[str]:
    """Register :data:`JVM_FUNCTIONS` whose class is on the classpath; returns their
    names. A missing class is logged and skipped."""
    registered = []
    for name, (cls, returns) in JVM_FUNCTIONS.items():
        try:
            spark.udf.registerJavaFunction(name, cls, returns)
        except Exception as exc:  # noqa: BLE001 - py4j wraps ClassNotFoundException
            logger.info("%s not registered (%s): the slower Spark expression is used",
                        name, one_line(exc, name=False) or exc)
            continue
        registered.append(name)
    return registered


def has_function(spark: SparkSession | None, name: str) -> bool:
    """Whether ``name`` is a function of the session (e.g. one of :data:`JVM_FUNCTIONS`)."""
    return spark is not None and bool(spark.catalog.functionExists(name))


#: the collector lakesink picks for an embedded JVM (see :func:`local_gc_options`)
LOCAL_GC = "-XX:+UseParallelGC"
#: and its young generation at a sixteenth of the heap (ParallelGC's default is a
#: third: Eden is touched whole between two collections, and a micro-batch's garbage
#: dies young either way)
LOCAL_YOUNG = "-XX:NewRatio=15"
_GC_FLAG = re.compile(r"-XX:[+]Use\w*GC\b")
_YOUNG_FLAG = re.compile(r"-Xmn\S|-XX:(?:NewRatio|NewSize|MaxNewSize)=")
_JAVA_OPTION_KEYS = ("spark.driver.defaultJavaOptions", "spark.driver.extraJavaOptions")


def spark_defaults_file(env: Mapping[str, str]) -> dict[str, str]:
    """The ``spark-defaults.conf`` Spark's launcher will read (``$SPARK_CONF_DIR``, else
    ``$SPARK_HOME/conf``), as a dict; empty when there is none."""
    conf_dir = env.get("SPARK_CONF_DIR") or (
        str(Path(env["SPARK_HOME"]) / "conf") if env.get("SPARK_HOME") else None)
    path = Path(conf_dir) / "spark-defaults.conf" if conf_dir else None
    if path is None or not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        parts = line.strip().split(None, 1)
        if parts and not parts[0].startswith("#"):
            out[parts[0]] = parts[1].strip() if len(parts) > 1 else ""
    return out


def local_gc_options(settings: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """``spark.driver.defaultJavaOptions`` with the throughput collector added, or
    ``None`` when some setting already picks a collector (two would stop the JVM).

    In local mode one JVM runs the driver and every task, and a micro-batch is a burst
    of CPU-bound work: ParallelGC leaves the tasks more CPU than the default G1 (whose
    write barriers and concurrent threads cost on every allocation), for pauses a
    batch does not notice with a heap of a few GiB. Measured on 2 cores, 3 M events,
    ``bench/experiments/cold_runs.py``: 7–9 % less wall time (docs/benchmark.md).
    :data:`LOCAL_YOUNG` keeps about 200 MiB less of the 1 GiB heap resident, no slower
    (``bench/results/memory-2026-12-06.md``); not added when some setting already sizes
    the young generation (``-Xmn``, ``NewRatio``, ``NewSize``, ``MaxNewSize``).
    """
    defaults = spark_defaults_file(env)
    chosen = [settings.get(k) or defaults.get(k, "") for k in _JAVA_OPTION_KEYS]
    chosen += [env.get("JAVA_TOOL_OPTIONS", ""), env.get("JDK_JAVA_OPTIONS", "")]
    if any(_GC_FLAG.search(opts) for opts in chosen):
        return None
    young = "" if any(_YOUNG_FLAG.search(opts) for opts in chosen) else f" {LOCAL_YOUNG}"
    return f"{chosen[0]} {LOCAL_GC}{young}".strip()


#: the driver JVM's log4j2 configuration (no start-up banner; see the file)
LOG4J2 = Path(__file__).with_name("log4j2.properties")


def driver_logging(java_options: str, log_level: str) -> str:
    """``java_options`` with lakesink's log4j2 configuration at ``log_level``, unless
    the user's options name their own."""
    if "log4j.configurationFile" in java_options or "log4j2.configurationFile" in java_options:
        return java_options
    ours = f"-Dlog4j.configurationFile=file:{LOG4J2} -Dlakesink.spark.level={log_level}"
    return f"{java_options} {ours}".strip()


def build_spark_session(
    *,
    master: str | None = "local[*]",
    app_name: str = "lakesink",
    conf: Mapping[str, str] | None = None,
    driver_memory: str | None = "1g",
    log_level: str = "WARN",
    extra_jars: list[str] | None = None,
    storage_uris: list[str] | None = None,
) -> SparkSession:
    """Build (or return the running) SparkSession with lakesink's jars and confs.

    Args:
        master: Spark master URL; ``None`` leaves it (and the jars: ``--jars "$(lakesink
            jars -c …)"``) to ``spark-submit``.
        app_name: the application name shown by the cluster manager.
        conf: user ``spark.*`` settings; they override every default here.
        driver_memory: heap of the driver JVM (in local mode also the executors').
        log_level: Spark's log level after start.
        extra_jars: more jars for the classpath.
        storage_uris: the table and checkpoint paths; on a cluster only the storage
            connectors they need are shipped to the executors.
    """
    # Workers must run this interpreter (the venv's), not whatever python3 is on PATH.
    local = master is not None and master.startswith("local")
    if local:  # one machine: the tasks' Python is this one
        os.environ["PYSPARK_PYTHON"] = sys.executable
    else:  # a cluster's executors may have their own (a packed venv): keep the user's
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master is None or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    if master is None:  # under spark-submit: its --jars (``lakesink jars``) or --packages
        jars = list(extra_jars or [])
    else:
        skip = None if local else unused_storage_artifacts(storage_uris or [])
        jars = [str(p) for p in connector_jars(skip)] + list(extra_jars or [])
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings: dict[str, str] = dict(DEFAULTS)
    if local:
        # Embedded mode talks to itself only: bind to loopback, never to the LAN.
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    if driver_memory:
        settings["spark.driver.memory"] = driver_memory
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    user_jars = [j for j in settings.pop("spark.jars", "").split(",") if j]
    if local:
        # One JVM: the connector jars go on its class path where they lie. Through
        # spark.jars, Spark would copy every one (700 MB with the AWS bundle) into a
        # temp folder per session, which a killed process leaves behind.
        extra = [p for p in settings.get("spark.driver.extraClassPath", "").split(":") if p]
        settings["spark.driver.extraClassPath"] = ":".join([*jars, *extra])
        jars = []
        gc = local_gc_options(settings, os.environ)
        if gc is not None:
            settings["spark.driver.defaultJavaOptions"] = gc
    if master is not None:  # this process starts the driver JVM: its logging is ours
        settings["spark.driver.extraJavaOptions"] = driver_logging(
            settings.get("spark.driver.extraJavaOptions", ""), log_level)
    if jars or user_jars:
        settings["spark.jars"] = ",".join([*jars, *user_jars])
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register_jvm_functions(spark)
    import lakesink

    logger.info("spark %s started (master=%s); lakesink %s from %s", spark.version,
                spark.sparkContext.master, lakesink.__version__,
                os.path.dirname(lakesink.__file__))
    return spark
