"""Load a :class:`LakesinkConfig` from a file, the environment and CLI overrides.

Precedence is CLI > env > secret files > file > defaults. Rules enforced here:

* unknown keys anywhere (file, env, ``--set``) are errors naming the key;
* secret fields (``SecretStr``) are refused in the file and on the command line:
  they come from ``LAKESINK_<PATH>`` or from a file named by ``LAKESINK_<PATH>_FILE``;
* every failure becomes one :class:`ConfigError` naming the dotted key.
"""

from __future__ import annotations

import logging
import os
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_settings import BaseSettings
from pydantic_settings.exceptions import SettingsError

from lakesink.config.settings_sources import _env_data, _file_data, _secret_data
from lakesink.errors import ConfigError

if typing.TYPE_CHECKING:
    from lakesink.config.models import LakesinkConfig

ENV_PREFIX = "LAKESINK_"
#: Environment variables with the prefix that are not configuration keys.
RESERVED_ENV = {"JARS_DIR", "KAFKA_JARS_DIR", "FAULT", "FAULT_BATCH", "CONFIG", "HOME"}

logger = logging.getLogger(__name__)

# -- secret paths ------------------------------------------------------------------------


def _unwrap(annotation: Any) -> list[Any]:
    """``X | None`` -> ``[X]``; anything else -> ``[annotation]``."""
    import types

    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return [annotation]


def secret_paths(model: type[BaseModel] | None = None, prefix: tuple[str, ...] = ()) -> list[
    tuple[str, ...]
]:
    """Dotted paths of every secret field; ``*`` stands for any key of a dict of secrets."""
    from lakesink.config.models import LakesinkConfig

    model = model or LakesinkConfig
    paths: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        for ann in _unwrap(field.annotation):
            origin = typing.get_origin(ann)
            if ann is SecretStr:
                paths.append((*prefix, key))
            elif origin is dict and typing.get_args(ann)[1] is SecretStr:
                paths.append((*prefix, key, "*"))
            elif isinstance(ann, type) and issubclass(ann, BaseModel):
                paths.extend(secret_paths(ann, (*prefix, key)))
    return paths


