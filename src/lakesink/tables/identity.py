"""The app id bound to a checkpoint.

Batch ids restart at 0 with a new checkpoint, so everything keyed by batch id (Delta
``txnVersion``, Parquet manifests and file names) is also keyed by an app id that is
created with the checkpoint and stored inside it (``<checkpoint>/lakesink.json``).
Reusing an app id with a fresh checkpoint would make the new batches look done and
silently drop them; a new checkpoint therefore always gets a new id.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid

from lakesink.errors import ConfigError
from lakesink.tables.fs import HadoopFS, join

logger = logging.getLogger(__name__)

IDENTITY_FILE = "lakesink.json"


def checkpoint_app_id(fs: HadoopFS, checkpoint: str) -> str:
    """Return the checkpoint's app id, creating one for a new checkpoint."""
    path = join(checkpoint, IDENTITY_FILE)
    data = fs.read_json(path)
    if data and data.get("app_id"):
        return str(data["app_id"])
    if fs.exists(join(checkpoint, "offsets")) or fs.exists(join(checkpoint, "commits")):
        raise ConfigError(
            "checkpoint",
            f"{checkpoint} holds a Spark checkpoint that lakesink did not create "
            f"(no {IDENTITY_FILE})",
            fix="point 'checkpoint' at an empty folder, or restore the lakesink.json file",
        )
    app_id = uuid.uuid4().hex
    fs.mkdirs(checkpoint)
    fs.write_json(path, {"app_id": app_id,
                         "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
    logger.info("new checkpoint %s, app id %s", checkpoint, app_id)
    return app_id


def run_tag(app_id: str) -> str:
    """The short form of the app id used in file names."""
    return app_id[:8]
