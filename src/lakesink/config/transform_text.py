"""The transforms' text: ``"name: expression"`` pairs parsed and checked, and
kafka-delta-ingest's JMESPath dialect translated to Spark SQL (:func:`translate_kdi`).

Pure Python, no Spark: the config model checks each transform's text with it when the
config is loaded (a bad one names its key, ``table.transforms.<n>``), and
:mod:`lakesink.pipeline.transforms` applies the parsed transforms to a batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from lakesink.errors import ConfigError

_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_KDI_FUNCTIONS = ("substr", "epoch_seconds_to_iso8601", "epoch_millis_to_iso8601",
                  "epoch_micros_to_iso8601", "epoch_millis_to_micro")
_ISO_SECONDS = "yyyy-MM-dd'T'HH:mm:ss"


@dataclass(frozen=True)
class Transform:
    """One parsed transform. ``expression`` is Spark SQL (translated if ``kdi``)."""

    target: tuple[str, ...]
    expression: str
    text: str
    kdi: bool = False

    @property
    def name(self) -> str:
        return ".".join(self.target)


def parse_transforms(items: Sequence[str], key: str = "table.transforms") -> list[Transform]:
    """Parse ``"name: expression"`` strings; a ConfigError names ``key.i`` on the first
    bad one. No Spark: the expressions are checked against the schema at start."""
    out = []
    for i, text in enumerate(items):
        where = f"{key}.{i}"
        name, sep, expr = text.partition(":")
        name, expr = name.strip(), expr.strip()
        if not sep or not name or not expr:
            raise ConfigError(where, f"{text!r} is not 'name: expression'")
        if not _TARGET.match(name):
            raise ConfigError(where, f"{name!r} is not a column name or a dotted path of them")
        top = name.split(".")[0]
        if top.lower() == "kafka" or top.startswith("_lakesink"):
            raise ConfigError(where, f"{name!r}: 'kafka' and '_lakesink*' are reserved names")
        kdi = is_kdi(expr)
        try:
            sql = translate_kdi(expr) if kdi else expr
        except ValueError as exc:
            raise ConfigError(where, f"{expr!r}: {exc}") from None
        out.append(Transform(tuple(name.split(".")), sql, text, kdi))
    return out


# -- kafka-delta-ingest's JMESPath dialect --------------------------------------------

_LITERAL = re.compile(r"`((?:[^`\\]|\\.)*)`")


def is_kdi(expr: str) -> bool:
    """A kafka-delta-ingest (JMESPath) expression: it holds a JSON literal in backticks
    (in Spark SQL a backtick quotes a column name, never a number or a quoted string) or
    calls one of kafka-delta-ingest's ``epoch_*`` helpers."""
    for m in _LITERAL.finditer(expr):
        try:
            value = json.loads(m.group(1))
        except ValueError:
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            return True
    return bool(re.search(r"\bepoch_(seconds|millis|micros)_to_(iso8601|micro)\s*\(", expr))


def translate_kdi(expr: str) -> str:
    """kafka-delta-ingest's transform source -> Spark SQL.

    * ```0``` (JSON literal) -> ``0``; ```"a"``` -> ``'a'``; ``'raw'`` stays;
      ``"name"`` (a JMESPath quoted identifier) -> ```name```;
    * ``substr(s, skip, take)`` -> ``substring(s, skip + 1, take)``;
    * ``epoch_{seconds,millis,micros}_to_iso8601(n)`` -> the UTC ISO-8601 text
      (``2021-07-20T23:18:18Z``; milli/microseconds shown when not zero);
    * ``epoch_millis_to_micro(n)`` -> ``n * 1000``;
    * paths (``a.b.c``) and ``kafka.*`` are the same in both.

    Raises ValueError for JMESPath that has no Spark SQL equivalent here
    (projections, filters, pipes, multi-selects, ``@`` and ``&``).
    """
    tokens = _tokens(expr)
    for kind, text in tokens:
        if kind == "op" and text in ("[", "]", "|", "@", "&", "{", "}", "?"):
            raise ValueError(f"JMESPath {text!r} (projections, filters, pipes, multi-select) "
                             "has no translation; write the transform in Spark SQL")
    out, _ = _translate(tokens, 0, stop=None)
    return out


