"""The settings sources one :func:`~lakesink.config.load_config` reads, in pydantic-settings'
terms: the parsed config file, the secrets read from ``LAKESINK_<PATH>_FILE`` files, and
the ``LAKESINK_*`` environment — each scoped to the load that set it (context
variables), so two loads in one process never see each other's. The config model lists
them (``settings_customise_sources``) and its environment fallbacks read the same
environment (:data:`_env_data`).
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping
from typing import Any

from pydantic_settings import EnvSettingsSource, PydanticBaseSettingsSource

_file_data: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "lakesink_file_data", default=None
)
_secret_data: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "lakesink_secret_data", default=None
)


_env_data: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "lakesink_env_data", default=None
)


class ScopedEnvSource(EnvSettingsSource):
    """``LAKESINK_*`` variables from the mapping given to :func:`load_config` (default: os.environ)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        from pydantic_settings.sources.utils import parse_env_vars

        env = _env_data.get()
        return parse_env_vars(os.environ if env is None else env, self.case_sensitive,
                              self.env_ignore_empty, self.env_parse_none_str)


class FileSource(PydanticBaseSettingsSource):
    """The parsed YAML file (set by :func:`load_config`)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_file_data.get() or {})


class SecretFileSource(FileSource):
    """Secrets read from the files named by ``LAKESINK_<PATH>_FILE``."""

    def __call__(self) -> dict[str, Any]:
        return dict(_secret_data.get() or {})
