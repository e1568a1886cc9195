"""Lake storage settings -> Hadoop FileSystem options, applied to a SparkSession.

``storage.s3`` (``s3a://``, ``s3://``), ``storage.gcs`` (``gs://``) and ``storage.azure``
(``abfss://``); local paths and ``hdfs://`` (configured by the cluster's own
``HADOOP_CONF_DIR``) need none. The options go into the
session's Hadoop configuration, which Spark's readers and writers and Delta's log all
use. Secret values are set there and nowhere else: never logged (``describe`` shows
which keys are set, not their values).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pydantic import SecretStr
    from pyspark.sql import SparkSession

    from lakesink.config.table import TableConfig

from lakesink.config.storage import AzureStorage, GcsStorage, S3Storage, StorageConfig
from lakesink.config.secrets import redact
from lakesink.errors import ConfigError
from lakesink.tables.formats import table_format
from lakesink.tables.fs import on_azure

logger = logging.getLogger(__name__)

S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"


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
    for key, value in {**s3.options, **_secrets(s3.secret_options)}.items():
        opts[key if key.startswith("fs.s3a.") else f"fs.s3a.{key}"] = value
    return opts


_GCS_SIZES = {"fs.gs.block.size": 64 << 20, "fs.gs.rewrite.max.chunk.size": 512 << 20,
              "fs.gs.outputstream.buffer.size": 8 << 20,
              "fs.gs.inputstream.inplace.seek.limit": 8 << 20,
              "fs.gs.inputstream.min.range.request.size": 2 << 20}


def gcs_options(gcs: GcsStorage) -> dict[str, str]:
    """Hadoop options for ``gs://`` (the GCS connector)."""
    opts = {"fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
            "fs.AbstractFileSystem.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS",
            # Hadoop 3.5's core-default.xml sets these (for its own gs:// client) with
            # unit suffixes, which the Google connector reads as plain numbers
            **{k: str(v) for k, v in _GCS_SIZES.items()}}
    if gcs.project_id:
        opts["fs.gs.project.id"] = gcs.project_id
    if gcs.service_account_keyfile:
        opts["fs.gs.auth.type"] = "SERVICE_ACCOUNT_JSON_KEYFILE"
        opts["fs.gs.auth.service.account.json.keyfile"] = gcs.service_account_keyfile
    if gcs.endpoint:
        opts["fs.gs.storage.root.url"] = gcs.endpoint
    for key, value in {**gcs.options, **_secrets(gcs.secret_options)}.items():
        opts[key if key.startswith("fs.gs.") else f"fs.gs.{key}"] = value
    return opts


def azure_account(uri: str) -> str | None:
    """The storage account of an ``abfs[s]://container@account.dfs.core.windows.net/…``
    URI (None: not such a URI)."""
    m = re.match(r"^abfss?://[^@/]+@([^./]+)\.", uri)
    return m.group(1) if m else None


def _azure_accounts(azure: AzureStorage, uris: Iterable[str]) -> list[str]:
    """The accounts a run reaches: the configured one, then the paths' own."""
    found = [azure.account] if azure.account else []
    return found + [a for a in dict.fromkeys(map(azure_account, uris)) if a and a not in found]


def _azure_creds(azure: AzureStorage, account: str) -> bool:
    """Whether the section's credentials are ``account``'s: the configured account's, or
    every path's when the section names none."""
    return azure.account in (None, account)


def _abfs_credentials(azure: AzureStorage, host: str) -> dict[str, str]:
    if azure.account_key:
        return {f"fs.azure.account.key.{host}": azure.account_key.get_secret_value()}
    if azure.sas_token:
        return {f"fs.azure.account.auth.type.{host}": "SAS",
                f"fs.azure.sas.fixed.token.{host}": azure.sas_token.get_secret_value()}
    if azure.client_id and azure.client_secret and azure.tenant_id:
        return {f"fs.azure.account.auth.type.{host}": "OAuth",
                f"fs.azure.account.oauth.provider.type.{host}":
                    "org.apache.hadoop.fs.azurebfs.oauth2.ClientCredsTokenProvider",
                f"fs.azure.account.oauth2.client.id.{host}": azure.client_id,
                f"fs.azure.account.oauth2.client.secret.{host}":
                    azure.client_secret.get_secret_value(),
                f"fs.azure.account.oauth2.client.endpoint.{host}":
                    f"https://login.microsoftonline.com/{azure.tenant_id}/oauth2/token"}
    return {}


