"""lakesink's log output: ``logging.format: text`` (human lines) or ``json`` (one JSON
object per line: ``time``, ``level``, ``logger``, ``message``, and ``table`` and
``batch_id`` while a batch runs), on stderr.

The level: ``--log-level``, else ``logging.level``, else the ``LOG_LEVEL`` or
``LOGLEVEL`` environment variable (the Quix and FS Data Sink spelling), else INFO.
py4j's chatter stays at WARNING. Every line passes a last redaction: a URL's password
(``scheme://user:password@host``) never reaches the output, whatever logged it.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

_CONTEXT: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar(
    "lakesink_log_context", default={})  # noqa: B039 - never mutated, only replaced
_URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)[^@\s/]+@")
NOISY = ("py4j", "py4j.clientserver", "py4j.java_gateway",
         "azure")  # azure-core logs every request at INFO


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:  # noqa: ANN401
    """Fields every log line carries inside the block (``table``, ``batch_id``)."""
    token = _CONTEXT.set({**_CONTEXT.get(), **fields})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def redact(text: str) -> str:
    return _URL_PASSWORD.sub(r"\1**********@", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname, "logger": record.name,
            "message": redact(record.getMessage()),
        }
        data.update(_CONTEXT.get())
        if record.exc_info:
            data["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(data, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        context = _CONTEXT.get()
        text = super().format(record)
        if context:
            where = " ".join(f"{k}={v}" for k, v in context.items())
            head, sep, tail = text.partition(": ")
            text = f"{head} [{where}]{sep}{tail}"
        return redact(text)


def level_name(flag: str | None, configured: str | None,
               env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    name = (flag or configured or env.get("LOG_LEVEL") or env.get("LOGLEVEL") or "INFO")
    name = name.strip().upper()
    return {"WARN": "WARNING", "FATAL": "CRITICAL"}.get(name, name)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
