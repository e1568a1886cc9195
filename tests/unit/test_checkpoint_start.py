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
from lakesink.tables.identity import (
    IDENTITY_FILE,
    checkpoint_app_id,
    mark_started,
    record_start,
)

KEY = "source.kafka.starting_offsets"


def _fs() -> ArrowFS:
    return ArrowFS(pafs.LocalFileSystem(), writes=True)


def _start(checkpoint: str, start: dict[str, str]) -> str:
    """What a run does: the app id first, the start once the writer lease is held."""
    app_id = checkpoint_app_id(_fs(), checkpoint, start)
    record_start(_fs(), checkpoint, start)
    return app_id


def test_a_start_changed_after_the_query_started_is_refused(tmp_path: Path) -> None:
    checkpoint = f"file:{tmp_path}/cp"
    _start(checkpoint, {KEY: "latest"})
    recorded = json.loads((tmp_path / "cp" / IDENTITY_FILE).read_text())
    assert recorded["start"] == {KEY: "latest"}
    # not started yet (the first start stopped before its first trigger): taken
    app_id = _start(checkpoint, {KEY: "earliest"})
    recorded = json.loads((tmp_path / "cp" / IDENTITY_FILE).read_text())
    assert (recorded["app_id"], recorded["start"]) == (app_id, {KEY: "earliest"})
    (tmp_path / "cp" / "sources" / "0").mkdir(parents=True)
    (tmp_path / "cp" / "sources" / "0" / "0").write_text("v1\n{}")  # Kafka's start
    (tmp_path / "cp" / "offsets").mkdir()
    (tmp_path / "cp" / "offsets" / "0").write_text("v1\n{}")
    with pytest.raises(ConfigError) as refused:
        _start(checkpoint, {KEY: "latest"})
    assert refused.value.key == KEY
    assert "'earliest'" in str(refused.value) and "'latest'" in str(refused.value)
    assert _start(checkpoint, {KEY: "earliest"}) == app_id
    # a committed batch: the checkpoint's logs decide, as documented
    (tmp_path / "cp" / "commits").mkdir()
    (tmp_path / "cp" / "commits" / "0").write_text("v1\n{}")
    assert _start(checkpoint, {KEY: "latest"}) == app_id


def test_a_checkpoint_from_before_the_record_is_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "cp" / "offsets").mkdir(parents=True)
    (tmp_path / "cp" / "offsets" / "0").write_text("v1\n{}")
    (tmp_path / "cp" / IDENTITY_FILE).write_text(json.dumps({"app_id": "a" * 32}))
    assert _start(f"file:{tmp_path}/cp", {KEY: "latest"}) == "a" * 32


def test_a_second_start_records_nothing_before_it_holds_the_lease(tmp_path: Path) -> None:
    """A second process started beside the writer with another start setting (refused by
    the writer lease) leaves the first start's record alone: a corrected restart after
    the writer died is compared with the start Spark really kept."""
    checkpoint = f"file:{tmp_path}/cp"
    app_id = _start(checkpoint, {KEY: "latest"})
    before = (tmp_path / "cp" / IDENTITY_FILE).read_text()
    # the second process gets the app id, then the lease refuses it: no record_start
    assert checkpoint_app_id(_fs(), checkpoint, {KEY: "earliest"}) == app_id
    assert (tmp_path / "cp" / IDENTITY_FILE).read_text() == before
    # the writer's query starts, and dies before a commit; the restart says 'earliest'
    (tmp_path / "cp" / "sources" / "0").mkdir(parents=True)
    (tmp_path / "cp" / "sources" / "0" / "0").write_text("v1\n{}")
    with pytest.raises(ConfigError) as refused:
        _start(checkpoint, {KEY: "earliest"})
    assert refused.value.key == KEY and "'latest'" in str(refused.value)


def test_a_new_checkpoint_is_written_once(tmp_path: Path) -> None:
    """A fresh checkpoint records its id and its start in one write (``record_start``
    finds nothing to do); an id that began no batch is kept, and a changed start is one
    write (a new id would have a lease of its own beside a process starting under the
    old one)."""
    checkpoint = f"file:{tmp_path}/cp"
    fs = _fs()
    writes: list[str] = []
    real = fs.write_json
    fs.write_json = lambda path, data: (writes.append(path), real(path, data))[1]  # type: ignore[method-assign]
    app_id = checkpoint_app_id(fs, checkpoint, {KEY: "latest"})
    record_start(fs, checkpoint, {KEY: "latest"})
    assert writes == []  # the create-if-absent wrote it all
    assert checkpoint_app_id(fs, checkpoint, {KEY: "earliest"}) == app_id  # no offsets/
    record_start(fs, checkpoint, {KEY: "earliest"})
    assert len(writes) == 1
    recorded = json.loads((tmp_path / "cp" / IDENTITY_FILE).read_text())
    assert (recorded["app_id"], recorded["start"]) == (app_id, {KEY: "earliest"})


def test_an_id_that_began_a_batch_is_not_reused_without_its_offset_log(
        tmp_path: Path) -> None:
    """The mark is written before the first batch writes: once it is there, a checkpoint
    whose offset log was deleted is refused (its batch 0 may be in the table); an
    identity from before the mark replaces its id."""
    checkpoint = f"file:{tmp_path}/cp"
    app_id = _start(checkpoint, {KEY: "latest"})
    mark_started(_fs(), checkpoint)
    with pytest.raises(ConfigError, match="offset log"):
        _start(checkpoint, {KEY: "latest"})
    (tmp_path / "cp" / IDENTITY_FILE).write_text(json.dumps({"app_id": app_id}))
    assert _start(checkpoint, {KEY: "latest"}) != app_id


def test_an_identity_from_before_the_marks_keeps_its_recorded_start(tmp_path: Path) -> None:
    """An id written before the marks, whose query began (``sources/``) but planned no
    batch, is replaced; the replacement keeps the recorded start, so a changed setting
    is still refused (it was recorded as the new one and accepted: Spark would start
    from the old one, silently)."""
    checkpoint = f"file:{tmp_path}/cp"
    (tmp_path / "cp" / "sources" / "0").mkdir(parents=True)
    (tmp_path / "cp" / "sources" / "0" / "0").write_text("v1\n{}")
    (tmp_path / "cp" / IDENTITY_FILE).write_text(json.dumps(
        {"app_id": "a" * 32, "start": {KEY: "latest"}}))
    with pytest.raises(ConfigError) as refused:
        _start(checkpoint, {KEY: "earliest"})
    assert refused.value.key == KEY
    assert _start(checkpoint, {KEY: "latest"}) != "a" * 32