def azure_options(azure: AzureStorage, uris: Iterable[str] = ()) -> dict[str, str]:
    """Hadoop options for ``abfs[s]://`` (hadoop-azure ABFS), scoped to each account of
    ``uris`` (and ``azure.account``). With ``endpoint`` (an emulator such as Azurite, which
    serves the Blob API only): requests go to ``<endpoint>/<account>`` and the account is
    one without a hierarchical namespace, reached through ABFS's Blob-endpoint client."""
    opts: dict[str, str] = {}
    if _azure_accounts(azure, uris):
        # hadoop-azure 3.5 sends its own metrics to the account, also from a JVM shutdown
        # hook that retries for minutes when the store is gone: a process that cannot end
        opts["fs.azure.metrics.collection.enabled"] = "false"
    for account in _azure_accounts(azure, uris):
        host = f"{account}.dfs.core.windows.net"
        if _azure_creds(azure, account):
            opts.update(_abfs_credentials(azure, host))
        if azure.endpoint:
            scheme, _, authority = azure.endpoint.partition("://")
            if ":" not in authority:
                authority += ":443" if scheme == "https" else ":80"
            # ABFS puts /<account> in the path when its endpoint is host:port (emulators)
            opts[f"fs.azure.abfs.endpoint.{host}"] = authority
            opts[f"fs.azure.account.hns.enabled.{host}"] = "false"
            opts[f"fs.azure.fns.account.service.type.{host}"] = "BLOB"
            if scheme == "http":
                opts["fs.azure.always.use.https"] = "false"
                # ABFS's Apache HTTP client wants TLS; the JDK's speaks plain HTTP
                opts[f"fs.azure.networking.library.{host}"] = "JDK_HTTP_URL_CONNECTION"
    for key, value in {**azure.options, **_secrets(azure.secret_options)}.items():
        opts[key if key.startswith("fs.azure.") else f"fs.azure.{key}"] = value
    return opts


def hadoop_options(storage: StorageConfig, uris: Iterable[str] = ()) -> dict[str, str]:
    """The Hadoop options of the storage sections, for a run on ``uris`` (its tables'
    base paths and its checkpoint)."""
    uris = list(uris)
    opts = {**s3a_options(storage.s3), **gcs_options(storage.gcs),
            **azure_options(storage.azure, uris)}
    if any(p.startswith("gs://") for p in uris):
        # the GCS connector 3.1 implements vectored reads against Hadoop 3.4's API, which
        # Hadoop 3.5 changed (NoSuchMethodError): let Parquet read ranges one by one
        opts["parquet.hadoop.vectored.io.enabled"] = "false"
    return opts


def uris(paths: Iterable[str]) -> list[str]:
    """``paths`` (e.g. :meth:`~lakesink.config.plan.RunPlan.paths`) as URIs."""
    from lakesink.tables.fs import to_uri

    return list(dict.fromkeys(to_uri(p) for p in paths if p))


def on_s3(path: str) -> bool:
    return path.startswith(("s3a://", "s3://"))


def writer_lease_s(storage: StorageConfig, table: TableConfig,
                   fmt: str | None = None) -> float:
    """The TTL of the lease of a writer of a ``fmt`` table (default: ``table.format``)
    under ``table.base_path`` (0: none): every table has one, except a Delta table on S3
    with the DynamoDB log store (several writers by design)."""
    if (table_format(fmt or table.format).one_driver_on_s3
            and storage.s3.delta_log_store == "dynamodb" and on_s3(table.base_path)):
        return 0.0
    return table.writer_lease_s


