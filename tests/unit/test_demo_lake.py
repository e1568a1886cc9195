"""``lakesink demo`` clears only what an earlier demo wrote (no Spark, no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.demo import DEMO_RECORD, claim_lake, record_lake
from lakesink.errors import ConfigError


def test_a_table_the_demo_did_not_write_is_never_deleted(tmp_path: Path) -> None:
    """The first-hour bug: an existing ``sensors`` table under the lake was deleted."""
    kept = tmp_path / "lake" / "sensors" / "location=prod" / "part-keep.parquet"
    kept.parent.mkdir(parents=True)
    kept.write_text("data")
    with pytest.raises(ConfigError) as refused:
        claim_lake(tmp_path / "lake")
    assert refused.value.key == "--lake"
    assert (f"{tmp_path / 'lake' / 'sensors'} holds sensors/location=prod/part-keep.parquet, "
            "which the demo did not write") in str(refused.value)
    assert kept.read_text() == "data"


def test_a_file_added_to_the_demos_table_stops_the_next_demo(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    claim_lake(lake)  # a fresh lake: nothing to clear
    (lake / "sensors" / "day=1").mkdir(parents=True)
    (lake / "sensors" / "day=1" / "part-0-0.parquet").write_text("demo")
    (lake / "_rejected" / "sensors").mkdir(parents=True)
    record_lake(lake)
    added = lake / "sensors" / "day=2" / "mine.parquet"
    added.parent.mkdir()
    added.write_text("not the demo's")
    with pytest.raises(ConfigError, match="holds sensors/day=2/mine.parquet, which the demo"):
        claim_lake(lake)
    assert added.exists() and (lake / "sensors" / "day=1" / "part-0-0.parquet").exists()
    added.unlink()
    claim_lake(lake)  # only the demo's files: cleared for the new run
    assert not (lake / "sensors").exists() and not (lake / "_rejected" / "sensors").exists()


def test_a_demo_that_ended_early_leaves_folders_the_next_demo_may_clear(tmp_path: Path
                                                                         ) -> None:
    lake = tmp_path / "lake"
    claim_lake(lake)  # the run starts (its record says so) and is killed mid-way
    (lake / ".lakesink" / "sensors" / "checkpoint").mkdir(parents=True)
    (lake / ".lakesink" / "sensors" / "checkpoint" / "lakesink.json").write_text("{}")
    assert '"incomplete": true' in (lake / DEMO_RECORD).read_text()
    claim_lake(lake)
    assert not (lake / ".lakesink" / "sensors").exists()


def test_a_demo_that_failed_records_what_it_wrote_so_a_later_table_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A demo run that fails (its broker would not start) records the files it wrote;
    a table the user then writes into the same folders is not cleared by the next demo
    (an incomplete record would have claimed it)."""
    import contextlib

    from rich.console import Console

    from lakesink import demo

    lake = tmp_path / "lake"

    @contextlib.contextmanager
    def failing_source(*_args: object):  # noqa: ANN202
        (lake / "sensors" / "day=1").mkdir(parents=True)
        (lake / "sensors" / "day=1" / "part-0-0.parquet").write_text("demo")
        raise RuntimeError("broker did not start")
        yield {}  # pragma: no cover

    monkeypatch.setattr(demo, "_source", failing_source)
    with pytest.raises(RuntimeError, match="broker did not start"):
        demo.run_demo(events=10, lake=lake, partitions=1, console=Console(quiet=True))
    assert '"incomplete"' not in (lake / DEMO_RECORD).read_text()
    user = lake / "sensors" / "day=2" / "user.parquet"
    user.parent.mkdir()
    user.write_text("the user's")
    with pytest.raises(ConfigError, match="holds sensors/day=2/user.parquet"):
        claim_lake(lake)
    assert user.read_text() == "the user's"
