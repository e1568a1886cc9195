"""``lakesink repair`` of a Parquet table: every file the bookkeeping lists is there
with its size, and files nothing accounts for (orphans) are found and, with ``apply``,
moved out of the table — never a file of a batch being written, by the store's clock."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lakesink.maintenance.journal import Journal, committed_files
from lakesink.tables.fs import join

if TYPE_CHECKING:
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout


@dataclass
class RepairReport:
    table: str
    format: str = "parquet"
    files_checked: int = 0
    rows_checked: int = 0
    missing: list[str] = field(default_factory=list)
    wrong_size: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    #: compactions a crash left open (a lister may see rows twice until resumed)
    unfinished_compactions: list[int] = field(default_factory=list)
    #: files no manifest lists yet, younger than ``min_age_s``: not judged this time
    too_young: int = 0
    #: young files nothing accounts for (no manifest, no batch or compaction publishing
    #: them: a foreign file readers count): a problem, not moved until ``min_age_s``
    young_orphans: list[str] = field(default_factory=list)
    applied: bool = False
    moved_to: str | None = None

    @property
    def problems(self) -> int:
        return (len(self.missing) + len(self.wrong_size) + len(self.orphans)
                + len(self.young_orphans) + len(self.unfinished_compactions))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "problems": self.problems}


def repair(fs: HadoopFS, layout: TableLayout, *, apply: bool, min_age_s: float
           ) -> RepairReport:
    """Check that every file the bookkeeping lists exists with its recorded size, and
    find orphans: files in the table folder that no committed manifest (nor finished
    compaction) lists and no batch or compaction is publishing, older than
    ``min_age_s``. ``apply`` moves the orphans to ``<meta>/quarantine/<time>/`` (outside
    the table: readers stop seeing them; nothing is deleted). Missing files cannot be
    made again here: restore them.

    A live stream's files are never taken for orphans: a file younger than
    ``min_age_s`` is not judged (a batch being published, or a redo republishing the
    names its crashed attempt had), and the table is listed before the batches being
    published (``pending/``, records younger than ``min_age_s``: an older one is a
    crashed attempt whose files are orphans) and the manifests are read — a file
    listed was named in a pending record before it was published, and that record goes
    only after its manifest exists. Right before a move, the file's batch is checked
    once more."""
    report = RepairReport(layout.name)
    # ages by the store's clock when files may move (a repair host whose clock runs
    # ahead would take a live batch's files for old ones); this host's for a report
    now_ms = _store_now_ms(fs, layout) if apply else time.time() * 1000
    young_ms = min_age_s * 1000
    listed = fs.list_files(layout.table)
    report.too_young = sum(1 for f in listed if now_ms - f.mtime_ms < young_ms)
    on_disk = {f.relative: f for f in listed}
    in_flight: set[str] = set()
    pending = fs.list_files(join(layout.meta, "pending"), suffix=".json")
    pending_seen = {f.relative: f.mtime_ms for f in pending}
    #: batches being written now: any file of theirs is in flight, listed or not yet
    #: (a redo's begin() writes its record before the files it will name again)
    live: set[tuple[str, int]] = set()
    for f in pending:
        if now_ms - f.mtime_ms >= young_ms:
            continue  # a crashed attempt nobody redid (a lost checkpoint): orphans
        batch = _pending_batch(f.relative)
        if batch is not None:
            live.add(batch)
        try:
            record = fs.read_json(f.path) or {}
        except ValueError:
            record = {}
        table = layout.table.rstrip("/") + "/"
        for p in record.get("files", []):
            in_flight.add(p.split(table, 1)[1] if table in p else p)
    journal = Journal(fs, layout)
    unfinished = []
    for cid, states in journal.states().items():
        if "" in states and not states & {"done", "aborted"}:
            in_flight.add(journal.read(cid)["output"])
        if Journal.unfinished(states):
            unfinished.append(cid)
    files = committed_files(fs, layout)
    report.files_checked = len(files)
    report.rows_checked = sum(f.rows for f in files.values())
    for path, f in sorted(files.items()):
        disk = on_disk.get(path)
        if disk is None:
            report.missing.append(path)
        elif disk.size != f.bytes:
            report.wrong_size.append(path)
    report.unfinished_compactions = sorted(unfinished)
    unknown = {p: f for p, f in on_disk.items()
               if p not in files and p not in in_flight and _batch_of(p) not in live}
    report.orphans = sorted(p for p, f in unknown.items() if now_ms - f.mtime_ms >= young_ms)
    report.young_orphans = sorted(p for p, f in unknown.items()
                                  if now_ms - f.mtime_ms < young_ms)
    if apply and report.orphans:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        target = join(layout.quarantine, stamp)
        for path in report.orphans:
            if _committed_since(fs, layout, path) or _in_flight_now(
                    fs, layout, path, pending_seen, now_ms, young_ms):
                continue
            fs.replace(join(layout.table, path), join(target, path))
        report.applied, report.moved_to = True, target
    return report


def _store_now_ms(fs: HadoopFS, layout: TableLayout) -> float:
    """The store's clock: the modification time it gives a probe file written now."""
    import uuid

    folder = join(layout.meta, "clock")
    probe = join(folder, f"{uuid.uuid4().hex}.txt")
    fs.write_text(probe, "")
    try:
        stamps = [f.mtime_ms for f in fs.list_files(folder)
                  if f.relative == probe.rsplit("/", 1)[1]]
    finally:
        fs.delete(probe, recursive=False)
    return float(stamps[0]) if stamps and stamps[0] > 0 else time.time() * 1000


def _batch_of(path: str) -> tuple[str, int] | None:
    """(run, batch) of a ``part-<batch>-<run>-<n>.parquet`` name."""
    parts = path.rsplit("/", 1)[-1].split("-")
    if len(parts) != 4 or parts[0] != "part" or not parts[1].isdigit():
        return None
    return parts[2], int(parts[1])


def _pending_batch(relative: str) -> tuple[str, int] | None:
    """(run, batch) of a pending record's ``<run>/<batch>.json`` path."""
    run, _, name = relative.rpartition("/")
    stem = name.removesuffix(".json")
    return (run, int(stem)) if run and stem.isdigit() else None


def _in_flight_now(fs: HadoopFS, layout: TableLayout, path: str,
                   pending_seen: dict[str, int], now_ms: float, young_ms: float) -> bool:
    """Whether the batch ``path`` belongs to is being written now: its pending record is
    young, or it was not there or was written again since the repair listed them (a
    stream restarted after being down longer than ``min_age_s`` redoes the batch and
    publishes this name again) — the last check before a move, with
    :func:`_committed_since`."""
    batch = _batch_of(path)
    if batch is None:
        return False
    run, batch_id = batch
    now = {f.relative: f.mtime_ms
           for f in fs.list_files(join(layout.meta, "pending", run), suffix=".json")}
    stamp = now.get(f"{batch_id:010d}.json")
    return stamp is not None and (stamp != pending_seen.get(f"{run}/{batch_id:010d}.json")
                                  or now_ms - stamp < young_ms)


def _committed_since(fs: HadoopFS, layout: TableLayout, path: str) -> bool:
    """Whether the batch a ``part-<batch>-<run>-<n>.parquet`` name belongs to lists
    ``path`` by now (the last check before a move)."""
    from lakesink.tables.manifests import read_manifest

    batch = _batch_of(path)
    if batch is None:
        return False
    try:
        manifest = read_manifest(fs, layout, *batch)
    except ValueError:
        return True  # unreadable: leave the file be
    return bool(manifest) and any(e["path"] == path for e in manifest.get("files", []))
