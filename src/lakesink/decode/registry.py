"""Writer schemas by id, from a Confluent-API schema registry.

One :class:`SchemaRegistry` per table and run, shared by every decoder that table builds
(a schema evolution rebuilds the decoder, not the registry). It asks the registry
(``confluent_kafka``'s ``SchemaRegistryClient``: ``GET /schemas/ids/{id}``,
``GET /subjects/{subject}/versions/latest``) and keeps every answer for the run:

* a schema the registry has: a :class:`WriterSchema`;
* an id it does not have (HTTP 404, asked twice a second apart, since a registry
  replica may lag the one the producer registered with): :data:`MISSING` — its records
  go to the rejected area as ``unknown_schema_id``; the registry is asked again after a
  restart;
* a registry that does not answer, or answers 5xx: :class:`RegistryUnavailable`. Nothing
  is decided: the batch fails before any commit and the query restarts with backoff, so
  no record is judged by a registry that was down.

Ids are asked on the driver, a batch's distinct new ids at a time; the tasks decode
with the schema texts the decoder puts in its expressions.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError, RegistryUnavailable, one_line

if TYPE_CHECKING:
    from lakesink.config.decode import RegistryConfig

logger = logging.getLogger(__name__)

#: a schema id the registry does not have
MISSING = "missing"
#: how long to wait before asking again about an id the registry said it lacks
MISS_RECHECK_S = 1.0
#: the Confluent API's error codes for a subject, version or schema it does not have
NOT_FOUND = (40401, 40402, 40403)


@dataclass(frozen=True)
class WriterSchema:
    """One registered schema: its id, type (AVRO, PROTOBUF, JSON) and text."""

    id: int
    schema_type: str
    text: str
    #: the schemas it imports, (import name, text), transitively (Protobuf)
    references: tuple[tuple[str, str], ...] = ()

    @property
    def parsed(self) -> Any:  # noqa: ANN401 - Avro's JSON
        try:
            return json.loads(self.text)
        except ValueError:
            return None

    @property
    def record_name(self) -> str | None:
        """The full name of an Avro record schema (namespace.name), else None."""
        doc = self.parsed
        if self.schema_type != "AVRO" or not isinstance(doc, dict) or doc.get("type") != "record":
            return None
        name = str(doc.get("name", ""))
        namespace = doc.get("namespace")
        return f"{namespace}.{name}" if namespace and "." not in name else name


class SchemaRegistry:
    """The schemas a run has resolved, by id (see the module docstring)."""

    def __init__(self, cfg: RegistryConfig, *, client: Any = None,  # noqa: ANN401
                 key: str = "decode.avro.registry") -> None:
        self.key = key  # the config key, for messages
        self.url = cfg.url
        self.timeout_s = cfg.timeout_s
        self.subjects = list(cfg.subjects)
        self.known: dict[int, WriterSchema | str] = {}
        #: Spark's type of each Avro writer schema, or why it has none (decode.avro_registry)
        self.spark_types: dict[int, Any] = {}
        #: each Protobuf writer schema compiled to a descriptor set (decode.protobuf_registry)
        self.descriptor_sets: dict[int, bytes | str] = {}
        if client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            # one retry of a failed request (the client's default is 3); beyond that the
            # batch fails and the query restarts with lakesink's own backoff
            conf: dict[str, Any] = {"url": cfg.url, "timeout": max(1, round(cfg.timeout_s)),
                                    "max.retries": 1}
            if cfg.username is not None:
                secret = cfg.password.get_secret_value() if cfg.password else ""
                conf["basic.auth.credentials.source"] = "USER_INFO"
                conf["basic.auth.user.info"] = f"{cfg.username}:{secret}"
            client = SchemaRegistryClient(conf)
        self.client = client

    def lookup(self, ids: Iterable[int]) -> dict[int, WriterSchema | str]:
        """Resolve ``ids`` not yet known; returns the newly resolved ones."""
        new = sorted({int(i) for i in ids} - self.known.keys())
        found: dict[int, WriterSchema | str] = {}
        missing = []
        for schema_id in new:
            got = self._get(schema_id)
            if got is None:
                missing.append(schema_id)
            else:
                found[schema_id] = got
        if missing:  # a replica may lag the one the producer registered with
            time.sleep(MISS_RECHECK_S)
            for schema_id in missing:
                got = self._get(schema_id)
                found[schema_id] = MISSING if got is None else got
        for schema_id, got in found.items():
            if got == MISSING:
                logger.warning("schema id %d is not in the registry %s: its records are "
                               "rejected (unknown_schema_id)", schema_id, self.url)
            else:
                assert isinstance(got, WriterSchema)
                logger.info("schema id %d: %s %s", schema_id, got.schema_type,
                            got.record_name or "")
        self.known.update(found)
        return found

    def latest(self, subject: str) -> WriterSchema | None:
        """The latest version of ``subject`` (None when the registry has no such
        subject); it is remembered by its id like any looked-up schema."""
        registered = self._ask(f"subject {subject!r}",
                               lambda: self.client.get_latest_version(subject))
        if registered is None:
            return None
        schema = registered.schema
        got = WriterSchema(int(registered.schema_id), schema.schema_type or "AVRO",
                           schema.schema_str, self._references(schema, f"subject {subject!r}"))
        self.known.setdefault(got.id, got)
        return got

    def _get(self, schema_id: int) -> WriterSchema | None:
        schema = self._ask(f"schema id {schema_id}", lambda: self.client.get_schema(schema_id))
        if schema is None:
            return None
        return WriterSchema(schema_id, schema.schema_type or "AVRO", schema.schema_str,
                            self._references(schema, f"schema id {schema_id}"))

    def _references(self, schema: Any, what: str) -> tuple[tuple[str, str], ...]:  # noqa: ANN401
        """The schemas ``schema`` imports (registry references), transitively."""
        out: dict[str, str] = {}
        todo = list(getattr(schema, "references", None) or [])
        while todo:
            ref = todo.pop()
            if ref.name in out:
                continue
            got = self._ask(f"{ref.subject} version {ref.version} (referenced by {what})",
                            lambda ref=ref: self.client.get_version(ref.subject, ref.version))
            if got is None:
                raise RegistryUnavailable(f"schema registry {self.url}: {what} references "
                                          f"{ref.subject} version {ref.version}, which it "
                                          "does not have")
            out[ref.name] = got.schema.schema_str
            todo.extend(getattr(got.schema, "references", None) or [])
        return tuple(sorted(out.items()))

    def _ask(self, what: str, call: Callable[[], Any]) -> Any:  # noqa: ANN401
        """``call()``'s answer; None when the registry says it has no such schema,
        subject or version (HTTP 404 with its error code 40401-40403); raises for
        anything else — a bare 404 is a wrong URL or a proxy, not an answer."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - sorted by _unavailable
            if _status(exc) == 404 and getattr(exc, "error_code", None) in NOT_FOUND:
                return None
            raise self._unavailable(exc, what) from None

    def _unavailable(self, exc: BaseException, what: str) -> Exception:
        status = _status(exc)
        if status in (401, 403):
            return ConfigError(self.key, f"the registry {self.url} refused the "
                               f"credentials (HTTP {status}) asking for {what}",
                               fix=f"check {self.key}.username and password")
        hint = (" (a 404 without the registry's not-found code: is the URL the base of "
                "its Confluent API, e.g. Apicurio's /apis/ccompat/v7?)" if status == 404 else "")
        return RegistryUnavailable(f"schema registry {self.url} unavailable asking for "
                                   f"{what}: {one_line(exc)}{hint}")


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "http_status_code", None)
    return int(code) if isinstance(code, int) and code > 0 else None

