"""The ``storage`` section: S3 (and S3-compatible stores), GCS and Azure settings."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from lakesink.config.base import Section, stringify_map
from lakesink.config.secrets import refuse_secrets


class _StoreSection(Section):
    """What every storage section has: ``options`` (plain, refused when a key holds a
    secret) and ``secret_options`` (env or secret file only)."""

    store: ClassVar[str] = ""
    secret_options: dict[str, SecretStr] = Field(
        default_factory=dict, description="options whose values are secret (encryption "
        "keys, tokens…): env or secret file only")

    _strings = field_validator("options", "secret_options", mode="before",
                               check_fields=False)(stringify_map)

    @field_validator("options", check_fields=False)
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        refuse_secrets(value, f"storage.{cls.store}.options",
                       f"storage.{cls.store}.secret_options or the section's credential "
                       "fields")
        return value


def _endpoint_url(value: str | None) -> str | None:
    if value is not None and not re.match(r"^https?://[^/\s]+/?$", value):
        raise ValueError("use http(s)://host[:port]")
    return value.rstrip("/") if value else value


class S3Storage(_StoreSection):
    """S3 and S3-compatible stores (Hadoop S3A) for ``s3a://`` and ``s3://`` paths.

    Unset values fall back to the standard AWS variables (``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``).
    Without keys, S3A's default chain finds credentials (``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, then the instance role)."""

    endpoint: str | None = Field(default=None, description="e.g. http://127.0.0.1:8333; "
                                 "unset: AWS")
    region: str | None = Field(default=None, description="signing region")
    path_style_access: bool | None = Field(
        default=None, description="bucket in the path, not the host name; default: on when "
        "an endpoint is set (S3-compatible stores)")
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    profile: str | None = Field(default=None, description="an AWS profile "
                                "(~/.aws/credentials) to take credentials from")
    delta_log_store: Literal["single_driver", "dynamodb"] = Field(
        default="single_driver", description="Delta's log store for S3: single_driver (one "
        "writer per table, enforced by a writer lease) or dynamodb (several writers; needs "
        "the delta-storage-s3-dynamodb jar and a DynamoDB table)")
    dynamodb_table: str = Field(default="delta_log", description="delta_log_store: dynamodb "
                                "— the DynamoDB table (created if missing)")
    dynamodb_region: str | None = Field(default=None, description="its region; default: "
                                        "storage.s3.region")
    store: ClassVar[str] = "s3"
    options: dict[str, str] = Field(default_factory=dict,
                                    description="any other S3A option, fs.s3a.<name> -> value")

    _endpoint = field_validator("endpoint")(_endpoint_url)

    @model_validator(mode="after")
    def _keys(self) -> S3Storage:
        if bool(self.access_key_id) != bool(self.secret_access_key):
            raise ValueError("storage.s3: set both access_key_id and secret_access_key, or "
                             "neither (then the default credential chain is used)")
        return self


class GcsStorage(_StoreSection):
    """Google Cloud Storage (``gs://``, the GCS connector). Unset: Application Default
    Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server)."""

    project_id: str | None = None
    service_account_keyfile: str | None = Field(
        default=None, description="path of a service account JSON key file")
    endpoint: str | None = Field(default=None, description="root URL of the JSON API "
                                 "(an emulator such as fake-gcs-server)")
    store: ClassVar[str] = "gcs"
    options: dict[str, str] = Field(default_factory=dict,
                                    description="any other connector option, fs.gs.<name>")


class AzureStorage(_StoreSection):
    """Azure Blob Storage and Data Lake Storage Gen2, for
    ``abfss://container@account.dfs.core.windows.net/…`` paths (``abfs://`` without TLS):
    Spark through hadoop-azure's ABFS, the Arrow path through pyarrow and delta-rs.
    Credentials: an account key, a SAS token, or a service principal (client
    id/secret/tenant)."""

    account: str | None = Field(default=None, description="storage account name (the "
                                "credentials below are its; default: the path's account)")
    endpoint: str | None = Field(
        default=None, description="an emulator's Blob endpoint, e.g. http://127.0.0.1:10000 "
        "(Azurite): requests go to <endpoint>/<account>/<container> and the account is "
        "read as one without a hierarchical namespace; unset: Azure")
    account_key: SecretStr | None = None
    sas_token: SecretStr | None = None
    client_id: str | None = None
    client_secret: SecretStr | None = None
    tenant_id: str | None = None
    store: ClassVar[str] = "azure"
    options: dict[str, str] = Field(default_factory=dict,
                                    description="any other ABFS option, fs.azure.<name>")

    _endpoint = field_validator("endpoint")(_endpoint_url)


class StorageConfig(Section):
    s3: S3Storage = Field(default_factory=S3Storage)
    gcs: GcsStorage = Field(default_factory=GcsStorage)
    azure: AzureStorage = Field(default_factory=AzureStorage)