def lease_options(storage: StorageConfig, table: TableConfig,
                  fmt: str | None = None) -> dict[str, Any]:
    """The lease keywords of a writer of a ``fmt`` table (default: ``table.format``;
    dead-letter tables pass ``dlq.format``): its TTL, and whether the lease covers the
    whole table (Delta on S3 with the single-driver log store, where two writers of any
    checkpoints lose commits; Delta on Azure, whose log store renames a file into the log
    and hadoop-azure's rename on a Blob account checks the name first, then copies) or
    one checkpoint's writer (elsewhere: a dead-letter
    replay, under its own app id, may write beside a running stream)."""
    whole = (table_format(fmt or table.format).one_driver_on_s3
             and ((on_s3(table.base_path) and storage.s3.delta_log_store == "single_driver")
                  or on_azure(table.base_path)))
    return {"lease_s": writer_lease_s(storage, table, fmt), "lease_per_table": whole}


#: Delta's multi-writer log store for S3 (jar: io.delta:delta-storage-s3-dynamodb)
DYNAMODB_LOG_STORE = "io.delta.storage.S3DynamoDBLogStore"


def spark_conf(storage: StorageConfig) -> dict[str, str]:
    """Spark settings the storage sections imply (set before the session starts)."""
    s3 = storage.s3
    if s3.delta_log_store != "dynamodb":
        return {}
    prefix = "spark.io.delta.storage.S3DynamoDBLogStore"
    conf = {"spark.delta.logStore.s3a.impl": DYNAMODB_LOG_STORE,
            "spark.delta.logStore.s3.impl": DYNAMODB_LOG_STORE,
            f"{prefix}.ddb.tableName": s3.dynamodb_table}
    region = s3.dynamodb_region or s3.region
    if region:
        conf[f"{prefix}.ddb.region"] = region
    return conf


def check_log_store(spark: SparkSession, storage: StorageConfig) -> None:
    """The DynamoDB log store's class must be on the classpath (it is not in Delta's
    own jars); a ConfigError (exit 2) before any data moves, else."""
    if storage.s3.delta_log_store != "dynamodb":
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        jvm.org.apache.spark.util.Utils.classForName(DYNAMODB_LOG_STORE, False, False)
    except Exception:
        raise ConfigError(
            "storage.s3.delta_log_store",
            f"dynamodb needs {DYNAMODB_LOG_STORE}, which is not on the classpath",
            fix="add the jar, e.g. spark.conf: {spark.jars.packages: "
            "io.delta:delta-storage-s3-dynamodb:4.4.0}") from None


def _secrets(options: dict[str, SecretStr]) -> dict[str, str]:
    return {k: v.get_secret_value() for k, v in options.items()}


def describe(opts: dict[str, str]) -> dict[str, str]:
    """The options with every secret value replaced (for logs and ``validate``)."""
    return redact(opts)


def apply(spark: SparkSession, storage: StorageConfig, uris: Iterable[str] = ()) -> None:
    """Set the storage options on the session's Hadoop configuration (for a run on
    ``uris``: see :func:`hadoop_options`)."""
    check_log_store(spark, storage)
    opts = hadoop_options(storage, uris)
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in opts.items():
        conf.set(key, value)
    logger.debug("storage options: %s", describe(opts))


#: S3A options that change where credentials come from: the Arrow tasks' S3 client
#: (pyarrow) cannot follow them, so such tables stay on Spark's writer
_CREDENTIAL_OPTIONS = ("aws.credentials.provider", "assumed.role", "custom.signers",
                       "bucket.", "delegation.token")


def task_filesystem(storage: StorageConfig, base: str) -> tuple[str, dict[str, Any]] | str:
    """How the Arrow path's tasks write under ``base``: ``("local", {})``, ``("s3",
    pyarrow.fs.S3FileSystem keywords)``, or why they cannot (the table then keeps
    Spark's writer). The keywords hold secrets: they travel with the task function, as
    the Hadoop options do, and are never logged."""
    if base.startswith("file:"):
        return "local", {}
    if on_azure(base):
        return _azure_task_filesystem(storage.azure, base)
    if not on_s3(base):
        return f"the Arrow path writes to local disk, S3 and Azure; " \
            f"{base.split(':', 1)[0]}:// keeps Spark's writer"
    s3 = storage.s3
    if s3.profile:
        return "storage.s3.profile is read by S3A only; the table keeps Spark's writer"
    odd = [k for k in {**s3.options, **s3.secret_options}
           if any(k.removeprefix("fs.s3a.").startswith(p) for p in _CREDENTIAL_OPTIONS)]
    if odd:
        return f"storage.s3 options {', '.join(sorted(odd))} are S3A's own; the table " \
            "keeps Spark's writer"
    kwargs: dict[str, Any] = {}
    if s3.endpoint:
        scheme, _, host = s3.endpoint.partition("://")
        kwargs.update(endpoint_override=host, scheme=scheme)
    kwargs["region"] = s3.region or "us-east-1"
    path_style = s3.path_style_access if s3.path_style_access is not None else bool(s3.endpoint)
    kwargs["force_virtual_addressing"] = not path_style
    if s3.access_key_id and s3.secret_access_key:
        kwargs["access_key"] = s3.access_key_id.get_secret_value()
        kwargs["secret_key"] = s3.secret_access_key.get_secret_value()
        if s3.session_token:
            kwargs["session_token"] = s3.session_token.get_secret_value()
    return "s3", kwargs


