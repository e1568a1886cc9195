"""A new checkpoint on a table another writer wrote: where may it start?

A Delta table keeps each writer's position as ``txn`` actions: lakesink's app id (one per
checkpoint) with its last batch id, kafka-delta-ingest's ``<app_id>-<partition>`` with
the last offset it wrote of that partition. A new checkpoint has a new app id, so the
table's ``txn`` actions do not stop it from writing again what they cover: starting at
``earliest`` on a table kafka-delta-ingest (or a lost lakesink checkpoint) filled would
duplicate every row there. :func:`start_refusal` is the rule, pure so the unit layer
tests it; the run calls it once, for a table whose ``txn`` actions are all others'
(:meth:`lakesink.tables.base.TableWriter.other_writers`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

#: kafka-delta-ingest's txn app id: ``<app_id>-<partition>``
_PER_PARTITION = re.compile(r"^(?P<app>.+)-(?P<partition>\d+)$")


def start_refusal(others: Mapping[str, int], starting_offsets: str) -> str | None:
    """Why a new checkpoint must not start at ``starting_offsets`` (Kafka's
    ``startingOffsets``: earliest, latest, group, or JSON per topic and partition) on a
    table holding the ``txn`` versions ``others`` of other writers; None when it may.

    ``earliest`` is refused: it reads again what the other writer wrote. JSON offsets
    are checked against kafka-delta-ingest's per-partition positions (a start at or
    before the offset a ``<app>-<partition>`` txn recorded, or ``-2``, writes it again).
    ``latest`` and ``group`` say where to start and cannot read a written offset twice
    by way of the table."""
    if not others:
        return None
    held = ", ".join(f"{app}={version}" for app, version in sorted(others.items())[:4])
    more = f" and {len(others) - 4} more" if len(others) > 4 else ""
    if starting_offsets == "earliest":
        return (f"the table holds other writers' positions (txn {held}{more}) and this "
                "new checkpoint would start at earliest: rows already in the table would "
                "be written again")
    if starting_offsets in ("latest", "group"):
        return None
    try:
        spec = json.loads(starting_offsets)
    except ValueError:
        return None  # the config model checks the form
    positions = {}
    for app, version in others.items():
        m = _PER_PARTITION.match(app)
        if m:
            positions[int(m["partition"])] = max(version, positions.get(int(m["partition"]), -1))
    for topic, offsets in (spec.items() if isinstance(spec, dict) else []):
        for partition, start in (offsets.items() if isinstance(offsets, dict) else []):
            version = positions.get(int(partition))
            if version is not None and (start == -2 or 0 <= start <= version):
                return (f"{topic} partition {partition} would start at "
                        f"{'earliest' if start == -2 else start}, but the table holds "
                        f"offsets up to {version} of it (txn {held}{more}): they would be "
                        "written again")
    return None
