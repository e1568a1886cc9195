"""Lake storage settings -> Hadoop FileSystem options, applied to a SparkSession.

Only S3 needs settings today (``storage.s3``); local paths, ``hdfs://`` and any store
whose Hadoop connector reads its own configuration need none. The options go into the
session's Hadoop configuration, which Spark's readers and writers and Delta's log all
use. Secret values are set there and nowhere else: never logged (``describe`` shows
which keys are set, not their values).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.config.models import LakesinkConfig, S3Storage

logger = logging.getLogger(__name__)

S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_SECRET_KEYS = ("fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token")


def s3a_options(s3: S3Storage) -> dict[str, str]:
    """Hadoop options for ``s3a://`` (and ``s3://``, mapped to S3A)."""
    opts = {
        "fs.s3.impl": S3A,
        "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    if s3.endpoint:
        opts["fs.s3a.endpoint"] = s3.endpoint
        opts["fs.s3a.connection.ssl.enabled"] = str(s3.endpoint.startswith("https")).lower()
    path_style = s3.path_style_access if s3.path_style_access is not None else bool(s3.endpoint)
    opts["fs.s3a.path.style.access"] = str(path_style).lower()
    if s3.region:
        opts["fs.s3a.endpoint.region"] = s3.region
    elif s3.endpoint:  # a third-party store: any fixed region (not sdk/auto/ec2)
        opts["fs.s3a.endpoint.region"] = "us-east-1"
    if s3.access_key_id and s3.secret_access_key:
        opts["fs.s3a.access.key"] = s3.access_key_id.get_secret_value()
        opts["fs.s3a.secret.key"] = s3.secret_access_key.get_secret_value()
        if s3.session_token:
            opts["fs.s3a.session.token"] = s3.session_token.get_secret_value()
            opts["fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")
    elif s3.profile:
        opts["fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.auth.ProfileAWSCredentialsProvider")
        opts["fs.s3a.auth.profile.name"] = s3.profile
    for key, value in s3.options.items():
        opts[key if key.startswith("fs.s3a.") else f"fs.s3a.{key}"] = value
    return opts


def hadoop_options(cfg: LakesinkConfig) -> dict[str, str]:
    return s3a_options(cfg.storage.s3)


def describe(opts: dict[str, str]) -> dict[str, str]:
    """The options with every secret value replaced (for logs and ``validate``)."""
    return {k: ("**********" if k in _SECRET_KEYS else v) for k, v in opts.items()}


def apply(spark: SparkSession, cfg: LakesinkConfig) -> None:
    """Set the storage options on the session's Hadoop configuration."""
    opts = hadoop_options(cfg)
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in opts.items():
        conf.set(key, value)
    logger.debug("storage options: %s", describe(opts))
