"""Error types, sorted by what the caller should do.

::

    LakesinkError
     ├─ ConfigError        bad configuration: fail fast at start, exit code 2, name the key
     │   └─ LayoutError    an existing table's layout differs from the config
     ├─ ServiceError       a local service (broker, …) could not be started or reached
     ├─ SourceError        the source is unreachable or refused us (bounded wait, then this)
     ├─ RegistryUnavailable the schema registry did not answer: the batch fails before
     │                     its commit and the query restarts with backoff
     ├─ SecondWriterError  another live writer holds the table (refused at start)
     ├─ BatchRefused       a batch started after a stop request: nothing done, read
     │                     again on the next start
     ├─ CatalogError       the catalog refused a registration (4xx): the run stops
     │   └─ CatalogUnavailable  the catalog is down or failed transiently: registration
     │                      waits with backoff, ingestion goes on
     └─ SinkError          a table write failed; the batch is tried again
         ├─ FilesRefused   delta-rs refused a batch's files: Spark's writer takes them
         ├─ CommitMismatch a commit would record other rows than the batch wrote: never
         │                 committed, never retried (the query stops, loudly)
         └─ LeaseLost      this writer's lease was taken over: it must not commit

``retriable`` says whether trying again can help. One rule, :func:`is_final`, reads it
for both loops: the batch retry (:mod:`lakesink.pipeline.retry`) and the query restart
(:mod:`lakesink.runtime.query_runner`). :func:`one_line` is an error as one log line.

Records that cannot be decoded never raise: they are rows in the rejected area.
"""

from __future__ import annotations

import re


class LakesinkError(Exception):
    """Root of every error lakesink raises on purpose."""

    retriable = True


class ConfigError(LakesinkError):
    """The configuration is invalid. ``key`` is the dotted path of the offending key."""

    retriable = False

    def __init__(self, key: str, message: str, *, fix: str | None = None,
                 more: tuple[tuple[str, str], ...] = ()) -> None:
        """``more``: the other problems found at the same time, (key, message) each; every
        problem is on its own line of the text."""
        self.key = key
        self.message = message
        self.fix = fix
        self.more = more
        text = f"{key}: {message}" if key else message
        if fix:
            text += f" ({fix})"
        text += "".join(f"\n{k}: {m}" if k else f"\n{m}" for k, m in more)
        super().__init__(text)


class ServiceError(LakesinkError):
    """A local service failed to start or stop."""


class SourceError(LakesinkError):
    """The source could not be reached within the configured wait."""


class RegistryUnavailable(LakesinkError):
    """The schema registry did not answer (or failed); the batch is tried again later."""


class SinkError(LakesinkError):
    """A write to a table failed."""


class LayoutError(ConfigError):
    """An existing table's layout (partition columns, format) differs from the configuration."""


class FilesRefused(SinkError):
    """delta-rs refused to commit a batch's files and the Delta log did not move (not a
    race with another commit): a table feature or state it does not handle. The batch,
    and the later ones, take Spark's Delta writer."""

    retriable = False


class CommitMismatch(SinkError):
    """What a batch staged (or committed) is not what it counted as written: rows or
    files went missing, or appeared, between the write and the commit. The batch is not
    committed (Parquet) or the stream stops (Delta, where the write is the commit)."""

    retriable = False


class LeaseLost(SinkError):
    """This writer's lease was taken over (or may be about to be): it must not commit."""

    retriable = False


class SecondWriterError(LakesinkError):
    """Another live writer holds the table."""

    retriable = False


class CatalogError(LakesinkError):
    """The catalog refused what lakesink asked (a 4xx answer, a table it cannot use):
    trying again cannot help; the run stops with the catalog's answer."""

    retriable = False


class CatalogUnavailable(CatalogError):
    """The catalog could not be reached or failed transiently (refused connection,
    timeout, 5xx): registration waits and is retried with backoff; ingestion goes on."""

    retriable = True


class BatchRefused(LakesinkError):
    """A batch started (or waited for a retry) after a stop request: it did nothing and
    is read again on the next start. Control flow of a stop, not a failure."""

    retriable = False


def _final_names() -> tuple[str, ...]:
    """The class names of the errors no retry can mend (every non-retriable class)."""
    found, todo = [], [LakesinkError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not cls.retriable:
            found.append(cls.__name__)
    return tuple(found)


def is_final(exc: BaseException) -> bool:
    """Whether trying again — the batch, or the query from its checkpoint — cannot help.

    A lakesink error says so itself (``retriable``); one raised inside a batch reaches
    the query wrapped by Spark (``StreamingQueryException``), whose text carries the
    Python error's class name (``lakesink.errors.CommitMismatch: …``)."""
    if isinstance(exc, LakesinkError):
        return not exc.retriable
    text = str(exc)
    return any(f"{name}:" in text for name in _final_names())


def one_line(exc: BaseException, limit: int = 300, *, name: bool = True) -> str:
    """The error in one line for logs and messages: its first non-empty line (at most
    ``limit`` characters), after its class name unless ``name`` is false. A Python
    traceback inside Spark's message (a Python data source or batch failed) adds its
    last line: the exception that was raised."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = (lines[0] if lines else "")[:limit]
    if "Traceback (most recent call last)" in first:
        raised = next((ln for ln in reversed(lines)
                       if re.match(r"^[\w.]+(Error|Exception)\b", ln)), None)
        if raised:
            first = f"{first.split('Traceback')[0].strip()} {raised[:limit]}"
    if not name:
        return first
    return f"{type(exc).__name__}: {first}" if first else repr(exc)