def _tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text): kind is lit (a translated literal), ident, op, or space."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "`":
            m = _LITERAL.match(expr, i)
            if m is None:
                raise ValueError("an unclosed ` literal")
            out.append(("lit", _sql_literal(m.group(1).replace("\\`", "`"))))
            i = m.end()
        elif c in "'\"":
            j = i + 1
            while j < len(expr) and expr[j] != c:
                j += 2 if expr[j] == "\\" else 1
            if j >= len(expr):
                raise ValueError(f"an unclosed {c} quote")
            body = expr[i + 1:j]
            if c == "'":  # a JMESPath raw string: a Spark string literal
                out.append(("lit", "'" + body.replace("\\'", "'").replace("\\", "\\\\")
                            .replace("'", "\\'") + "'"))
            else:  # a quoted identifier
                out.append(("ident", "`" + json.loads(expr[i:j + 1]).replace("`", "``") + "`"))
            i = j + 1
        elif c.isspace():
            j = i
            while j < len(expr) and expr[j].isspace():
                j += 1
            out.append(("space", expr[i:j]))
            i = j
        elif c.isalnum() or c == "_":
            j = i
            while j < len(expr) and (expr[j].isalnum() or expr[j] == "_"):
                j += 1
            out.append(("ident", expr[i:j]))
            i = j
        else:
            out.append(("op", c))
            i += 1
    return out


def _sql_literal(body: str) -> str:
    try:
        value = json.loads(body)
    except ValueError:
        raise ValueError(f"`{body}` is not a JSON literal") from None
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise ValueError(f"`{body}`: only scalar JSON literals have a translation")


def _translate(tokens: list[tuple[str, str]], i: int, stop: set[str] | None
               ) -> tuple[str, int]:
    """Translate from ``tokens[i]`` up to (not including) an op in ``stop`` at depth 0."""
    out: list[str] = []
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "op" and stop is not None and text in stop:
            break
        if kind == "ident" and text in _KDI_FUNCTIONS:
            j = i + 1
            while j < len(tokens) and tokens[j][0] == "space":
                j += 1
            if j < len(tokens) and tokens[j] == ("op", "("):
                args, i = _arguments(tokens, j + 1)
                out.append(_call(text, args))
                continue
        if kind == "op" and text == "(":
            inner, i = _translate(tokens, i + 1, stop={")"})
            if i >= len(tokens):
                raise ValueError("an unclosed '('")
            out.append(f"({inner})")
            i += 1
            continue
        out.append(text)
        i += 1
    return "".join(out), i


def _arguments(tokens: list[tuple[str, str]], i: int) -> tuple[list[str], int]:
    """Arguments of a call whose '(' precedes ``tokens[i]``; returns them and the index
    after the closing ')'."""
    args = []
    while True:
        arg, i = _translate(tokens, i, stop={",", ")"})
        if i >= len(tokens):
            raise ValueError("an unclosed '('")
        args.append(arg.strip())
        if tokens[i][1] == ")":
            return args, i + 1
        i += 1


def _call(name: str, args: list[str]) -> str:
    want = 3 if name == "substr" else 1
    if len(args) != want or not all(args):
        raise ValueError(f"{name} takes {want} argument(s), got {len(args)}")
    if name == "substr":
        s, skip, take = args
        return f"substring({s}, ({skip}) + 1, {take})"
    (n,) = args
    if name == "epoch_millis_to_micro":
        return f"(cast({n} AS BIGINT) * 1000)"
    unit = name.split("_")[1]  # seconds | millis | micros
    value = f"cast({n} AS BIGINT)"
    if unit == "seconds":
        return f'date_format(timestamp_seconds({value}), "{_ISO_SECONDS}\'Z\'")'
    scale, fraction = (1000, "SSS") if unit == "millis" else (1_000_000, "SSSSSS")
    ts = f"timestamp_{unit}({value})"
    return (f"CASE WHEN {value} % {scale} = 0 THEN date_format({ts}, \"{_ISO_SECONDS}'Z'\") "
            f"ELSE date_format({ts}, \"{_ISO_SECONDS}.{fraction}'Z'\") END")
