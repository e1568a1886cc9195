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
