"""The batch function's steps without Spark: an in-memory table writer and dead-letter
outbox, and engines that hand back typed values. What a batch does with an engine's
outcome — skip a committed batch and publish only what its outbox holds, take the Spark
engine when the Arrow engine falls back (said once), publish dead letters after the
commit, register, count — is checked here; the engines themselves run against Spark in
the integration layer (``test_arrow_path``, ``test_formats``, the crash matrix)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from pyspark.sql import types as T

from lakesink.decode.evolution import EvolutionPolicy
from lakesink.pipeline.batch import BatchFunction
from lakesink.pipeline.marks import BatchCounts
from lakesink.pipeline.write import Fallback, WriteOutcome
from lakesink.tables.base import BatchResult

SCHEMA = T.StructType([T.StructField("id", T.LongType())])


@dataclass
class Layout:
    name: str = "events"
    table: str = "memory://events"


@dataclass
class MemoryWriter:
    """The table writer's contract in a dict: batch id -> rows committed."""

    committed: dict[int, int] = field(default_factory=dict)
    tidied: list[int] = field(default_factory=list)
    layout: Layout = field(default_factory=Layout)
    spark: Any = None
    format: str = "memory"
    stages_before_commit: bool = True
    closed: bool = False

    def is_committed(self, batch_id: int) -> bool:
        return batch_id in self.committed

    def prove(self) -> None:  # one writer here: its lease is never taken
        pass

    def tidy(self, batch_id: int) -> None:
        self.tidied.append(batch_id)

    def close(self) -> None:
        self.closed = True


@dataclass
class MemoryOutbox:
    """Dead letters staged per batch id before the commit, published after it."""

    staged: dict[int, int] = field(default_factory=dict)
    published: dict[int, int] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)

    def discard(self, batch_id: int) -> None:
        self.events.append(f"discard {batch_id}")
        self.staged.pop(batch_id, None)

    def publish(self, batch_id: int) -> int:
        n = self.staged.pop(batch_id, 0)
        if n:
            self.published[batch_id] = n
        self.events.append(f"publish {batch_id}")
        return n

    def reasons(self, batch_id: int) -> dict[str, int]:
        return {"malformed_json": self.staged.get(batch_id, 0)}

    def path(self, batch_id: int) -> str:
        return f"memory://_rejected/events/{batch_id}"

    def close(self) -> None:
        self.events.append("close")


class Registrar:
    def __init__(self) -> None:
        self.batches: list[int] = []
        self.pending: list[int] = []
        self.registered = 0

    def committed(self, batch_id: int) -> None:
        self.batches.append(batch_id)
        self.registered += 1

    def close(self) -> None:
        pass


class Engine:
    """Writes a batch of ``records`` rows, ``rejected`` of them dead letters staged in
    the outbox before it commits (as every engine does); or returns ``fallback``."""

    def __init__(self, writer: MemoryWriter, outbox: MemoryOutbox, *, records: int = 10,
                 rejected: int = 0, fallback: Fallback | None = None) -> None:
        self.writer, self.outbox = writer, outbox
        self.records, self.rejected, self.fallback = records, rejected, fallback
        self.calls: list[int] = []

    def write(self, _df: Any, batch_id: int) -> WriteOutcome | Fallback:  # noqa: ANN401
        self.calls.append(batch_id)
        if self.fallback is not None:
            return self.fallback
        if self.rejected:
            self.outbox.staged[batch_id] = self.rejected
            self.outbox.events.append(f"stage {batch_id}")
        written = self.records - self.rejected
        self.writer.committed[batch_id] = written
        self.outbox.events.append(f"commit {batch_id}")
        return WriteOutcome(BatchResult(batch_id, files=2, bytes=100),
                            BatchCounts(records=self.records, rejected=self.rejected),
                            {"written": written})


