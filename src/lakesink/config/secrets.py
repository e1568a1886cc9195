"""Which option keys carry secrets.

Secrets are typed (``SecretStr``) and come from the environment or secret files; a
plain option map (``source.kafka.options``, ``storage.*.options``, ``spark.conf``) is
printed by ``validate`` and may reach a DEBUG log, so a secret-bearing key there is
refused at start, naming the map to use instead (``secret_options``, or the section's
typed credential fields). The same rule redacts option maps before they are logged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Kafka client and Hadoop connector (S3A, ABFS, GCS) options whose values are secret:
# passwords, JAAS configs (they hold the password), client secrets, session tokens,
# account keys, SAS tokens, private and encryption keys. Matched anywhere in the key,
# so bucket- and account-scoped forms (fs.s3a.bucket.<b>.secret.key,
# fs.azure.account.key.<account>…) are caught too.
_SECRET = re.compile(
    r"(password|passwd|jaas\.config|secret|session\.token|account\.key|sas\.fixed\.token"
    r"|private\.key|encryption\.key|keystore\.key|key\.pem|user\.info|access\.key$)",
    re.IGNORECASE)

REDACTED = "**********"


def is_secret_key(key: str) -> bool:
    """Whether an option named ``key`` holds a secret value."""
    return bool(_SECRET.search(key))


def refuse_secrets(options: Mapping[str, str], key: str, instead: str) -> None:
    """Raise ValueError naming ``key.<option>`` for the first secret-bearing option."""
    for name in options:
        if is_secret_key(name):
            raise ValueError(f"{key}.{name}: holds a secret, and {key} is printed by "
                             f"'lakesink validate' and logged; set it in {instead} (from "
                             "the environment or a secret file) instead")


def redact(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with every secret value replaced, for logs and printouts."""
    return {k: (REDACTED if is_secret_key(k) else v) for k, v in options.items()}
