"""A checkpoint's first start is kept by Spark (known-open L6): a start setting changed
after the query started but before its first committed batch is refused, naming the key;
before the query started it is taken; after a commit it is Spark's logs that count.
Local disk through the same filesystem calls as Spark's path."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from lakesink.errors import ConfigError
from lakesink.runtime.arrow_fs import ArrowFS
from lakesink.tables.identity import IDENTITY_FILE, checkpoint_app_id

KEY = "source.kafka.starting_offsets"


def _fs() -> ArrowFS:
    return ArrowFS(pafs.LocalFileSystem(), writes=True)


def test_a_start_changed_after_the_query_started_is_refused(tmp_path: Path) -> None:
    checkpoint = f"file:{tmp_path}/cp"
    checkpoint_app_id(_fs(), checkpoint, {KEY: "latest"})
    recorded = json.loads((tmp_path / "cp" / IDENTITY_FILE).read_text())
    assert recorded["start"] == {KEY: "latest"}
    # not started yet (the first start stopped before its first trigger): taken
    app_id = checkpoint_app_id(_fs(), checkpoint, {KEY: "earliest"})
    recorded = json.loads((tmp_path / "cp" / IDENTITY_FILE).read_text())
    assert (recorded["app_id"], recorded["start"]) == (app_id, {KEY: "earliest"})
    (tmp_path / "cp" / "sources" / "0").mkdir(parents=True)
    (tmp_path / "cp" / "sources" / "0" / "0").write_text("v1\n{}")  # Kafka's start
    (tmp_path / "cp" / "offsets").mkdir()
    (tmp_path / "cp" / "offsets" / "0").write_text("v1\n{}")
    with pytest.raises(ConfigError) as refused:
        checkpoint_app_id(_fs(), checkpoint, {KEY: "latest"})
    assert refused.value.key == KEY
    assert "'earliest'" in str(refused.value) and "'latest'" in str(refused.value)
    assert checkpoint_app_id(_fs(), checkpoint, {KEY: "earliest"}) == app_id
    # a committed batch: the checkpoint's logs decide, as documented
    (tmp_path / "cp" / "commits").mkdir()
    (tmp_path / "cp" / "commits" / "0").write_text("v1\n{}")
    assert checkpoint_app_id(_fs(), checkpoint, {KEY: "latest"}) == app_id


def test_a_checkpoint_from_before_the_record_is_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "cp" / "offsets").mkdir(parents=True)
    (tmp_path / "cp" / "offsets" / "0").write_text("v1\n{}")
    (tmp_path / "cp" / IDENTITY_FILE).write_text(json.dumps({"app_id": "a" * 32}))
    assert checkpoint_app_id(_fs(), f"file:{tmp_path}/cp", {KEY: "latest"}) == "a" * 32