def batch_function(registrar: Registrar | None = None
                   ) -> tuple[BatchFunction, MemoryWriter, MemoryOutbox]:
    writer, outbox = MemoryWriter(), MemoryOutbox()
    fn = BatchFunction(
        schema=SCHEMA, policy=EvolutionPolicy(mode="strict"),
        rebuild=lambda schema: (None, None, schema),  # type: ignore[arg-type,return-value]
        store_schema=lambda *_: None, writer=writer,  # type: ignore[arg-type]
        rejected=outbox, app_id="a" * 32, registrar=registrar)  # type: ignore[arg-type]
    return fn, writer, outbox


def test_dead_letters_are_published_after_the_commit_then_the_batch_registered() -> None:
    registrar = Registrar()
    fn, writer, outbox = batch_function(registrar)
    fn.spark_engine = Engine(writer, outbox, records=10, rejected=3)  # type: ignore[assignment]
    fn(None, 0)
    assert outbox.events == ["discard 0", "stage 0", "commit 0", "publish 0"]
    assert writer.committed == {0: 7} and outbox.published == {0: 3}
    assert registrar.batches == [0]
    s = fn.stats
    assert (s.batches, s.records, s.written, s.rejected, s.files, s.bytes) == (1, 10, 7, 3, 2,
                                                                              100)


def test_a_committed_batch_is_replayed_not_written_and_only_its_outbox_published() -> None:
    """A crash between the commit and the dead letters' publishing: the replay publishes
    what the outbox holds and computes nothing again."""
    registrar = Registrar()
    fn, writer, outbox = batch_function(registrar)
    writer.committed[4] = 7
    outbox.staged[4] = 3  # staged before the commit that the crash followed
    engine = Engine(writer, outbox)
    fn.spark_engine = engine  # type: ignore[assignment]
    fn(None, 4)
    assert engine.calls == [] and writer.tidied == [4]
    assert outbox.published == {4: 3} and "discard 4" not in outbox.events
    assert registrar.batches == [4]  # registration is keyed by the batch: idempotent
    assert (fn.stats.batches, fn.stats.skipped, fn.stats.written) == (1, 1, 0)


def test_an_arrow_fallback_goes_to_the_spark_engine_and_is_said_once(caplog) -> None:  # noqa: ANN001
    fn, writer, outbox = batch_function()
    fn.arrow = object()  # type: ignore[assignment] - the Arrow engine is in use
    said = Fallback("batch %d: too many records the Arrow path does not certify",
                    (5,), logging.WARNING)
    arrow = Engine(writer, outbox, fallback=said)
    spark = Engine(writer, outbox, records=4)
    fn.arrow_engine, fn.spark_engine = arrow, spark  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger="lakesink"):
        fn(None, 5)
        arrow.fallback = Fallback("")  # already said (the engine choice logged it)
        fn(None, 6)
    assert arrow.calls == [5, 6] and spark.calls == [5, 6]
    assert writer.committed == {5: 4, 6: 4}
    warned = [r for r in caplog.records if "does not certify" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in warned] == [
        (logging.WARNING, "batch 5: too many records the Arrow path does not certify")]


def test_a_failing_engine_commits_nothing_and_the_retry_stages_afresh() -> None:
    fn, writer, outbox = batch_function()

    class Fails(Engine):
        def write(self, df: Any, batch_id: int) -> WriteOutcome | Fallback:  # noqa: ANN401
            self.outbox.staged[batch_id] = 1  # staged, then the commit failed
            raise OSError("S3 throttled")

    fn.spark_engine = Fails(writer, outbox)  # type: ignore[assignment]
    with pytest.raises(OSError):
        fn(None, 1)
    assert writer.committed == {} and outbox.published == {}
    fn.spark_engine = Engine(writer, outbox, records=5)  # type: ignore[assignment]
    fn(None, 1)  # the retry: the earlier attempt's outbox discarded first
    # the retry discards what the failed attempt staged before it writes again
    assert outbox.events == ["discard 1", "discard 1", "commit 1"]
    assert outbox.staged == {} and outbox.published == {} and writer.committed == {1: 5}


def test_counts_are_typed_and_written_is_records_less_rejected() -> None:
    counts = BatchCounts.of({"records": 12, "rejected": None, "unknown": 2, "other": 9})
    assert counts == BatchCounts(records=12, rejected=0, unknown=2)
    assert counts.written == 12