#: ABFS options that change how it authenticates: pyarrow and delta-rs cannot follow them
_ABFS_AUTH_OPTIONS = ("account.auth.type", "account.oauth", "sas.token.provider",
                      "account.key.", "sas.fixed.token")


def _azure_task_filesystem(azure: AzureStorage, base: str) -> tuple[str, dict[str, Any]] | str:
    """:func:`task_filesystem` on Azure: ``("azure", pyarrow.fs.AzureFileSystem
    keywords)`` (the path's account, the section's credentials — none: Azure's default
    credential chain —, an emulator's endpoint)."""
    account = azure_account(base)
    if account is None or not (azure.endpoint or re.match(
            r"^abfss?://[^@/]+@[^./]+\.dfs\.core\.windows\.net(/|$)", base)):
        # pyarrow and delta-rs would address <account>.blob.core.windows.net
        return "an Azure path other than abfs[s]://container@account.dfs.core.windows.net/…; " \
            "the table keeps Spark's writer"
    odd = [k for k in {**azure.options, **azure.secret_options}
           if any(k.removeprefix("fs.azure.").startswith(p) for p in _ABFS_AUTH_OPTIONS)]
    if odd:
        return f"storage.azure options {', '.join(sorted(odd))} are ABFS's own; the table " \
            "keeps Spark's writer"
    kwargs: dict[str, Any] = {"account_name": account}
    if _azure_creds(azure, account):
        if azure.account_key:
            kwargs["account_key"] = azure.account_key.get_secret_value()
        elif azure.sas_token:
            kwargs["sas_token"] = azure.sas_token.get_secret_value()
        elif azure.client_id and azure.client_secret and azure.tenant_id:
            kwargs.update(client_id=azure.client_id, tenant_id=azure.tenant_id,
                          client_secret=azure.client_secret.get_secret_value())
    if azure.endpoint:
        scheme, _, authority = azure.endpoint.partition("://")
        kwargs.update(blob_storage_authority=authority, blob_storage_scheme=scheme,
                      dfs_storage_authority=authority, dfs_storage_scheme=scheme)
    return "azure", kwargs


def delta_task_filesystem(storage: StorageConfig, base: str) -> tuple[str, dict[str, Any]] | str:
    """:func:`task_filesystem` for a Delta table, whose Arrow-path batches delta-rs
    commits: on S3 with conditional puts, so not beside delta-spark's DynamoDB log
    store (several writers by design, coordinated by a lock delta-rs would not take)."""
    if on_s3(base) and storage.s3.delta_log_store == "dynamodb":
        return ("storage.s3.delta_log_store: dynamodb: delta-spark's DynamoDB log store "
                "coordinates the writers; the table keeps Spark's writer")
    if (on_s3(base) or on_azure(base)) and any(c in base for c in "#%?"):
        # delta-rs reads its table location as a URL, S3A and pyarrow take it literally
        return "the table's path holds #, % or ?; the table keeps Spark's writer"
    found = task_filesystem(storage, base)
    if not isinstance(found, str) and found[0] == "s3" and storage.s3.endpoint \
            and found[1].get("force_virtual_addressing"):
        # delta-rs' S3 client wants the bucket inside such an endpoint; not tested here
        return ("storage.s3.endpoint with virtual-host addressing "
                "(path_style_access: false); the table keeps Spark's writer")
    return found
