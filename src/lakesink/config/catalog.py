"""The ``catalog`` section: Iceberg REST, the Quix catalog, a Hive metastore."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from lakesink.config.base import Section


class QuixCatalogConfig(Section):
    """The Quix lakehouse catalog (``catalog.type: quix``): see ``docs/catalogs.md``."""

    url: str | None = Field(default=None, description="the catalog's base URL "
                            "(Quix__Lakehouse__Catalog__Url, CATALOG_URL)")
    auth_token: SecretStr | None = Field(
        default=None, description="Bearer token; env or secret file only "
        "(Quix__Lakehouse__Catalog__AuthToken, CATALOG_AUTH_TOKEN)")
    namespace: str = Field(default="default", description="CATALOG_NAMESPACE")
    auto_discover: bool = Field(
        default=True, description="create the table in the catalog when it is not there "
        "(AUTO_DISCOVER); off: files are registered once someone else created it")
    timeout_s: float = Field(default=10.0, gt=0, description="per request")


def masked_uri(uri: str) -> str:
    """``uri`` with the password of its user info and any secret-looking query value
    shown as ``**********`` (a SQLAlchemy URL may hold a password)."""
    scheme, sep, rest = uri.partition("://")
    if sep and "@" in rest:
        userinfo, _, host = rest.rpartition("@")  # the host never holds an @
        user, colon, _ = userinfo.partition(":")
        if colon:
            uri = f"{scheme}://{user}:**********@{host}"
    return re.sub(r"(?i)([?&][^=&]*(?:password|pwd|secret|token|credential)[^=&]*=)[^&]*",
                  r"\1**********", uri)


class IcebergCatalogConfig(Section):
    """An Iceberg catalog through pyiceberg (``catalog.type: iceberg``): see
    ``docs/catalogs.md``."""

    kind: Literal["rest", "sql"] = Field(
        default="rest", description="rest (an Iceberg REST catalog) or sql (pyiceberg's "
        "SQL catalog, e.g. sqlite:///lake/catalog.db for local disk)")
    uri: str = Field(description="http://host:8181 (rest) or a SQLAlchemy URL (sql)")
    warehouse: str | None = None
    name: str = Field(default="default", description="the catalog's name (the SQL "
                      "catalog keeps tables per catalog name: readers use the same)")
    namespace: str = "default"
    table: str | None = Field(default=None, description="default: the table's name")
    timeout_s: float = Field(default=30.0, gt=0, description="rest: the longest wait for "
                             "one HTTP answer (then the batch's registration waits)")
    properties: dict[str, str] = Field(
        default_factory=dict, description="more pyiceberg catalog / FileIO properties "
        "(s3.endpoint, …); secret-bearing ones are refused here: use secret_properties")
    secret_properties: dict[str, SecretStr] = Field(
        default_factory=dict, description="credential, token, s3.secret-access-key, …: "
        "env or secret file only")

    @field_serializer("uri", when_used="json")
    def _masked(self, value: str) -> str:
        """``lakesink validate`` shows a database URL's password as ``**********``."""
        return masked_uri(value)

    @field_validator("properties")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if any(w in key.lower() for w in ("credential", "token", "secret", "password",
                                               "access-key")):
                raise ValueError(f"catalog.iceberg.properties.{key}: a secret; set it in "
                                 f"catalog.iceberg.secret_properties (env or secret file)")
        return value


class HiveCatalogConfig(Section):
    """A Hive metastore through Spark's own Hive support (``catalog.type: hive``): see
    ``docs/catalogs.md``."""

    uri: str | None = Field(
        default=None, description="thrift://host:9083; unset: the metastore the Spark "
        "session is configured with (spark.hadoop.hive.metastore.uris, hive-site.xml), "
        "else an embedded Derby one in the working folder")
    database: str = Field(default="default", description="created when missing")
    table: str | None = Field(default=None, description="default: the table's name")

    @field_validator("uri")
    @classmethod
    def _thrift(cls, value: str | None) -> str | None:
        if value is not None and not all(u.strip().startswith("thrift://")
                                         for u in value.split(",")):
            raise ValueError("catalog.hive.uri: thrift://host:port (comma-separated for "
                             f"several metastores), got {value!r}")
        return value

    @field_validator("database", "table")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_]+", value):
            raise ValueError(f"{value!r}: a Hive name holds letters, digits and _ only")
        return value


class CatalogConfig(Section):
    """Where committed batches are registered after their commit (off by default)."""

    type: Literal["none", "quix", "iceberg", "hive"] = Field(
        default="none", description="none (default), quix, iceberg or hive; set by the "
        "section given")
    quix: QuixCatalogConfig | None = None
    iceberg: IcebergCatalogConfig | None = None
    hive: HiveCatalogConfig | None = None
    retry_initial_s: float = Field(default=1.0, gt=0, description="the first wait after "
                                   "a failed registration; doubles up to retry_max_s")
    retry_max_s: float = Field(default=60.0, gt=0)
    from_environment: bool = Field(
        default=False, description="set when only Quix__Lakehouse__Catalog__Url turned "
        "the catalog on: a Delta table is then written without registration (a warning) "
        "instead of refused")

    @model_validator(mode="before")
    @classmethod
    def _type_from_section(cls, data: Any) -> Any:
        if isinstance(data, dict) and "type" not in data:
            given = [k for k in ("quix", "iceberg", "hive") if data.get(k) is not None]
            if len(given) > 1:
                raise ValueError(f"catalog: one catalog per run; sections {given} given")
            if given:
                data = {**data, "type": given[0]}
        return data

    @model_validator(mode="after")
    def _section_of_type(self) -> CatalogConfig:
        if self.type == "iceberg" and self.iceberg is None:
            raise ValueError("catalog.iceberg: required for catalog.type iceberg (uri, …)")
        if self.type == "hive" and self.hive is None:
            self.hive = HiveCatalogConfig()
        if self.type == "quix":
            if self.quix is None:
                self.quix = QuixCatalogConfig()
            if not self.quix.url:
                raise ValueError("catalog.quix.url: required for catalog.type quix (or set "
                                 "Quix__Lakehouse__Catalog__Url / CATALOG_URL)")
        return self
