"""Locate the JVM jars that the set-up step fetched with Maven (``jvm/pom.xml``).

``scripts/setup.sh`` runs ``mvn dependency:copy-dependencies`` per profile into
``jvm/jars`` (Spark connectors) and ``jvm/kafka-jars`` (the test/demo broker).
Installed elsewhere, point ``LAKESINK_JARS_DIR`` / ``LAKESINK_KAFKA_JARS_DIR`` at them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lakesink.errors import ServiceError

_VERSION_SUFFIX = re.compile(r"-\d[\w.\-]*\.jar$")


def repo_root() -> Path:
    """The source checkout this package runs from (src layout: ``<root>/src/lakesink``)."""
    return Path(__file__).resolve().parents[3]


def _jar_dir(env: str, default: str) -> Path:
    value = os.environ.get(env)
    return Path(value) if value else repo_root() / "jvm" / default


def artifact_name(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return _VERSION_SUFFIX.sub("", Path(jar).name)


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


#: connector artifacts per storage scheme family: a cluster application ships only the
#: ones its paths use (the AWS SDK bundle alone is 650 MB, copied to every executor)
STORAGE_ARTIFACTS = {
    "s3": {"bundle", "hadoop-aws", "analyticsaccelerator-s3"},
    "gs": {"gcs-connector"},
    "azure": {"hadoop-azure", "azure-storage", "azure-keyvault-core"},
}
SCHEME_FAMILY = {"s3": "s3", "s3a": "s3", "gs": "gs", "abfs": "azure", "abfss": "azure",
                 "wasb": "azure", "wasbs": "azure"}


def unused_storage_artifacts(uris: list[str]) -> set[str]:
    """The storage connectors none of ``uris`` (table and checkpoint paths) needs."""
    used = {SCHEME_FAMILY.get(u.split("://", 1)[0].lower()) for u in uris if "://" in u}
    return set().union(*(a for family, a in STORAGE_ARTIFACTS.items() if family not in used))


def connector_jars(skip: set[str] | None = None) -> list[Path]:
    """Connector jars for Spark's classpath, minus any artifact pyspark already ships
    (and the artifacts in ``skip``).

    Two versions of one artifact on a classpath (e.g. ``snappy-java``) fail in ways
    that are hard to read, so pyspark's own copy always wins.
    """
    folder = _jar_dir("LAKESINK_JARS_DIR", "jars")
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not jars:
        raise ServiceError(
            f"no connector jars in {folder}: run scripts/setup.sh (it fetches them with Maven)"
        )
    shipped = {artifact_name(p.name) for p in pyspark_jars_dir().glob("*.jar")} | (skip or set())
    return [j for j in jars if artifact_name(j.name) not in shipped]


def kafka_broker_classpath() -> str:
    folder = _jar_dir("LAKESINK_KAFKA_JARS_DIR", "kafka-jars")
    if not any(folder.glob("kafka_2.13-*.jar")):
        raise ServiceError(
            f"no Kafka broker jars in {folder}: run scripts/setup.sh (it fetches them with Maven)"
        )
    return str(folder / "*")
