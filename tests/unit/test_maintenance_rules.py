"""Compaction's pure rules, without Spark: grouping and the bookkeeping's file set."""

from __future__ import annotations

from lakesink.maintenance.parquet import _pack
from lakesink.tables.manifests import TableFile, apply_compactions


def f(name: str, size: int, rows: int = 10) -> TableFile:
    return TableFile(name, rows, size)


def test_groups_are_consecutive_and_at_most_about_the_target() -> None:
    files = [f(f"a/{i}", 40) for i in range(5)]
    assert [[x.path for x in g] for g in _pack(files, 100)] == [
        ["a/0", "a/1"], ["a/2", "a/3"], ["a/4"]]
    assert _pack([f("a/big", 500), f("a/x", 10)], 100) == [[f("a/big", 500)], [f("a/x", 10)]]
    assert _pack([], 100) == []


def test_committed_compactions_replace_their_inputs_in_order() -> None:
    files = {p: f(p, 10) for p in ("d/1", "d/2", "d/3")}
    first = ({"inputs": [{"path": "d/1"}, {"path": "d/2"}]},
             {"outputs": [{"path": "d/c0", "rows": 20, "bytes": 15}]})
    second = ({"inputs": [{"path": "d/c0"}, {"path": "d/3"}]},
              {"outputs": [{"path": "d/c1", "rows": 30, "bytes": 22}]})
    out = apply_compactions(dict(files), [first, second])
    assert out == {"d/c1": TableFile("d/c1", 30, 22)}
    assert sum(x.rows for x in out.values()) == sum(x.rows for x in files.values())


class _Compactor:
    """A stand-in compactor: ``crashed`` says what its journal says; each resume
    finishes compaction 7 or raises ``error``."""

    table = "file:/lake/events"

    def __init__(self, crashed: bool, error: Exception | None = None) -> None:
        self.is_crashed, self.error, self.resumes = crashed, error, 0

    def crashed(self) -> bool:
        return self.is_crashed

    def resume_unfinished(self) -> tuple[list[int], list[int]]:
        self.resumes += 1
        if self.error is not None:
            raise self.error
        self.is_crashed = False
        return [7], []


def test_the_runs_compaction_watch_resumes_at_most_once_per_interval(caplog) -> None:
    from lakesink.maintenance.watch import CompactionWatch

    compactor = _Compactor(crashed=True)
    watch = CompactionWatch(compactor, every_s=3600)
    with caplog.at_level("WARNING", logger="lakesink.maintenance.watch"):
        watch.poke()
        watch.wait(10)
        compactor.is_crashed = True
        watch.poke()  # within the interval: no second look
        watch.close()
    assert compactor.resumes == 1
    assert "finished [7], undone none" in caplog.text
    idle = _Compactor(crashed=False)
    CompactionWatch(idle, every_s=0).poke()
    assert idle.resumes == 0


def test_the_compaction_watch_leaves_a_running_compaction_and_survives_errors(caplog) -> None:
    from lakesink.errors import SecondWriterError
    from lakesink.maintenance.watch import CompactionWatch

    for error, said in ((SecondWriterError("held by pid 12"), "a compaction is running"),
                        (OSError("store down"), "could not resume")):
        compactor = _Compactor(crashed=True, error=error)
        watch = CompactionWatch(compactor, every_s=0)
        with caplog.at_level("INFO", logger="lakesink.maintenance.watch"):
            watch.poke()
            watch.wait(10)
            watch.poke()  # every_s 0: looks again
            watch.close()
        assert compactor.resumes == 2 and "finished [" not in caplog.text
        assert said in caplog.text
