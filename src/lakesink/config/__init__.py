"""Configuration: one pydantic model, loaded from a YAML file, env and CLI flags.

Precedence: CLI (``--set key.path=value`` and flags) > environment
(``LAKESINK_<SECTION>__<KEY>``) > file > defaults. Secrets come only from the
environment or a secret file (``LAKESINK_<...>_FILE``) and are redacted everywhere.
"""

from lakesink.config.loader import load_config, redacted_dict
from lakesink.config.models import LakesinkConfig

__all__ = ["LakesinkConfig", "load_config", "redacted_dict"]
