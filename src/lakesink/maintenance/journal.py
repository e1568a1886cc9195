"""The journal of a Parquet table's compactions (``<meta>/compactions/``) and the
table's files by its bookkeeping: what compaction, vacuum and repair all read (the
protocol is in :mod:`lakesink.maintenance.parquet`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from lakesink.errors import SinkError
from lakesink.tables.fs import join
from lakesink.tables.manifests import TableFile, apply_compactions

if TYPE_CHECKING:
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout


class Journal:
    """The compactions of one table: ``<meta>/compactions/<id>[.outcome|.finished]
    .json``."""

    def __init__(self, fs: HadoopFS, layout: TableLayout) -> None:
        self.fs = fs
        self.layout = layout
        self.folder = layout.compactions

    def path(self, cid: int, state: str = "") -> str:
        return join(self.folder, f"{cid:010d}{'.' + state if state else ''}.json")

    def states(self) -> dict[int, set[str]]:
        """Every compaction id with its states: ``""`` planned, ``done`` or ``aborted``
        (its outcome), ``finished``."""
        out: dict[int, set[str]] = {}
        for f in self.fs.list_files(self.folder, suffix=".json"):
            stem, _, state = f.relative.removesuffix(".json").partition(".")
            if not stem.isdigit():
                continue
            if state == "outcome":
                value = self.fs.read_json(f.path)
                state = value.get("outcome", "") if isinstance(value, dict) else ""
            out.setdefault(int(stem), set()).add(state)
        return out

    @staticmethod
    def unfinished(states: set[str]) -> bool:
        """Whether a compaction with these states is left to finish: planned, without
        ``finished`` (which a roll-back records too, once its deletes are done: an
        ``aborted`` one cut off before is not settled)."""
        return "" in states and "finished" not in states

    def read(self, cid: int, state: str = "") -> dict[str, Any]:
        value = self.fs.read_json(self.path(cid, state))
        if not isinstance(value, dict):
            raise SinkError(f"{self.path(cid, state)} is missing or not a compaction record")
        return value

    def record(self, cid: int, state: str, value: dict[str, Any]) -> bool:
        return self.fs.write_once(self.path(cid, state), json.dumps(value, indent=1))

    def decide(self, cid: int, outcome: str, value: dict[str, Any]) -> str:
        """Record the compaction's outcome (``done`` or ``aborted``) unless one is
        recorded; returns the outcome that holds."""
        self.record(cid, "outcome", {**value, "outcome": outcome})
        return str(self.read(cid, "outcome")["outcome"])


def committed_files(fs: HadoopFS, layout: TableLayout) -> dict[str, TableFile]:
    """The table's files by its bookkeeping (see the module docstring)."""
    from lakesink.tables.manifests import manifests

    files: dict[str, TableFile] = {}
    for manifest in manifests(fs, layout):
        for e in manifest.get("files", []):
            files[e["path"]] = TableFile(e["path"], int(e["rows"]), int(e["bytes"]))
    journal = Journal(fs, layout)
    return apply_compactions(files, ((journal.read(cid), journal.read(cid, "outcome"))
                                     for cid, states in sorted(journal.states().items())
                                     if "done" in states))
