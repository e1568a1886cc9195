"""A Parquet table's committed batches: per-batch manifests, rolled up by the thousand.

Each committed batch ``b`` of run ``r`` has ``manifests/r/<b>.json`` (the commit point,
:mod:`lakesink.tables.parquet`). ``lakesink vacuum`` rolls every complete range of
:data:`ROLLUP` batches (``k × ROLLUP`` … ``(k + 1) × ROLLUP − 1``, all committed) into
``manifests/r/rollup-<k>.json`` once a later batch of that run is committed (Spark runs
batches in order, so an id missing below it is a batch that wrote nothing) — written once, then the range's per-batch manifests are
deleted — so the bookkeeping grows by one file per thousand batches, and "is batch b
committed?" stays two reads at most: ``<b>.json``, else ``rollup-<b // ROLLUP>.json``.
The rollup is written before anything is deleted, so every batch is always in one of
the two (a crash in between leaves both: the next vacuum finishes the deletes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakesink.errors import SinkError
from lakesink.tables.fs import join

if TYPE_CHECKING:
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

ROLLUP = 1000
PREFIX = "rollup-"


def rollup_path(layout: TableLayout, run: str, k: int) -> str:
    return join(layout.meta, "manifests", run, f"{PREFIX}{k:010d}.json")


def read_manifest(fs: HadoopFS, layout: TableLayout, run: str, batch_id: int
                  ) -> dict[str, Any] | None:
    """Batch ``batch_id``'s manifest, from its own file or its rollup; None if the
    batch is not committed. Raises ``ValueError`` for an unreadable per-batch file."""
    manifest = fs.read_json(layout.manifest(run, batch_id))
    if manifest is not None:
        return manifest
    rollup = fs.read_json(rollup_path(layout, run, batch_id // ROLLUP))
    return rollup["batches"].get(str(batch_id)) if isinstance(rollup, dict) else None


def committed(fs: HadoopFS, layout: TableLayout) -> Iterator[tuple[str, int, dict[str, Any] | None]]:
    """(run, batch id, manifest) of every committed batch; the manifest is None for a
    per-batch file (read it when needed: listing stays one call), a dict for a batch
    from a rollup."""
    seen: set[tuple[str, int]] = set()
    rollups = []
    for f in fs.list_files(join(layout.meta, "manifests"), suffix=".json"):
        run, _, name = f.relative.rpartition("/")
        stem = name[:-5]
        if not run:
            continue
        if stem.isdigit():
            seen.add((run, int(stem)))
            yield run, int(stem), None
        elif stem.startswith(PREFIX) and stem[len(PREFIX):].isdigit():
            rollups.append((run, f.path))
    for run, path in rollups:
        value = fs.read_json(path)
        if not isinstance(value, dict):
            raise SinkError(f"manifest rollup {path} is unreadable")
        for b, manifest in value["batches"].items():
            if (run, int(b)) not in seen:
                yield run, int(b), manifest


def manifests(fs: HadoopFS, layout: TableLayout) -> Iterator[dict[str, Any]]:
    """Every committed batch's manifest."""
    for run, batch_id, manifest in committed(fs, layout):
        if manifest is None:
            try:  # the per-batch file, or its rollup if a vacuum rolled it up since
                manifest = read_manifest(fs, layout, run, batch_id)
            except ValueError:
                manifest = None
            if not isinstance(manifest, dict):
                raise SinkError(f"manifest of batch {batch_id} (run {run}) is unreadable: "
                                "the files of its batch are unknown (restore it)")
        yield manifest


def roll_up(fs: HadoopFS, layout: TableLayout) -> int:
    """Roll every range of ``size`` batch ids below the run's newest committed batch
    into one file; returns the manifests rolled up (deleted)."""
    size = ROLLUP
    ranges: dict[tuple[str, int], list[int]] = {}
    newest: dict[str, int] = {}
    for run, batch_id, manifest in committed(fs, layout):
        newest[run] = max(newest.get(run, -1), batch_id)
        if manifest is None:
            ranges.setdefault((run, batch_id // size), []).append(batch_id)
    rolled = 0
    for (run, k), ids in sorted(ranges.items()):
        path = rollup_path(layout, run, k)
        existing = fs.read_json(path)
        if existing is None:
            if (k + 1) * size - 1 >= newest[run]:
                continue  # the range of the newest batch: it may still grow
            try:
                batches = {str(b): fs.read_json(layout.manifest(run, b)) for b in sorted(ids)}
            except ValueError:
                batches = {"": None}
            if any(not isinstance(m, dict) for m in batches.values()):
                raise SinkError(f"a manifest of run {run} batches {k * size}… is unreadable; "
                                "not rolled up (lakesink repair)")
            if not fs.write_once(path, json.dumps({"run": run, "first": k * size,
                                                   "batches": batches})):
                existing = fs.read_json(path)
        if existing is not None and not set(map(str, ids)) <= set(existing["batches"]):
            raise SinkError(f"{path} lacks batches whose manifests exist; not deleting them")
        for b in ids:  # the rollup holds them all: the per-batch files may go
            fs.delete(layout.manifest(run, b), recursive=False)
        rolled += len(ids)
    return rolled


@dataclass(frozen=True)
class TableFile:
    path: str  #: below the table folder, e.g. ``c1=v1/part-….parquet``
    rows: int
    bytes: int


def compacted_into(fs: HadoopFS, layout: TableLayout) -> dict[str, TableFile]:
    """Each file a committed compaction replaced -> the file that holds its rows now
    (followed through later compactions). One listing of the compaction journal;
    empty for a table never compacted."""
    out: dict[str, TableFile] = {}
    states: dict[int, set[str]] = {}
    for f in fs.list_files(layout.compactions, suffix=".json"):
        stem, _, state = f.relative.removesuffix(".json").partition(".")
        if stem.isdigit():
            states.setdefault(int(stem), set()).add(state)
    for cid in sorted(states):
        if "outcome" not in states[cid]:
            continue
        done = fs.read_json(join(layout.compactions, f"{cid:010d}.outcome.json")) or {}
        if done.get("outcome") != "done":
            continue
        plan = fs.read_json(join(layout.compactions, f"{cid:010d}.json")) or {}
        (output,) = done["outputs"]
        merged = TableFile(output["path"], int(output["rows"]), int(output["bytes"]))
        for e in plan.get("inputs", []):
            out[e["path"]] = merged
        for path, into in list(out.items()):  # an earlier output merged again
            if into.path in out and out[into.path] is not into:
                out[path] = out[into.path]
    return out


def apply_compactions(files: dict[str, TableFile],
                      compactions: Iterable[tuple[dict[str, Any], dict[str, Any]]]
                      ) -> dict[str, TableFile]:
    """``files`` (from the manifests) with each committed compaction's (plan, done
    record), in id order, applied: its inputs replaced by its outputs."""
    for plan, done in compactions:
        for e in plan["inputs"]:
            files.pop(e["path"], None)
        for e in done["outputs"]:
            files[e["path"]] = TableFile(e["path"], int(e["rows"]), int(e["bytes"]))
    return files
