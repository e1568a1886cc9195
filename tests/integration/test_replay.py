"""Replays: a batch whose manifest is missing is redone; one with a manifest is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.local.services import produce
from tests.fixtures.services import config_dict, json_events, read_ids
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def newest(folder: Path, pattern: str = "*") -> Path:
    files = [p for p in folder.glob(pattern) if p.is_file() and not p.name.startswith(".")]
    return max(files, key=lambda p: int(p.name.split(".")[0]))


def forget_last_batch(lake: Path, *, drop_manifest: bool) -> int:
    """Make Spark replay the newest batch: remove its commit-log entry (the crash window
    between the table commit and Spark's commit), and optionally its manifest too."""
    meta = lake / ".lakesink" / "events"
    commit = newest(meta / "checkpoint" / "commits")
    batch_id = int(commit.name)
    commit.unlink()
    (commit.parent / f".{commit.name}.crc").unlink(missing_ok=True)
    if drop_manifest:
        manifests = list((meta / "manifests").glob(f"*/{batch_id:010d}.json"))
        assert len(manifests) == 1
        manifests[0].unlink()
    return batch_id


@pytest.mark.parametrize(
    ("fmt", "drop_manifest"),
    [("parquet", True), ("parquet", False), ("delta", False)],
    ids=["parquet-redo", "parquet-skip", "delta-skip"],
)
def test_replayed_batch_is_written_once(spark, kafka_broker, topic, tmp_path, fmt,
                                        drop_manifest) -> None:
    n = 2000
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 700
    produce(kafka_broker.bootstrap_servers, topic, json_events(range(n)))
    first = run_once(spark, data)
    assert first.batches >= 3
    files_before = sorted(str(p.relative_to(lake)) for p in (lake / "events").rglob("*.parquet"))

    batch_id = forget_last_batch(lake, drop_manifest=drop_manifest)
    again = run_once(spark, data)
    assert again.batches == 1, "exactly the forgotten batch runs again"
    assert again.skipped == (0 if drop_manifest else 1)
    ids = read_ids(lake / "events", fmt)
    assert len(ids) == n and sorted(ids) == list(range(n))
    if fmt == "delta":
        return  # Delta: the log decides which files count; nothing was committed again
    files_after = sorted(str(p.relative_to(lake)) for p in (lake / "events").rglob("*.parquet"))
    assert files_after == files_before  # same deterministic names, nothing added
    assert any(f"part-{batch_id:010d}-" in f for f in files_after)
