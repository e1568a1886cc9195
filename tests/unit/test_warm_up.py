"""The Python workers' warm-up (``arrow_path.warm_workers``, ``Pipeline._join_warm_up``)
without Spark: its job is tagged, and cancelled by that tag at the end of a run, only
where a tag stays with the warm-up's own thread (PySpark's pinned-thread mode)."""

from __future__ import annotations

import threading
from types import SimpleNamespace as NS

import pytest

from lakesink import app
from lakesink.pipeline import arrow_path
from lakesink.pipeline.arrow_task import TaskSpec


class FakeSpark:
    """What warm_workers asks of a session; its job waits for ``release``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.sparkContext = NS(
            defaultParallelism=2,
            addJobTag=lambda tag: self.calls.append(("add", tag)),
            removeJobTag=lambda tag: self.calls.append(("remove", tag)),
            cancelJobsWithTag=self._cancel)

    def _cancel(self, tag: str) -> None:
        self.calls.append(("cancel", tag))
        self.release.set()

    def range(self, *_: int) -> FakeSpark:
        return self

    def mapInArrow(self, *_: object) -> FakeSpark:  # noqa: N802 - PySpark's name
        return self

    def collect(self) -> list[object]:
        self.release.wait(10)
        return []


SPEC = TaskSpec(fields=(("id", "bigint", True),))


@pytest.mark.parametrize("pinned", [True, False])
def test_the_warm_up_is_tagged_only_in_pinned_thread_mode(monkeypatch, pinned) -> None:
    monkeypatch.setattr(arrow_path, "pinned_threads", lambda: pinned)
    spark = FakeSpark()
    spark.release.set()
    assert arrow_path.warm_workers(spark, SPEC, threading.Event()) is not None  # type: ignore[arg-type]
    tag = arrow_path.WARM_UP_TAG
    assert spark.calls == ([("add", tag), ("remove", tag)] if pinned else [])


@pytest.mark.parametrize("pinned", [True, False])
def test_the_end_of_a_run_cancels_the_warm_up_only_by_its_tag(monkeypatch, pinned) -> None:
    """Pinned: cancelled by its tag, ended at once. Not pinned: nothing is cancelled
    (an untagged cancel could reach other jobs); the run waits for it, up to its bound."""
    monkeypatch.setattr(arrow_path, "pinned_threads", lambda: pinned)
    monkeypatch.setattr(app, "pinned_threads", lambda: pinned)
    monkeypatch.setattr(app, "WARM_UP_JOIN_S", 1.0)
    spark = FakeSpark()
    pipeline = NS(spark=spark, _warm_up_cancelled=threading.Event())
    pipeline.warm_up = threading.Thread(target=arrow_path.warm_workers,
                                        args=(spark, SPEC, pipeline._warm_up_cancelled))
    pipeline.warm_up.start()
    app.Pipeline._join_warm_up(pipeline)  # type: ignore[arg-type]
    tag = arrow_path.WARM_UP_TAG
    if pinned:
        assert not pipeline.warm_up.is_alive()
        assert spark.calls[0] == ("add", tag) and ("cancel", tag) in spark.calls
    else:
        assert pipeline.warm_up.is_alive()  # waited its bound, then left it
        assert spark.calls == []
    spark.release.set()
    pipeline.warm_up.join(5)