def _matches(path: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return len(path) == len(pattern) and all(p == q or q == "*" for p, q in zip(path, pattern, strict=True))


def _leaf_paths(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterable[tuple[str, ...]]:
    for key, value in data.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping) and value:
            yield from _leaf_paths(value, path)
        else:
            yield path


def _refuse_secrets(data: Mapping[str, Any], where: str) -> None:
    patterns = secret_paths()
    for path in _leaf_paths(data):
        for pattern in patterns:
            if _matches(path, pattern) or _matches(path[: len(pattern)], pattern):
                env = ENV_PREFIX + "__".join(path).upper()
                raise ConfigError(
                    ".".join(path),
                    f"is a secret and cannot be set in {where}",
                    fix=f"set the environment variable {env} or put it in a file named by {env}_FILE",
                )


# -- parsing helpers ---------------------------------------------------------------------


def _set_path(data: dict[str, Any], path: list[str], value: Any, *, key: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(key, f"'{part}' is not a section")
        node = child
    node[path[-1]] = value


def split_key(key: str) -> list[str]:
    """Split a dotted key along the model: below a map field the rest is one map key.

    ``spark.conf.spark.sql.shuffle.partitions`` -> ``["spark", "conf",
    "spark.sql.shuffle.partitions"]``.
    """
    from lakesink.config.models import LakesinkConfig

    parts = key.split(".")
    model: type[BaseModel] | None = LakesinkConfig
    out: list[str] = []
    i = 0
    while i < len(parts):
        part = parts[i]
        out.append(part)
        i += 1
        if model is None:
            continue
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        if field is None:
            model = None
            continue
        next_model: type[BaseModel] | None = None
        for ann in _unwrap(field.annotation):
            if typing.get_origin(ann) is dict and i < len(parts):
                out.append(".".join(parts[i:]))
                return out
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                next_model = ann
        model = next_model
    return out


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["table.partition_by=[a, b]", "trigger.interval=5 seconds"]`` -> nested dict.

    Values are YAML scalars or flow collections, so ``true``, ``5`` and ``[a, b]`` work.
    """
    data: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(item, "use --set key.path=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw  # not YAML: take the text as typed
        _set_path(data, split_key(key), value, key=key)
    return data


def read_file(path: str | Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A config file: lakesink's YAML (or TOML), or a peer's file translated — the
    Danube sink's TOML, the FS Data Sink's YAML or INI (with its environment, ``env``,
    over it as there)."""
    from lakesink.compat import fds_file

    p = Path(path)
    if not p.is_file():
        raise ConfigError("--config", f"file not found: {p}")
    if p.suffix.lower() == ".toml":
        return _read_toml(p)
    if p.suffix.lower() in (".ini", ".cfg"):
        data: Any = fds_file.read_ini(p)
    else:
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("--config", f"{p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("--config", f"{p} must hold a mapping of sections")
    if fds_file.is_fds_file(data):
        skipped = fds_file.ignored(data)
        if skipped:
            logger.info("FS Data Sink settings with no meaning in lakesink, ignored: %s",
                        "; ".join(skipped))
        return fds_file.translate(data, os.environ if env is None else env)
    return data


def _read_toml(p: Path) -> dict[str, Any]:
    """A TOML config: lakesink's own sections, or the Danube Delta Lake sink's file
    (a ``[deltalake]`` section), translated (:mod:`lakesink.compat.danube_toml`)."""
    import tomllib

    from lakesink.compat import danube_toml

    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{p} is not valid TOML: {exc}") from None
    if not danube_toml.is_danube_toml(data):
        return data
    skipped = danube_toml.ignored(data)
    if skipped:
        logger.info("Danube sink settings with no meaning in lakesink, ignored: %s",
                    ", ".join(skipped))
    return danube_toml.translate(data)


def _env_items(env: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    for name, value in env.items():
        if name.upper().startswith(ENV_PREFIX):
            yield name[len(ENV_PREFIX):], value


def read_secret_files(env: Mapping[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    patterns = secret_paths()
    for rest, value in _env_items(env):
        if not rest.upper().endswith("_FILE"):
            continue
        path = [p.lower() for p in rest[: -len("_FILE")].split("__")]
        if not any(_matches(tuple(path), p) for p in patterns):
            continue
        try:
            secret = Path(value).read_text().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(
                ".".join(path), f"cannot read secret file {value}: {exc.strerror}"
            ) from None
        _set_path(data, path, secret, key=".".join(path))
    return data


def _check_env_names(env: Mapping[str, str]) -> None:
    from lakesink.config.models import LakesinkConfig

    sections = set(LakesinkConfig.model_fields)
    for rest, _ in _env_items(env):
        head = rest.split("__", 1)[0].lower()
        if rest.upper() in RESERVED_ENV or head in sections:
            continue
        raise ConfigError(
            ENV_PREFIX + rest, f"unknown configuration section '{head}'",
            fix=f"known sections: {', '.join(sorted(sections))}",
        )


def did_you_mean(loc: list[str]) -> str:
    """`` (did you mean 'x'?)`` for an unknown key ``loc`` (from the top of the config)
    close to a key of its section, else ``""``."""
    from lakesink.config.base import did_you_mean as close_key
    from lakesink.config.models import LakesinkConfig

    return close_key(LakesinkConfig, loc)


def _describe(error: Mapping[str, Any]) -> tuple[str, str]:
    loc = [str(p) for p in error.get("loc", ()) if not str(p).startswith("function-")]
    key = ".".join(loc)
    msg = str(error.get("msg", "invalid"))
    msg = msg.removeprefix("Value error, ")
    if ": " in msg:  # model-level validators name their key first
        head, _, tail = msg.partition(": ")
        if "." in head and " " not in head and (not key or head.startswith(key + ".")):
            key, msg = head, tail
    if error.get("type") == "extra_forbidden":
        msg = "unknown key" + did_you_mean(loc)
    elif error.get("type") == "missing":
        msg = "required value is missing"
    value = error.get("input")
    if error.get("type") not in ("missing", "extra_forbidden") and isinstance(
        value, (str, int, float, bool)
    ) and not any(_matches(tuple(loc), p) for p in secret_paths()):
        if isinstance(value, str):  # a URL's password is never echoed
            from lakesink.config.catalog import masked_uri

            value = masked_uri(value)
        msg += f" (got {value!r})"
    return key, msg


def load_config(
    path: str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    compat: str | None = None,
) -> LakesinkConfig:
    """Resolve the configuration; raise :class:`ConfigError` naming the first bad key.

    Args:
        path: a YAML file, or ``None``.
        overrides: ``key.path=value`` strings from ``--set``.
        flags: dotted keys from dedicated CLI flags (``{"table.name": "x"}``); they win
            over ``--set``.
        env: the environment (default ``os.environ``).
        compat: ``"quix"``: the Quix TS Datalake Sink's environment is the config
            (:mod:`lakesink.compat.quix_env`); also chosen when ``path`` is None and
            ``input`` is set.
    """
    from lakesink.config.models import LakesinkConfig

    from lakesink.compat import quix_env

    env = os.environ if env is None else env
    if quix_env.applies(env, has_file=path is not None, compat=compat):
        if path is not None:
            raise ConfigError("--compat", "the Quix environment is the whole configuration: "
                              "give no --config (--set and flags still apply)")
        file_data, extra_env = quix_env.translate(env)
        env = {**env, **extra_env}
        skipped = quix_env.ignored(env)
        if skipped:
            logger.info("Quix settings with no meaning in lakesink, ignored: %s",
                        "; ".join(skipped))
    else:
        file_data = read_file(path, env) if path else {}
    _refuse_secrets(file_data, "the config file")
    cli_data = parse_overrides(overrides)
    for key, value in (flags or {}).items():
        if value is not None:
            _set_path(cli_data, split_key(key), value, key=key)
    _refuse_secrets(cli_data, "a command-line flag")
    _check_env_names(env)
    secrets = read_secret_files(env)

    tokens = (_file_data.set(file_data), _secret_data.set(secrets), _env_data.set(env))
    try:
        return LakesinkConfig(**cli_data)
    except ValidationError as exc:
        problems = [_describe(e) for e in exc.errors()]
        (key, msg), more = problems[0], tuple(dict.fromkeys(problems[1:]))
        raise ConfigError(key, msg, more=more) from None
    except SettingsError as exc:
        cause = exc.__cause__ or exc
        raise ConfigError("environment", str(cause) or str(exc)) from None
    finally:
        _file_data.reset(tokens[0])
        _secret_data.reset(tokens[1])
        _env_data.reset(tokens[2])


def redacted_dict(config: BaseSettings) -> dict[str, Any]:
    """The resolved config as plain data, every secret shown as ``'**********'``."""
    return config.model_dump(mode="json", by_alias=True)


_MASK = "**********"
_SECRET_MAPS = ("secret_options", "secret_properties")


def config_file_text(config: BaseSettings) -> str:
    """The resolved config as a config file (YAML, settings at their default left out),
    for ``lakesink run --print-config``: whatever produced it (flags, the environment, a
    Quix or FS Data Sink surface) can move to a file. Secrets are not in it: a comment
    names each one and the variable that must carry it."""
    data = config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    secrets: dict[str, str] = {}

    def strip(node: Any, path: list[str]) -> None:  # noqa: ANN401
        if not isinstance(node, dict):
            return
        for key in list(node):
            value, here = node[key], [*path, str(key)]
            if value == _MASK:
                del node[key]
                in_map = next((i for i, p in enumerate(here) if p in _SECRET_MAPS), None)
                env_path = here if in_map is None else here[: in_map + 1]
                variable = "LAKESINK_" + "__".join(p.upper() for p in env_path)
                secrets[".".join(here)] = (variable if in_map is None else
                                           f"{variable} (JSON: {{\"{key}\": …}})")
                continue
            strip(value, here)
            if isinstance(value, dict) and not value:
                del node[key]

    strip(data, [])
    head = ["# lakesink config: `lakesink run -c <this file>` runs the same as the command "
            "that printed it"]
    if secrets:
        head.append("# secrets are never written here; set each in the environment "
                    "(or as <VARIABLE>_FILE):")
        head += [f"#   {path}: {variable}" for path, variable in secrets.items()]
    return "\n".join(head) + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
