"""Source offsets as Spark records them, read without Spark: one pure parser for the
offset log and one lag rule for every source (no I/O here).

Spark's offset log ``offsets/<batch>`` is ``v1``, the batch's metadata, then one JSON
line per source: the offsets the batch read up to. Their shapes, per source:

* Kafka: ``{"<topic>": {"<partition>": <next offset>}}``;
* Redis streams: ``{"<key>": {"id": "<ms>-<seq>", "n": <entries added up to id, -1
  unknown>, "d": …}}``;
* Redis lists and Danube: ``{"<key>": <int>}`` (a batch number, a spool byte position).

A source's *latest* offset (Spark's progress ``latestOffset``, from the readers'
``reportLatestOffset``) has the same shape for Kafka (the broker's end) and Redis streams
(the stream's end), and ``{"<key>": {"waiting": <records>}}`` for Redis lists (items
still in the list) and Danube (records received into the spool after the batch).
"""

from __future__ import annotations

import json
from typing import Any

#: the label a source without partitions (Redis, Danube's spool per topic) reports
NO_PARTITION = ""


def log_sources(text: str | None) -> list[dict[str, Any]] | None:
    """The per-source end offsets in an offset-log file's text; ``[]`` for an empty
    file, None when its format is not the ``v1`` lakesink reads."""
    lines = (text or "").splitlines()
    if not lines:
        return []
    if lines[0] != "v1":
        return None
    out = []
    for line in lines[2:]:  # after the version and the batch metadata: one per source
        if line.strip() in ("", "-"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def parse(text: str | dict | None) -> dict[str, Any]:
    """An offset as Spark's progress reports it (JSON text) or as a dict; {} if neither."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def lag(end: str | dict | None, latest: str | dict | None) -> dict[tuple[str, str], int]:
    """Records behind per (topic or key, partition) from a source's end offset (the
    batch's) and its latest one (see the module docstring for the shapes). A key whose
    count is unknown (a Redis stream position taken after a deletion) is left out."""
    ends, latests = parse(end), parse(latest)
    out: dict[tuple[str, str], int] = {}
    for key, now in latests.items():
        done = ends.get(key)
        if not isinstance(now, dict):
            continue
        waiting = _int(now.get("waiting"))
        if waiting is not None:  # Redis list, Danube spool
            out[(str(key), NO_PARTITION)] = max(0, waiting)
        elif "id" in now:  # Redis stream
            n = _int(now.get("n"))
            have = _int(done.get("n")) if isinstance(done, dict) else None
            if n is not None and have is not None and n >= 0 and have >= 0:
                out[(str(key), NO_PARTITION)] = max(0, n - have)
        elif isinstance(done, dict):  # Kafka
            for partition, offset in now.items():
                high, at = _int(offset), _int(done.get(partition))
                if str(partition).isdigit() and high is not None and at is not None:
                    out[(str(key), str(partition))] = max(0, high - at)
    return out
