"""The configuration model's root, :class:`LakesinkConfig`: the sections (one module
each beside this one: :mod:`.source`, :mod:`.decode`, :mod:`.table`, :mod:`.routes`,
:mod:`.storage`, :mod:`.catalog`, :mod:`.silence`, :mod:`.observe`, :mod:`.run`), the
checks across sections, the routes' expansion and the settings sources. Every section
forbids unknown keys. The README's configuration reference documents each key.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from lakesink.config.base import NAME
from lakesink.config.catalog import CatalogConfig
from lakesink.config.decode import DecodeConfig
from lakesink.config.observe import LoggingConfig, MetricsConfig, TelemetryConfig
from lakesink.config.routes import RouteConfig, merged_section, secret_in
from lakesink.config.run import RetryConfig, SparkConfig, TriggerConfig
from lakesink.config.silence import SilenceConfig
from lakesink.config.source import SourceConfig
from lakesink.config.storage import StorageConfig
from lakesink.config.table import DlqConfig, MaintenanceConfig, TableConfig


class LakesinkConfig(BaseSettings):
    """Everything ``lakesink run`` needs. Sections: source, decode, table, trigger, spark."""

    model_config = SettingsConfigDict(
        env_prefix="LAKESINK_",
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        validate_default=True,
    )

    source: SourceConfig
    decode: DecodeConfig = Field(default_factory=DecodeConfig)
    table: TableConfig = Field(default_factory=TableConfig)
    trigger: TriggerConfig = Field(default_factory=TriggerConfig)
    checkpoint: str | None = Field(
        default=None,
        description="checkpoint folder; default <base_path>/.lakesink/<table>/checkpoint",
    )
    spark: SparkConfig = Field(default_factory=SparkConfig)
    dlq: DlqConfig = Field(default_factory=DlqConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    silence: SilenceConfig = Field(default_factory=SilenceConfig)
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    routes: list[RouteConfig] = Field(
        default_factory=list,
        description="topic -> table routes; each inherits `table` and `decode`",
    )
    _route_sections: list[tuple[TableConfig, DecodeConfig]] = PrivateAttr(
        default_factory=list)
    unrouted: Literal["dlq", "drop"] = Field(
        default="dlq",
        description="records no route takes: 'dlq' (rejected, reason unrouted) or 'drop'",
    )

    @model_validator(mode="before")
    @classmethod
    def _source_from_environment(cls, data: Any) -> Any:
        """No ``source`` section: the environment may still name one (the FS Data Sink's
        ``SOURCE_TYPE`` and variables; see ``SourceConfig``)."""
        if isinstance(data, dict) and "source" not in data:
            data = {**data, "source": {}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _catalog_from_environment(cls, data: Any) -> Any:
        """The Quix sink's catalog variables: ``Quix__Lakehouse__Catalog__Url`` turns the
        Quix catalog on when no catalog is configured; with ``catalog.type: quix`` they
        and ``CATALOG_URL`` / ``CATALOG_AUTH_TOKEN`` / ``CATALOG_NAMESPACE`` /
        ``AUTO_DISCOVER`` fill what the config leaves unset."""
        from lakesink.config.settings_sources import _env_data

        env = _env_data.get() or {}
        if not isinstance(data, dict):
            return data
        catalog = data.get("catalog")
        catalog = dict(catalog) if isinstance(catalog, dict) else {}
        if "type" not in catalog and catalog.get("iceberg") is not None:
            return data  # the catalog section decides (and refuses two)
        kind = catalog.get("type") or ("quix" if catalog.get("quix") is not None else None)
        if kind is None and env.get("Quix__Lakehouse__Catalog__Url"):
            kind = "quix"
            catalog["from_environment"] = True
        if kind != "quix":
            return data
        quix = catalog.get("quix")
        quix = dict(quix) if isinstance(quix, dict) else {}
        for key, names in (("url", ("Quix__Lakehouse__Catalog__Url", "CATALOG_URL")),
                           ("auth_token", ("Quix__Lakehouse__Catalog__AuthToken",
                                           "CATALOG_AUTH_TOKEN")),
                           ("namespace", ("CATALOG_NAMESPACE",)),
                           ("auto_discover", ("AUTO_DISCOVER",))):
            value = next((env[n] for n in names if env.get(n)), None)
            if key not in quix and value is not None:  # AUTO_DISCOVER: only "true" is
                quix[key] = (value.strip().lower() == "true"  # on, as in the Quix sink
                             if key == "auto_discover" else value)
        return {**data, "catalog": {**catalog, "type": "quix", "quix": quix}}

    @model_validator(mode="after")
    def _aws_environment(self) -> LakesinkConfig:
        """The AWS variables fill what the config leaves unset — including the Quix
        connector's ``S3_BUCKET`` / ``S3_PREFIX`` for the lake's location."""
        from lakesink.config.settings_sources import _env_data

        env = _env_data.get() or {}
        s3 = self.storage.s3
        if s3.endpoint is None:
            s3.endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
                           or None)
        if s3.region is None:
            s3.region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
        if s3.profile is None:
            s3.profile = env.get("AWS_PROFILE") or None
        if s3.access_key_id is None and env.get("AWS_ACCESS_KEY_ID") and env.get(
                "AWS_SECRET_ACCESS_KEY"):
            s3.access_key_id = SecretStr(env["AWS_ACCESS_KEY_ID"])
            s3.secret_access_key = SecretStr(env["AWS_SECRET_ACCESS_KEY"])
            if env.get("AWS_SESSION_TOKEN"):
                s3.session_token = SecretStr(env["AWS_SESSION_TOKEN"])
        gcs, azure = self.storage.gcs, self.storage.azure
        if gcs.project_id is None:
            gcs.project_id = env.get("GOOGLE_CLOUD_PROJECT") or None
        if azure.account is None:
            azure.account = env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get(
                "AZURE_STORAGE_ACCOUNT") or None
        for key, var in (("account_key", "AZURE_STORAGE_ACCOUNT_KEY"),
                         ("account_key", "AZURE_STORAGE_KEY"),
                         ("sas_token", "AZURE_STORAGE_SAS_TOKEN"),
                         ("client_secret", "AZURE_CLIENT_SECRET")):
            if getattr(azure, key) is None and env.get(var):
                setattr(azure, key, SecretStr(env[var]))
        if azure.client_id is None:
            azure.client_id = env.get("AZURE_CLIENT_ID") or None
        if azure.tenant_id is None:
            azure.tenant_id = env.get("AZURE_TENANT_ID") or None
        if "base_path" not in self.table.model_fields_set and env.get("S3_BUCKET"):
            prefix = env.get("S3_PREFIX", "").strip("/")
            self.table.base_path = f"s3a://{env['S3_BUCKET']}" + (f"/{prefix}" if prefix else "")
        return self

    @model_validator(mode="after")
    def _routes(self) -> LakesinkConfig:
        """Resolve each route's table and decode settings; derive the subscription."""
        kafka = self.source.kafka
        if kafka is None:  # redis: the keys are the subscription; routes pick from them
            self._route_sections = self._resolve_routes() if self.routes else []
            return self
        if not self.routes:
            if not kafka.topics and not kafka.topic_pattern:
                raise ValueError("source.kafka: set exactly one of 'topics' or "
                                 "'topic_pattern'")
            return self
        self._route_sections = self._resolve_routes()
        if not kafka.topics and not kafka.topic_pattern:
            if all(r.topics for r in self.routes):
                kafka.topics = list(dict.fromkeys(t for r in self.routes for t in r.topics))
            else:
                kafka.topic_pattern = "|".join(
                    f"(?:{r.topic_pattern})" if r.topic_pattern
                    else "|".join(re.escape(t) for t in r.topics) for r in self.routes)
        return self

    @model_validator(mode="after")
    def _one_iceberg_table_per_route(self) -> LakesinkConfig:
        for kind in ("iceberg", "hive"):
            section = getattr(self.catalog, kind)
            if self.catalog.type == kind and section is not None and section.table \
                    and self.routes:
                raise ValueError(f"catalog.{kind}.table: with routes each table registers "
                                 "as its own catalog table (named after it); remove this key")
        return self

    def _resolve_routes(self) -> list[tuple[TableConfig, DecodeConfig]]:
        """Each route's table and decode settings (the route's over the top level's)."""
        resolved: list[tuple[TableConfig, DecodeConfig]] = []
        names: dict[str, int] = {}
        prefixes: dict[str, int] = {}  # message-type routes' table prefixes
        for i, route in enumerate(self.routes):
            table = merged_section(self.table, route.table, TableConfig, f"routes.{i}.table")
            secret = secret_in(route.decode, f"routes.{i}.decode")
            if secret:
                raise ValueError(f"{secret}: a secret in a route's overrides is printed as "
                                 "given; set it in the top-level decode section (from the "
                                 "environment or a secret file): routes inherit it")
            decode = merged_section(self.decode, route.decode, DecodeConfig, f"routes.{i}.decode")
            if route.message_type is not None:
                if route.message_type.record_name and decode.registry is None:
                    raise ValueError(f"routes.{i}.message_type.record_name: needs "
                                     "decode.format avro with decode.avro.registry")
                if not route.message_type.record_name and decode.format != "json":
                    raise ValueError(f"routes.{i}.message_type: needs decode.format json "
                                     f"(the route's format is {decode.format}), or "
                                     "record_name: true for Avro through a registry")
                if "name" in route.table:
                    raise ValueError(f"routes.{i}.table.name: the message type names the "
                                     "tables; remove it (see message_type.table_prefix)")
                prefix = route.message_type.table_prefix.lower()
                for other, j in prefixes.items():
                    if prefix.startswith(other) or other.startswith(prefix):
                        raise ValueError(
                            f"routes.{i}.message_type.table_prefix: {prefix!r} and the "
                            f"prefix {other!r} of routes.{j} can name the same table (two "
                            "routes would write one table under one commit key); give each "
                            "message-type route a prefix that does not begin with another's")
                prefixes[prefix] = i
                table.name = None
                resolved.append((table, decode))
                continue
            if "name" not in route.table:
                if len(route.topics) == 1 and NAME.match(route.topics[0]):
                    table.name = route.topics[0]
                else:
                    raise ValueError(f"routes.{i}.table.name: required unless the route "
                                     "has exactly one topic")
            assert table.name is not None
            if table.name.lower() in names:
                raise ValueError(f"routes.{i}.table.name: {table.name!r} is also the table "
                                 f"of routes.{names[table.name.lower()]}; one route per table "
                                 "(list several topics in one route)")
            names[table.name.lower()] = i
            resolved.append((table, decode))
        return resolved

    def route_sections(self, index: int) -> tuple[TableConfig, DecodeConfig]:
        """Route ``index``'s table and decode sections, the top level's defaults filled
        in (:func:`lakesink.config.plan.plan` makes them a table's settings)."""
        return self._route_sections[index]

    @property
    def routed_checkpoint(self) -> str:
        """The default checkpoint of a routed config (one query for every route)."""
        return f"{self.table.base_path.rstrip('/')}/.lakesink/_routes/checkpoint"

    @model_validator(mode="after")
    def _default_table_name(self) -> LakesinkConfig:
        if self.table.name is None and not self.routes:
            names = self.source.names
            if len(names) == 1 and NAME.match(names[0]):
                self.table.name = names[0]
            else:
                raise ValueError(
                    "table.name: required unless exactly one topic (or Redis key) is read"
                )
        return self

    @property
    def table_name(self) -> str:
        assert self.table.name is not None  # filled by the validator above
        return self.table.name

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """CLI (init kwargs) > env > secret files > config file > defaults."""
        from lakesink.config.settings_sources import FileSource, ScopedEnvSource, SecretFileSource

        return (init_settings, ScopedEnvSource(settings_cls), SecretFileSource(settings_cls),
                FileSource(settings_cls))
