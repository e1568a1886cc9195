"""Connecting to Redis, for the Redis sources (on the driver and in Spark's tasks).

A data source's options are strings; :func:`source_options` builds them from the
configuration (the password included: Spark redacts option keys named like
``password`` in plans and logs) and :class:`Conn` reads them back where a client is
needed. ``read()`` runs in executor Python workers and keeps no state between calls,
so each call opens its own client.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakesink.errors import SourceError

if TYPE_CHECKING:
    import redis

    from lakesink.config.source import RedisSource


@dataclass(frozen=True)
class Conn:
    host: str
    port: int
    db: int
    username: str | None
    password: str | None = field(repr=False)
    tls: bool
    timeout_s: float

    @classmethod
    def of(cls, options: dict[str, str]) -> Conn:
        return cls(host=options["host"], port=int(options["port"]), db=int(options["db"]),
                   username=options.get("username") or None,
                   password=options.get("password") or None,
                   tls=options.get("tls") == "true",
                   timeout_s=float(options.get("timeout_s", "30")))

    def client(self) -> redis.Redis:
        import redis

        return redis.Redis(host=self.host, port=self.port, db=self.db,
                           username=self.username, password=self.password, ssl=self.tls,
                           socket_timeout=self.timeout_s,
                           socket_connect_timeout=min(self.timeout_s, 10.0),
                           retry_on_timeout=True)


def source_options(cfg: RedisSource, keys: list[str], **extra: str) -> dict[str, str]:
    """The data source options for ``keys`` (stream or list keys), secrets included:
    pass them to Spark, never to a log."""
    opts = {"host": cfg.host, "port": str(cfg.port), "db": str(cfg.db),
            "tls": str(cfg.tls).lower(), "timeout_s": str(cfg.socket_timeout_s),
            "keys": json.dumps(keys), "value_field": cfg.value_field or "",
            "key_field": cfg.key_field or "",
            "fail_on_data_loss": str(cfg.fail_on_data_loss).lower(), **extra}
    if cfg.max_records_per_trigger:
        opts["max_records"] = str(cfg.max_records_per_trigger)
    if cfg.wait_replicas:
        opts["wait_replicas"] = str(cfg.wait_replicas)
        opts["wait_timeout_ms"] = str(cfg.wait_timeout_ms)
    if cfg.username:
        opts["username"] = cfg.username
    if cfg.password is not None:
        opts["password"] = cfg.password.get_secret_value()
    return opts


def check_reachable(cfg: RedisSource, timeout_s: float | None = None) -> None:
    """Fail with a clear error when the server does not answer PING within
    ``timeout_s`` (default ``connect_timeout_s``; 0: tried once); a wrong password fails
    at once, naming the setting."""
    import redis

    conn = Conn.of(source_options(cfg, []))
    deadline = time.monotonic() + (cfg.connect_timeout_s if timeout_s is None else timeout_s)
    while True:
        try:
            conn.client().ping()
            return
        except redis.AuthenticationError as exc:
            raise SourceError(f"Redis at {cfg.host}:{cfg.port} refused the credentials "
                              f"({exc}); check source.redis.username and "
                              "source.redis.password") from None
        except redis.RedisError as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            waited = (f" after {cfg.connect_timeout_s:.0f}s" if cfg.connect_timeout_s >= 1
                      else "")
            raise SourceError(f"no Redis server reachable at {cfg.host}:{cfg.port}{waited} "
                              f"({last}); check source.redis.host / port and the network")
        time.sleep(1.0)


def decode_fields(fields: dict[bytes, bytes], value_field: str | None, key_field: str | None
                  ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """A stream entry's (key, value, headers): the value is the ``value_field`` (None
    when the entry has no such field: the decoder rejects it), or with no value field
    every field as one JSON object of strings; the other fields are headers."""
    headers = [(k.decode("utf-8", "replace"), v) for k, v in fields.items()]
    key = fields.get(key_field.encode()) if key_field else None
    if value_field:
        value = fields.get(value_field.encode())
        headers = [(k, v) for k, v in headers if k != value_field]
    else:
        try:
            value = json.dumps({k.decode(): v.decode() for k, v in fields.items()},
                               ensure_ascii=False).encode()
        except UnicodeDecodeError:
            # not UTF-8: the object with the raw bytes, invalid as they are — a dead
            # letter ("not valid UTF-8") that keeps them, never U+FFFD in a row (two
            # names replaced alike would even collapse into one key)
            value = b"{" + b",".join(_raw_string(k) + b":" + _raw_string(v)
                                     for k, v in fields.items()) + b"}"
    return key, value, headers


def _raw_string(raw: bytes) -> bytes:
    return b'"' + raw.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
