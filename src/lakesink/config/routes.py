"""The ``routes`` section: topic -> table routes (each inherits ``table`` and ``decode``), message-type routing, and how a route's sections merge over the root's."""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    BaseModel,
    Field,
    field_validator,
    model_validator,
)

from lakesink.config.base import NAME, Section, StrList, check_regex, did_you_mean, split_list
from lakesink.config.decode import DecodeConfig


class MessageTypeConfig(Section):
    """Message-type routing: a field of each JSON record, or the record name of each
    Avro record's writer schema (a registry), names its table."""

    field: str | None = Field(default=None,
                              description="top-level JSON field whose value is the type")
    record_name: bool = Field(default=False, description="the type is the full name "
                              "(namespace.Name) of the record's writer schema, looked up "
                              "by its id in decode.avro.registry")
    namespace: bool = Field(default=True, description="record_name: the type includes the "
                            "record's namespace (namespace.Name); false: the Name alone, as "
                            "kafka-delta-ingest's fork names its tables")
    allow: str | None = Field(default=None, description="regex (whole match) of the types "
                              "written; others are unrouted. Default: every type")
    table_prefix: str = Field(default="", description="table name = prefix + type")
    max_tables: int = Field(default=200, ge=1, description="the most tables the route "
                            "makes: records of further new types are unrouted (dead "
                            "letters) instead of a table, a writer and a lease each")

    _pattern = field_validator("allow")(check_regex)

    @field_validator("field")
    @classmethod
    def _field(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"{value!r} is not a plain field name")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> MessageTypeConfig:
        if (self.field is None) == (not self.record_name):
            raise ValueError("message_type: give either field (JSON) or record_name: true "
                             "(Avro through a registry)")
        return self

    @property
    def what(self) -> str:
        """What names the type, for messages."""
        return "the Avro record name" if self.record_name else f"'{self.field}'"

    @field_validator("table_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if value and not NAME.match(value):
            raise ValueError("use letters, digits, '_', '-' and '.', starting with a "
                             "letter/digit")
        return value


class RouteConfig(Section):
    """Records of some topics -> one table. ``table`` and ``decode`` override the
    top-level sections key by key (everything else is inherited)."""

    topics: StrList = Field(default_factory=list, description="topics of this route")
    topic_pattern: str | None = Field(default=None, description="Java regex of topic names "
                                      "(whole name)")
    table: dict[str, Any] = Field(default_factory=dict,
                                  description="table settings that differ from `table`")
    decode: dict[str, Any] = Field(default_factory=dict,
                                   description="decode settings that differ from `decode`")
    message_type: MessageTypeConfig | None = Field(
        default=None, description="one table per message type instead of one table")

    _split = field_validator("topics", mode="before")(split_list)

    _pattern = field_validator("topic_pattern")(check_regex)

    @model_validator(mode="after")
    def _one_subscription(self) -> RouteConfig:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("set exactly one of 'topics' or 'topic_pattern'")
        return self


def deep_merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides``; sections (dicts) merge key by key, values replace."""
    out = dict(base)
    for name, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(name), dict):
            out[name] = deep_merged(out[name], value)
        else:
            out[name] = value
    return out


def secret_in(overrides: dict[str, Any], key: str) -> str | None:
    """The dotted key of a password in a route's override sections (printed by
    ``lakesink validate`` as given), if any."""
    for name, value in overrides.items():
        if name == "password" and value is not None:
            return f"{key}.{name}"
        if isinstance(value, dict):
            found = secret_in(value, f"{key}.{name}")
            if found:
                return found
    return None


def merged_section(base: BaseModel, overrides: dict[str, Any], model: type[BaseModel], key: str
            ) -> Any:
    """``base`` with ``overrides`` applied, validated; errors name ``key.<field>``."""
    from pydantic import ValidationError

    inherited = base.model_dump(exclude_unset=True, by_alias=True)
    if isinstance(base, DecodeConfig) and overrides.get("format", base.format) != base.format:
        # a schema belongs to its format: a route with another format does not inherit it
        inherited = {k: v for k, v in inherited.items()
                     if k not in ("schema", "avro", "protobuf")}
    data = deep_merged(inherited, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown key" + did_you_mean(model, [str(p) for p in err.get("loc", ())])
        head, sep, tail = msg.partition(": ")
        if sep and "." in head and " " not in head:  # a model validator names its key:
            loc, msg = head.split(".", 1)[1], tail  # "table.x: …" -> x
        raise ValueError(f"{key}{'.' + loc if loc else ''}: {msg}") from None
