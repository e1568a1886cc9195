"""What every config section shares: the section base (unknown keys forbidden), list and map coercions, regex and duration checks."""

from __future__ import annotations

import difflib
import json
import re
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
)
from pydantic_settings import (
    NoDecode,
)

Compression = Literal["snappy", "zstd", "gzip", "lz4", "none"]


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")


def did_you_mean(model: type[BaseModel] | None, loc: list[str]) -> str:
    """`` (did you mean 'x'?)`` for an unknown key ``loc`` (its path from ``model``)
    close to a key of its section, else ``""``."""

    def model_in(annotation: Any) -> type[BaseModel] | None:  # noqa: ANN401
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        for arg in typing.get_args(annotation):
            found = model_in(arg)
            if found is not None:
                return found
        return None

    for part in loc[:-1]:
        if part.isdigit() or model is None:
            continue  # a list's index: the same model
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        field = fields.get(part)
        model = model_in(field.annotation) if field is not None else None
    if model is None or not loc:
        return ""
    names = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def split_list(value: Any) -> Any:
    """Accept a list, a JSON list, or a comma-separated string (handy in env vars)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def check_regex(value: str | None) -> str | None:
    """A regular expression that compiles (Python's dialect is close to Java's for the
    patterns topic and type names use)."""
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
    return value


def stringify_map(value: Any) -> Any:
    """Map values may be YAML scalars (``8``, ``true``); Spark and Kafka want strings."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if isinstance(item, bool):
            item = str(item).lower()
        elif isinstance(item, (int, float)):
            item = str(item)
        out[str(key)] = item
    return out


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


_DURATION_UNITS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), "milliseconds"),
    **dict.fromkeys(("s", "sec", "second", "seconds"), "seconds"),
    **dict.fromkeys(("m", "min", "minute", "minutes"), "minutes"),
    **dict.fromkeys(("h", "hour", "hours"), "hours"),
}


def spark_duration(value: str) -> str:
    """Accept ``500ms``, ``10 s``, ``1 minute``…; return the form Spark's interval
    parser takes (it knows ``seconds``, not ``s``)."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$", value)
    unit = _DURATION_UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ValueError("use a duration like '500 ms', '10 seconds' or '1 minute'")
    return f"{m.group(1)} {unit}"


#: a list of strings an environment variable gives as text (split by the validators)
StrList = Annotated[list[str], NoDecode]
